#!/usr/bin/env bash
# Run 28 (H200, eleventh session): what run 27 left unmeasured. The real server at max_streams 16 (1.7B, full-size
# random weights) after the scheduler got its own CUDA stream and the warm-up speaks max_streams requests at once:
# Wyoming load alone / 4 at once / 16 at once / 16 Poisson arrivals; then the batching GPU tests (engine, codec
# slots, admission, batched kernels) and compute-sanitizer memcheck + racecheck on a whole batched decode.
# The kernel library is built beforehand and carried in .libcache; .whl-lite is .whl without av (no HTTP).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
echo "library ready $((SECONDS - t)) s"; ls .libcache
python3 -m wyoming_qwen3tts.tools.random_checkpoint --size 1.7b --out /tmp/ck/1.7b --device cuda > /dev/null 2>&1
echo "checkpoint $((SECONDS - t)) s"
python3 -m wyoming_qwen3tts --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --max-streams 16 --max-connections 128 \
  --max-frames 150 > $R/server.log 2>&1 &
srv=$!
for i in $(seq 120); do grep -q "Ready" $R/server.log && break; sleep 1; done
echo "ready after $i s"
load() {  # name, then bench.load arguments
  local name=$1; shift
  timeout 45 python3 -m wyoming_qwen3tts.bench.load --wyoming tcp://127.0.0.1:10200 --json "$@" > $R/$name.json 2>/dev/null
  python3 -c "
import json; r=json.load(open('$R/$name.json')); o=r['overall']
print('$name', r['sent'], r['served'], r['failed'], 'ttfa p50/p95', o['ttfa_p50_ms'], o['ttfa_p95_ms'], 'done p50/p95', o['completion_p50_ms'], o['completion_p95_ms'], 'fps', o['frames_per_s'])" 2>&1 | tail -1
}
load alone --clients 1 --rounds 4
load wyoming-4 --clients 4 --rounds 3
load wyoming-16 --clients 16 --rounds 2
load poisson-16 --clients 16 --arrivals poisson --rate 8
kill $srv; wait $srv 2>/dev/null
grep -E "Traceback|Error|warm|Warm|max_streams" $R/server.log | tail -8 | cut -c1-220
echo "server done $((SECONDS - t)) s"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_batching_engine_gpu.py tests/test_codec_slots_gpu.py \
  tests/test_batched_admission_gpu.py tests/test_batched_kernels_gpu.py -rs > $R/batching-gpu-tests.log 2>&1
tail -3 $R/batching-gpu-tests.log
echo "tests done $((SECONDS - t)) s"
for tool in memcheck racecheck; do
  args="tiny bfloat16 float32"; [ $tool = racecheck ] && args="tiny-0.6b bfloat16"
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 kernels/device/sanitize_batched.py $args \
    > $R/san_batched_decode_$tool.log 2>&1
  echo "compute-sanitizer $tool (batched decode) rc=$?"; tail -3 $R/san_batched_decode_$tool.log
done
tar czf $OUT/run28.tgz -C $OUT r
echo "total $((SECONDS - t)) s"
