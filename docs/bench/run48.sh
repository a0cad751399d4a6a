#!/usr/bin/env bash
# Run 48 (H200, fifteenth session): the tensor-core batched GEMV at 128 rows per block where its splits fit a cluster
# (gemv_batched_mma.cu: half the x staged per weight byte), A/B against 64 rows (Q3T_GEMV_ROWS=64, same call).
# The 128-row kernel and Q3T_GEMV_ROWS were removed after this run (c359d34): this script records what ran at c8b45dd.
# STEPS=gemv: the batched GEMV tests (every shape vs float64, rows alone vs batched, clusters vs scratch; int8 too).
# STEPS=chain: kernels/device/bench_gemv_chain.py with the rule and with 64 rows.
# STEPS=streams-1.7b / streams-0.6b: bench.streams 1,2,4,8,16, then 4, 8 and 16 with Q3T_GEMV_ROWS=64.
# STEPS=tests: the batched kernels' whole GPU suite, int8's, the decoder, scheduler and admission suites.
# Carry .whl-lite and .libcache. Everything comes back in $OUT/NAME.tgz.
STEPS=${STEPS:-gemv,chain,streams-1.7b,streams-0.6b}
NAME=${NAME:-run48}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
echo "library $(tail -1 $R/build.log) [$((SECONDS - t)) s]"
py() { local name=$1 limit=$2; shift 2; timeout $limit python3 -m pytest -q -p no:cacheprovider -rs "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(tail -1 $R/$name.log) [$((SECONDS - t)) s]"; grep -h -E "^FAILED|^E  " $R/$name.log | head -6 | cut -c1-300; }
if has chain; then
  for rows in "" 64; do
    Q3T_GEMV_ROWS=$rows timeout 120 python3 kernels/device/bench_gemv_chain.py "rows=${rows:-rule}" 2>&1 | tail -1 | tee -a $R/chain.jsonl
  done
  echo "[$((SECONDS - t)) s]"
fi
if has gemv; then
  py gemv 200 tests/test_batched_kernels_gpu.py -k gemv tests/test_int8_kernels_gpu.py
fi
if has tests; then
  py kernels 240 tests/test_batched_kernels_gpu.py
  py engine 200 tests/test_batching_engine_gpu.py tests/test_batched_admission_gpu.py
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
    Q3T_GEMV_ROWS=64 streams streams-$size-rows64 $size --streams 4,8,16
  fi
done
tar czf $OUT/$NAME.tgz -C $OUT r && rm -rf $R
echo "total $((SECONDS - t)) s"
