#!/usr/bin/env bash
# Run 23, second try (H200, warm machine): the server with max_streams 16 after the GIL fix, three loads.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_REQUIRE=1 Q3T_CACHE_DIR=/tmp/q3t-cache
python3 -m wyoming_qwen3tts --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --http tcp://127.0.0.1:8000 \
  --max-streams 16 --max-connections 128 --max-frames 150 > /tmp/s.log 2>&1 &
for i in $(seq 90); do python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz').status != 200)" 2>/dev/null && break; sleep 1; done
echo "ready after $i s"
for spec in "alone-both --clients 2 --protocol both --rounds 3" "wyoming-16 --clients 16 --protocol wyoming" "both-16 --clients 16 --protocol both"; do
  set -- $spec; name=$1; shift
  timeout 50 python3 -m wyoming_qwen3tts.bench.load --wyoming tcp://127.0.0.1:10200 --http http://127.0.0.1:8000 --json "$@" > $OUT/$name.json 2>/dev/null
  python3 -c "
import json,sys; r=json.load(open('$OUT/$name.json')); o=r['overall']; d=r.get('http_minus_wyoming_ttfa_ms')
print('$name', r['sent'], r['served'], r['failed'], 'ttfa p50/p95', round(o['ttfa_p50_ms'],1), round(o['ttfa_p95_ms'],1), 'done p95', round(o['completion_p95_ms']), 'fps', round(o['frames_per_s'],1), d)" 2>&1 | tail -1
done
grep -E "Traceback|batching" /tmp/s.log | head -3
