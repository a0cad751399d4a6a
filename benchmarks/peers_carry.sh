#!/usr/bin/env bash
# Writes .carry-peers/ (git-ignored), the folder the device session's peers step needs in `carry`: the wheels of the
# batched peers that benchmarks.peers_batch times beside us, in three folders, each installed into its own --target
# on the GPU box (which has torch, triton, numpy, scipy, numba, einops and onnxruntime, and no internet):
#   common/  qwen-tts 0.1.1 with transformers 4.57.3 and the versions it imports under (accelerate 1.12.0,
#            tokenizers 0.22.2, huggingface_hub 0.36.2), faster-qwen3-tts 0.2.4 (both peers build on it; their code
#            calls transformers 4.57's cache and mask APIs), and what `import qwen_tts` pulls in (librosa, soundfile,
#            sox, soxr and their small dependencies; sox 1.5.0 is an sdist, built here into a wheel)
#   triton/  qwen3-tts-triton 0.3.0
#   fqb/     faster-qwen3-tts-batch 0.2.0
# Run it on a machine with PyPI access, from the repository root: benchmarks/peers_carry.sh (about 20 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
OUT=.carry-peers
rm -rf "$OUT"
mkdir -p "$OUT/common" "$OUT/triton" "$OUT/fqb"
. kernels/device/wheels.sh  # device_wheels DIR SPEC...
device_wheels "$OUT/common" qwen-tts==0.1.1 transformers==4.57.3 accelerate==1.12.0 tokenizers==0.22.2 huggingface_hub==0.36.2 \
  faster-qwen3-tts==0.2.4 librosa==0.11.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 audioread==3.1.0 \
  soxr==1.1.0 pooch==1.9.0 platformdirs==4.14.8 decorator==5.3.1
"$PY" -m pip wheel -q --no-deps sox==1.5.0 -w "$OUT/common"
device_wheels "$OUT/triton" qwen3-tts-triton==0.3.0
device_wheels "$OUT/fqb" faster-qwen3-tts-batch==0.2.0
du -sh "$OUT"
