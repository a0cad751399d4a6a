#!/usr/bin/env bash
# Builds the q3t kernel library into the cache and prints its path.
#   kernels/build.sh                       # toolchain and archs from torch and the visible GPUs
#   kernels/build.sh --toolchain hipcc --arch gfx1201,gfx1100,gfx942
#   kernels/build.sh --toolchain nvcc --arch sm_90,sm_89 --werror
# Q3T_CACHE_DIR overrides the cache directory (default ~/.cache/wyoming-qwen3tts/kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" -m wyoming_qwen3tts.backends.kernels.build "$@"
