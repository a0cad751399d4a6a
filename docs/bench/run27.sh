#!/usr/bin/env bash
# Run 27 (H200, the session's last minutes): the real server at max_streams 16 with the batched codec
# worker and batched admission, over Wyoming (no HTTP: its encoder wheel does not fit the call), the
# kernel library built beforehand (carried in .libcache), then the batched codec and admission GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.tools.random_checkpoint --size 1.7b --out /tmp/ck/1.7b --device cuda > /dev/null 2>&1
echo "checkpoint $((SECONDS - t)) s"
python3 -m wyoming_qwen3tts --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --max-streams 16 --max-connections 128 \
  --max-frames 150 > $R/server.log 2>&1 &
srv=$!
for i in $(seq 90); do grep -q "Ready" $R/server.log && break; sleep 1; done
echo "ready after $i s"
load() {  # name, then bench.load arguments
  local name=$1; shift
  timeout 40 python3 -m wyoming_qwen3tts.bench.load --wyoming tcp://127.0.0.1:10200 --json "$@" > $R/$name.json 2>/dev/null
  python3 -c "
import json; r=json.load(open('$R/$name.json')); o=r['overall']
print('$name', r['sent'], r['served'], r['failed'], 'ttfa p50/p95', o['ttfa_p50_ms'], o['ttfa_p95_ms'], 'done p50/p95', o['completion_p50_ms'], o['completion_p95_ms'], 'fps', o['frames_per_s'])" 2>&1 | tail -1
}
load alone --clients 1 --rounds 3
load wyoming-4 --clients 4 --rounds 2
load wyoming-16 --clients 16
kill $srv; wait $srv 2>/dev/null
grep -E "Traceback|Error|rtf" $R/server.log | tail -6 | cut -c1-200
echo "server done $((SECONDS - t)) s"
timeout 75 python3 -m pytest -q -p no:cacheprovider tests/test_codec_slots_gpu.py tests/test_batched_admission_gpu.py > $R/codec-gpu-tests.log 2>&1
tail -3 $R/codec-gpu-tests.log
tar czf $OUT/run27.tgz -C $OUT r
echo "total $((SECONDS - t)) s"
