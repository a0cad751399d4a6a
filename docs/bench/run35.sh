#!/usr/bin/env bash
# Run 35 (H200, thirteenth session): lone steps (a stream alone in the batching backend runs the batch-1 frame's
# kernels on its slot, backends/kernels/lone.py) and the batched step's graphs captured with PDL (they were captured
# with the library's PDL flag off: nothing had set it yet where the server builds the decoder).
# STEPS=tests: the GPU suites of the decoder, the scheduler and the batched admission.
# STEPS=streams: bench.streams 1,2,4,8,16 for the 1.7B and the 0.6B (PDL on, lone steps), then the 1.7B at 1,4,16 with
#   Q3T_PDL=0 (the A/B of PDL in the batched step, same call).
# STEPS=server: the server with the default max_streams (0: sized by memory, the log says how many), the loads of run 34.
# Carry .whl-lite and .libcache. Everything comes back in $OUT/NAME.tgz.
STEPS=${STEPS:-tests,streams}
NAME=${NAME:-run35-${STEPS//,/-}}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
py() { local name=$1 limit=$2; shift 2; timeout $limit python3 -m pytest -q -p no:cacheprovider -rs "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(tail -1 $R/$name.log) [$((SECONDS - t)) s]"; }
if has tests; then
  py decoder 200 tests/test_batched_kernels_gpu.py -k "decoder"
  py engine 200 tests/test_batching_engine_gpu.py tests/test_batched_admission_gpu.py
  grep -h -E "^FAILED|Error|assert" $R/decoder.log $R/engine.log | head -8 | cut -c1-300
fi
ck() { [ -d /tmp/ck/$1 ] || python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $1 --out /tmp/ck/$1 --device cuda > /dev/null 2>&1; }
streams() {  # name, size, then bench.streams arguments
  local name=$1 size=$2; shift 2; ck $size
  timeout 150 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/$size --frames 200 --runs 2 --out $R/$name.json "$@" \
    > $R/$name.log 2>&1
  echo "$name rc=$? [$((SECONDS - t)) s]"; grep -E "streams:|backend|batched step" $R/$name.log | cut -c1-150
}
if has streams; then
  streams streams-1.7b 1.7b
  streams streams-0.6b 0.6b
  Q3T_PDL=0 streams streams-1.7b-pdl0 1.7b --streams 1,4,16
fi
if has server; then
  ck 1.7b
  python3 -c "import logging, runpy, sys
logging.getLogger('wyoming_qwen3tts.engine').setLevel(logging.DEBUG)
sys.argv = ['wyoming_qwen3tts', *sys.argv[1:]]
runpy.run_module('wyoming_qwen3tts', run_name='__main__')" --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 \
    --max-connections 128 --max-frames 150 > $R/server.log 2>&1 &
  srv=$!
  for i in $(seq 150); do grep -q "Ready" $R/server.log && break; sleep 1; done
  echo "ready after $i s"; grep -E "max_streams auto|Continuous batching|Serving|loaded in" $R/server.log | cut -c1-260
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
  grep -E "Traceback|Error|Warm-up|Garbage" $R/server.log | tail -5 | cut -c1-220
  grep "First chunk" $R/server.log | sed 's/.*First chunk/First chunk/' > $R/first-chunks.log
  head -4 $R/first-chunks.log
fi
tar czf $OUT/$NAME.tgz -C $OUT r && rm -rf $R
echo "total $((SECONDS - t)) s"
