#!/usr/bin/env bash
# Run 38 (H200, thirteenth session): the GPU suites after max_streams became 0 (auto) by default, the one-stream
# tests now asking for max_streams 1 (engine, prefill, clone, codec slots, int8 engine, the kernels but the full-size).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
python3 -m wyoming_qwen3tts.native > /dev/null 2>&1 || exit 1
timeout 280 python3 -m pytest -q -p no:cacheprovider -rs tests/test_engine_gpu.py tests/test_prefill_gpu.py \
  tests/test_clone_gpu.py tests/test_codec_slots_gpu.py tests/test_kernels_gpu.py tests/test_int8_kernels_gpu.py \
  -k "not full" > $OUT/run38-gpu-tests.log 2>&1
echo "rc=$?"; grep -E "^FAILED|passed|failed" $OUT/run38-gpu-tests.log | tail -5
