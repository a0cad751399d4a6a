#!/usr/bin/env bash
# Run 41 (H200, fourteenth session): the tensor-core batched GEMV's split K across thread-block clusters
# (gemv_batched_mma.cu: partials meet in distributed shared memory instead of global scratch + a counter).
# STEPS=tests: the batched kernels' GPU suite (GEMVs: clusters against the scratch path bit for bit), the decoder,
#   scheduler and admission suites.
# STEPS=streams-1.7b / streams-0.6b: bench.streams 1,2,4,8,16, then 4 and 16 with Q3T_GEMV_CLUSTER=0 (the A/B,
#   same call). STEPS=splits: docs/bench/splits_ab.py.
# STEPS=server: the server at the defaults, the loads of run 36.
# Carry .whl-lite and .libcache. Everything comes back in $OUT/NAME.tgz.
STEPS=${STEPS:-tests,streams-1.7b}
NAME=${NAME:-run41}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
echo "library $(tail -1 $R/build.log) [$((SECONDS - t)) s]"
py() { local name=$1 limit=$2; shift 2; timeout $limit python3 -m pytest -q -p no:cacheprovider -rs "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(tail -1 $R/$name.log) [$((SECONDS - t)) s]"; }
if has tests; then
  py kernels 240 tests/test_batched_kernels_gpu.py
  py engine 200 tests/test_batching_engine_gpu.py tests/test_batched_admission_gpu.py
  grep -h -E "^FAILED|Error|assert" $R/kernels.log $R/engine.log | head -8 | cut -c1-300
fi
ck() { [ -d /tmp/ck/$1 ] || python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $1 --out /tmp/ck/$1 --device cuda > /dev/null 2>&1; }
streams() {  # name, size, then bench.streams arguments
  local name=$1 size=$2; shift 2; ck $size
  timeout 150 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/$size --frames 200 --runs 2 --out $R/$name.json "$@" \
    > $R/$name.log 2>&1
  echo "$name rc=$? [$((SECONDS - t)) s]"; grep -E "streams:|backend|batched step" $R/$name.log | cut -c1-150
}
for size in 1.7b 0.6b; do
  if has streams-$size; then
    streams streams-$size $size
    Q3T_GEMV_CLUSTER=0 streams streams-$size-nocluster $size --streams 4,16
  fi
done
if has splits; then  # the Talker attention's splits per head at 2-16 streams (docs/bench/splits_ab.py)
  ck 1.7b; timeout 200 python3 docs/bench/splits_ab.py /tmp/ck/1.7b > $R/splits_ab.log 2>&1
  echo "splits rc=$? [$((SECONDS - t)) s]"; tail -4 $R/splits_ab.log
fi
if has server; then
  ck 1.7b
  python3 -m wyoming_qwen3tts --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --max-connections 128 --max-frames 150 \
    > $R/server.log 2>&1 &
  srv=$!
  for i in $(seq 150); do grep -q "Ready" $R/server.log && break; sleep 1; done
  echo "ready after $i s"; grep -E "max_streams auto|Serving" $R/server.log | cut -c1-200
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
  grep -E "Traceback|Error" $R/server.log | tail -5 | cut -c1-220
fi
tar czf $OUT/$NAME.tgz -C $OUT r && rm -rf $R
echo "total $((SECONDS - t)) s"
