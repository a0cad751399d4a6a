#!/usr/bin/env bash
# Device call of run 23 (H200): GPU tests of the batching backend, then the real server (1.7B, full-size random
# weights) under load over Wyoming and HTTP, with max_streams 16 and with 1, in one call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_REQUIRE=1 Q3T_CACHE_DIR=/tmp/q3t-cache
t=$SECONDS
python3 -m wyoming_qwen3tts.native --werror > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $((SECONDS - t)) s"
# (The GPU tests of this commit ran in the first try of this call: docs/bench/gpu-tests-batching-0c49c2e.log.)
R=/tmp/r23; mkdir -p $R
[ -d /tmp/ck/1.7b ] || python3 -m wyoming_qwen3tts.tools.random_checkpoint --size 1.7b --out /tmp/ck/1.7b --device cuda > /dev/null
load() {  # name args...
  local name=$1; shift
  timeout 120 python3 -m wyoming_qwen3tts.bench.load --wyoming tcp://127.0.0.1:10200 --http http://127.0.0.1:8000 --json "$@" \
    > $R/load-$name.json 2> $R/load-$name.err
  python3 - "$R/load-$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); o = r["overall"]
d = r.get("http_minus_wyoming_ttfa_ms")
o = {k: (v if v is not None else float("nan")) for k, v in o.items()}
print(f"{sys.argv[2]:28s} sent {r['sent']:3d} served {r['served']:3d} failed {r['failed']:2d}  TTFA p50 {o['ttfa_p50_ms']:7.1f} p95 {o['ttfa_p95_ms']:7.1f} ms"
      f"  done p95 {o['completion_p95_ms']:7.0f} ms  {o['frames_per_s']:7.1f} frames/s" + (f"  http-wyoming p50 {d['p50']:+.1f} p95 {d['p95']:+.1f}" if d else ""))
PY
}
for streams in 16 1; do
  python3 -m wyoming_qwen3tts --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --http tcp://127.0.0.1:8000 \
    --max-streams $streams --max-connections 128 --max-frames 150 > $R/server-$streams.log 2>&1 &
  pid=$!
  for i in $(seq 120); do kill -0 $pid 2>/dev/null || { echo "server died"; tail -20 $R/server-$streams.log; break; }; python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz').status != 200)" 2>/dev/null && break; sleep 1; done
  echo "max_streams $streams: ready after $i s"
  load s$streams-alone-both --clients 2 --protocol both --rounds 6
  load s$streams-wyoming-4 --clients 4 --protocol wyoming --rounds 2
  load s$streams-wyoming-16 --clients 16 --protocol wyoming --rounds 2
  load s$streams-both-16 --clients 16 --protocol both --rounds 2
  load s$streams-poisson-32 --clients 32 --protocol both --arrivals poisson --rate 8 --seed 1
  kill -TERM $pid; wait $pid
  grep -E "Traceback|ERROR|batching" $R/server-$streams.log | head -5
done
tar czf $OUT/run23.tgz -C $R .
echo "total $((SECONDS - t)) s"
