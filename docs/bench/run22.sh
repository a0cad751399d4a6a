#!/usr/bin/env bash
# Device call of run 22 (H200): build, the batched GPU tests, the multi-stream bench on full-size random weights.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_REQUIRE=1 Q3T_CACHE_DIR=/tmp/q3t-cache
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
t=$SECONDS
python3 -m wyoming_qwen3tts.native --werror --force > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $((SECONDS - t)) s"
python3 -m pytest -q -x -p no:cacheprovider tests/test_batched_kernels_gpu.py -k "decoder or frames" > $OUT/gpu-tests.log 2>&1
tail -3 $OUT/gpu-tests.log
for size in 1.7b 0.6b; do
  [ -d /tmp/ck/$size ] || python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $size --out /tmp/ck/$size --device cuda > /dev/null
  timeout 200 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/$size --frames 200 --runs 2 --out $OUT/streams-$size.json 2>&1 | grep -v "^ \|^{\|^}" | tail -12
done
echo "total $((SECONDS - t)) s"
