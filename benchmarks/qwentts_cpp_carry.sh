#!/usr/bin/env bash
# Writes .carry-qcpp/ (git-ignored), the folder the device session's qcpp step needs in `carry`: the PyPI wheel
# realtimetts-qwen-native 0.2.0 (qwentts.cpp b91bca4 built for CUDA 12.8) reduced to the H200's sm_90 device code,
# the CUDA 12 runtime library, the gguf package and qwentts.cpp's converter (benchmarks/qwentts_cpp_prepare.py
# says why each). Run it on a machine with PyPI access, from the repository root:
#
#   benchmarks/qwentts_cpp_carry.sh QWENTTS_GIT_DIR [COMMIT]
#
# QWENTTS_GIT_DIR is a git directory of ServeurpersoCom/qwentts.cpp (the search tool's `fetch` gives one); convert.py
# is read from COMMIT (default a8a7716, the newest upstream commit; convert.py last changed in 05ecde2 and is the
# same in every commit since). The wheel pins KoljaB/qwentts.cpp b91bca4, whose tree is not to be had; its patch
# on upstream is in the C ABI (onset token ban), not in the converter. Downloads go to .carry-qcpp-src/ and are
# reused. The result is about 30 MB; nothing is fetched on the GPU box.
set -euo pipefail
cd "$(dirname "$0")/.."
GIT_DIR_QCPP=${1:?usage: benchmarks/qwentts_cpp_carry.sh QWENTTS_GIT_DIR [COMMIT]}
COMMIT=${2:-a8a7716}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
SRC=.carry-qcpp-src
mkdir -p "$SRC"
. kernels/device/wheels.sh  # device_wheels DIR SPEC...
device_wheels "$SRC" "realtimetts-qwen-native==0.2.0" "nvidia-cuda-runtime-cu12==12.9.79" "gguf==0.19.0"
git --git-dir="$GIT_DIR_QCPP" show "$COMMIT:convert.py" > "$SRC/convert.py"
"$PY" -m benchmarks.qwentts_cpp_prepare carry \
  --wheel "$SRC"/realtimetts_qwen_native-0.2.0-*.whl \
  --cudart-wheel "$SRC"/nvidia_cuda_runtime_cu12-12.9.79-*.whl \
  --gguf-wheel "$SRC"/gguf-0.19.0-*.whl \
  --convert "$SRC/convert.py" --keep-arch 90 --out .carry-qcpp
du -sh .carry-qcpp
