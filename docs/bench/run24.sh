#!/usr/bin/env bash
# Run 24 (H200): the tensor-core batched GEMV. Build; its GPU tests and the SASS check; per-shape GEMV
# timings (tensor cores vs FMA); the multi-stream bench on full-size random weights; the real server
# under load at max_streams 1 (issue 18: HTTP vs Wyoming first audio) and at 16.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_REQUIRE=1 Q3T_CACHE_DIR=/tmp/q3t-cache
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
t=$SECONDS
python3 -m wyoming_qwen3tts.native --werror --force > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $((SECONDS - t)) s"
(for size in 1.7b 0.6b; do
  python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $size --out /tmp/ck/$size --device cuda > /dev/null 2>&1
done) &
timeout 240 python3 -m pytest -q -s --maxfail=5 -p no:cacheprovider tests/test_batched_kernels_gpu.py \
  "tests/test_native_build.py::test_gemv_sass_loads_weights_before_the_grid_wait" > $OUT/gpu-tests.log 2>&1
tail -4 $OUT/gpu-tests.log; grep -E "^(FAILED|ERROR)" $OUT/gpu-tests.log | head -8
python3 -c "
import re
for kind in ('fma', 'tc'):
    errs = [float(m.group(1)) for m in re.finditer(r' ' + kind + r' mode .*?float64 ([0-9.e+-]+)', open('$OUT/gpu-tests.log').read())]
    print(kind, 'GEMV cases', len(errs), 'max rel err vs float64', max(errs) if errs else None)"
echo "tests done $((SECONDS - t)) s"
timeout 150 python3 kernels/device/bench_batched.py gemv > $OUT/bench_batched.log 2>&1
grep -A 30 "### GEMV" $OUT/bench_batched.log | cut -c1-400
echo "gemv bench done $((SECONDS - t)) s"
wait
for size in 1.7b 0.6b; do
  timeout 150 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/$size --frames 200 --runs 2 \
    --out $OUT/streams-$size.json > $OUT/streams-$size.log 2>&1
  grep -v "^ \|^{\|^}" $OUT/streams-$size.log | tail -10
done
echo "streams done $((SECONDS - t)) s"
load() {  # name, then bench.load arguments
  local name=$1; shift
  timeout 60 python3 -m wyoming_qwen3tts.bench.load --wyoming tcp://127.0.0.1:10200 --http http://127.0.0.1:8000 \
    --json "$@" > $OUT/$name.json 2>/dev/null
  python3 -c "
import json; r=json.load(open('$OUT/$name.json')); o=r['overall']; d=r.get('http_minus_wyoming_ttfa_ms')
print('$name', r['sent'], r['served'], r['failed'], 'ttfa p50/p95', o['ttfa_p50_ms'], o['ttfa_p95_ms'], 'done p95', o['completion_p95_ms'], 'fps', o['frames_per_s'], d)" 2>&1 | tail -1
}
for streams in 1 16; do
  python3 -m wyoming_qwen3tts --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --http tcp://127.0.0.1:8000 \
    --max-streams $streams --max-connections 128 --max-frames 150 > $OUT/server-$streams.log 2>&1 &
  srv=$!
  for i in $(seq 120); do python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz').status != 200)" 2>/dev/null && break; sleep 1; done
  echo "max_streams $streams: ready after $i s"
  if [ $streams = 1 ]; then
    load ms1-wyoming-alone --clients 1 --protocol wyoming --rounds 6
    load ms1-http-alone --clients 1 --protocol http --rounds 6
    load ms1-both-16 --clients 16 --protocol both
  else
    load ms16-alone --clients 1 --protocol wyoming --rounds 4
    load ms16-wyoming-4 --clients 4 --protocol wyoming --rounds 2
    load ms16-wyoming-16 --clients 16 --protocol wyoming
    load ms16-both-16 --clients 16 --protocol both
  fi
  kill $srv; wait $srv 2>/dev/null
  grep -E "Traceback|Error" $OUT/server-$streams.log | head -3
done
echo "total $((SECONDS - t)) s"
