#!/usr/bin/env bash
# Run 26 (H200; run 25 ran the same steps before this tree's kernel changes, without the attention tests): the staging by cvt.rn.bf16x2, the attention merge reading its chunks at once (since removed), 4 splits
# at 16 slots, a high-priority codec stream under batching. Build, GPU tests, kernel bench
# (GEMV + ops), multi-stream bench, a profile of a step, the server at max_streams 16.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_REQUIRE=1 Q3T_CACHE_DIR=/tmp/q3t-cache
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native --werror --force > $R/build.log 2>&1 || { tail -30 $R/build.log; exit 1; }
echo "build $((SECONDS - t)) s"
(for size in 1.7b 0.6b; do
  python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $size --out /tmp/ck/$size --device cuda > /dev/null 2>&1
done) &
timeout 300 python3 -m pytest -q -s --maxfail=5 -p no:cacheprovider tests/test_batched_kernels_gpu.py \
  "tests/test_native_build.py::test_gemv_sass_loads_weights_before_the_grid_wait" tests/test_batching_engine_gpu.py \
  > $R/gpu-tests.log 2>&1
timeout 120 python3 -m pytest -q --maxfail=3 -p no:cacheprovider tests/test_kernels_gpu.py tests/test_kernel_frame.py \
  -k "attention or frame" > $R/gpu-tests-attention.log 2>&1
tail -1 $R/gpu-tests-attention.log; grep -E "^(FAILED|ERROR)" $R/gpu-tests-attention.log | head -4
tail -2 $R/gpu-tests.log; grep -E "^(FAILED|ERROR)" $R/gpu-tests.log | head -8
python3 -c "
import re
for kind in ('fma', 'tc'):
    errs = [float(m.group(1)) for m in re.finditer(r' ' + kind + r' mode .*?float64 ([0-9.e+-]+)', open('$R/gpu-tests.log').read())]
    print(kind, 'GEMV cases', len(errs), 'max rel err vs float64', max(errs) if errs else None)"
echo "tests done $((SECONDS - t)) s"
timeout 200 python3 kernels/device/bench_batched.py gemv ops > $R/bench_batched.log 2>&1
grep -A 40 "### Other" $R/bench_batched.log | cut -c1-300
echo "kernel bench done $((SECONDS - t)) s"
wait
for size in 1.7b 0.6b; do
  timeout 150 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/$size --frames 200 --runs 2 \
    --out $R/streams-$size.json > $R/streams-$size.log 2>&1
  grep -E "streams:|batch-1" $R/streams-$size.log
done
echo "streams done $((SECONDS - t)) s"
timeout 60 python3 docs/bench/profile_batched.py /tmp/ck/1.7b 1 16 > $R/profile.log 2>&1; grep -A 12 "^nb=" $R/profile.log | cut -c1-150
load() {  # name, then bench.load arguments
  local name=$1; shift
  timeout 50 python3 -m wyoming_qwen3tts.bench.load --wyoming tcp://127.0.0.1:10200 --http http://127.0.0.1:8000 \
    --json "$@" > $R/$name.json 2>/dev/null
  python3 -c "
import json; r=json.load(open('$R/$name.json')); o=r['overall']; d=r.get('http_minus_wyoming_ttfa_ms')
print('$name', r['sent'], r['served'], r['failed'], 'ttfa p50/p95', o['ttfa_p50_ms'], o['ttfa_p95_ms'], 'done p95', o['completion_p95_ms'], 'fps', o['frames_per_s'], d)" 2>&1 | tail -1
}
python3 -m wyoming_qwen3tts --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --http tcp://127.0.0.1:8000 \
  --max-streams 16 --max-connections 128 --max-frames 150 > $R/server-16.log 2>&1 &
srv=$!
for i in $(seq 120); do python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz').status != 200)" 2>/dev/null && break; sleep 1; done
echo "max_streams 16: ready after $i s"
load ms16-alone --clients 1 --protocol wyoming --rounds 4
load ms16-wyoming-4 --clients 4 --protocol wyoming --rounds 2
load ms16-wyoming-16 --clients 16 --protocol wyoming
kill $srv; wait $srv 2>/dev/null
grep -E "Traceback|Error" $R/server-16.log | head -3
tar czf $OUT/run26.tgz -C $OUT r
echo "total $((SECONDS - t)) s"
