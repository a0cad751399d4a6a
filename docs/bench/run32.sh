#!/usr/bin/env bash
# Run 32 (H200, twelfth session): the codec calls and the batched prefill of many arrivals replayed as captured graphs;
# first their GPU tests, then run 29's server load with the first-chunk timeline, then the batching engine GPU tests.
# Run 33 is the same script after the synthesis threads are started before serving: `bash docs/bench/run32.sh run33`;
# run 34 after gc.freeze() at load, with the server's debug lines (a sentence's wait for its thread, long collections).
NAME=${1:-run32}  # the archive that comes back: $OUT/NAME.tgz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
python3 -m wyoming_qwen3tts.tools.random_checkpoint --size 1.7b --out /tmp/ck/1.7b --device cuda > /dev/null 2>&1
echo "checkpoint $((SECONDS - t)) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_codec_slots_gpu.py tests/test_batched_admission_gpu.py -rs -s > $R/graphs-gpu-tests.log 2>&1
grep -E "passed|failed|Error|assert" $R/graphs-gpu-tests.log | tail -6
echo "graph tests $((SECONDS - t)) s"
# The engine's logger at debug level (the first-chunk timeline), the rest as the server sets it.
python3 -c "import logging, runpy, sys
logging.getLogger('wyoming_qwen3tts.engine').setLevel(logging.DEBUG)
logging.getLogger('wyoming_qwen3tts.server').setLevel(logging.DEBUG)
sys.argv = ['wyoming_qwen3tts', *sys.argv[1:]]
runpy.run_module('wyoming_qwen3tts', run_name='__main__')" --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 \
  --max-streams 16 --max-connections 128 --max-frames 150 > $R/server.log 2>&1 &
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
grep -E "Traceback|Error|Warm-up|prefill graphs|Codec warmed|synthesis threads|Garbage" $R/server.log | tail -6 | cut -c1-220
grep "First chunk" $R/server.log | sed 's/.*First chunk/First chunk/' > $R/first-chunks.log
head -4 $R/first-chunks.log; echo ...; sed -n '5,16p' $R/first-chunks.log | tail -3; echo ...; tail -4 $R/first-chunks.log
grep -E "took the sentence|Garbage" $R/server.log | sed "s/.*took the sentence/took/" | awk '{print $2}' | tr "\n" " " | cut -c1-600; echo
echo "server done $((SECONDS - t)) s"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_batching_engine_gpu.py tests/test_prefill_gpu.py -rs > $R/engine-gpu-tests.log 2>&1
tail -3 $R/engine-gpu-tests.log
tar czf $OUT/$NAME.tgz -C $OUT r && rm -rf $R
echo "total $((SECONDS - t)) s"
