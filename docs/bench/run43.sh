#!/usr/bin/env bash
# Run 43 (H200, fourteenth session): the step's batched GEMVs as one captured chain (kernels/device/bench_gemv_chain.py)
# under each plan (Q3T_GEMV_C: chunks per warp forced; unset: plan_for's) and with clusters on (at most two blocks
# per SM, the rule after run 42) and off; then bench.streams 1.7B and 0.6B at 4 and 16 streams with the defaults.
# Carry .whl-lite and .libcache.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
for cl in 1 0; do for c in "" 2 4 8; do
  Q3T_GEMV_CLUSTER=$cl Q3T_GEMV_C=$c timeout 120 python3 kernels/device/bench_gemv_chain.py "cluster=$cl c=${c:-plan}" 2>&1 | tail -1 | tee -a $R/chain.jsonl
done; done
echo "[$((SECONDS - t)) s]"
ck() { [ -d /tmp/ck/$1 ] || python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $1 --out /tmp/ck/$1 --device cuda > /dev/null 2>&1; }
for size in ${SIZES:-1.7b 0.6b}; do
  ck $size
  timeout 150 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/$size --frames 200 --runs 2 --streams ${STREAMS:-4,16} \
    --out $R/streams-$size.json > $R/streams-$size.log 2>&1
  echo "streams $size rc=$? [$((SECONDS - t)) s]"; grep -E "streams:|backend" $R/streams-$size.log | cut -c1-110
done
tar czf $OUT/run43.tgz -C $OUT r && rm -rf $R
echo "total $((SECONDS - t)) s"
