#!/usr/bin/env bash
# Run 49 (H200, fifteenth session): the tensor-core batched GEMV with several row tiles per warp (each x fragment read
# from shared memory feeds every tile's MMAs), A/B in one call against another kernel (49a: c167c6a's, one row tile
# per warp; 49b: two row tiles per warp at every nb), which travels as a copy of its package, kernels and built
# library in .variant/ (BASE runs from inside it: python -m takes the working directory's package first).
# STEPS=chain: kernels/device/bench_gemv_chain.py, new then base.
# STEPS=gemv: the batched GEMV tests (every shape vs float64, rows alone vs batched, clusters vs scratch; int8 too).
# STEPS=streams: bench.streams 1.7B and 0.6B, 1-16 streams with the new kernel, 4, 8 and 16 with the base.
# STEPS=tests: the batched kernels' and int8's whole GPU suites (with the decoder's), scheduler and admission suites.
# STEPS=onestream (run 56 on): the one-stream GPU suites as run 38 (engine, prefill, clone, codec slots, kernels).
# STEPS=profile (run 52 on): kernels/device/profile_batched_step.py, 0.6B and 1.7B at 16 streams, contexts 127 and 227
# (PROFILE_ARGS: more arguments, e.g. "--splits 2,4,8").
# STEPS=sanitize (run 54 on): compute-sanitizer memcheck and racecheck on the batched Talker attention at the models'
# shapes (kernels/device/sanitize_attention.py) and on a tiny bf16 batched decode (kernels/device/sanitize_batched.py).
# .variant (ignored): cp -r wyoming_qwen3tts kernels of the base revision (git worktree add /tmp/base REV) into .variant/,
# then from inside it: Q3T_CACHE_DIR=$PWD/.libcache python -m wyoming_qwen3tts.native --toolchain nvcc --arch sm_90.
# NOBASE=1: the new kernel alone (no .variant needed). Carry .whl-lite, .libcache and .variant. Everything comes back in $OUT/NAME.tgz.
STEPS=${STEPS:-chain,gemv,streams}
NAME=${NAME:-run49}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONUNBUFFERED=1 Q3T_REQUIRE=1
NEW="PYTHONPATH=/tmp/site:$PWD Q3T_CACHE_DIR=$PWD/.libcache"
BASE="PYTHONPATH=/tmp/site:$PWD/.variant Q3T_CACHE_DIR=$PWD/.variant/.libcache"
TOP=$PWD
in_variant() { if [ "$1" = BASE ]; then echo "$TOP/.variant"; else echo "$TOP"; fi; }
R=$OUT/r; mkdir -p $R
t=$SECONDS
for v in NEW ${NOBASE:+_}BASE; do
  [ "$v" = _BASE ] && continue
  (cd $(in_variant $v) && env ${!v} python3 -m wyoming_qwen3tts.native) > $R/build-$v.log 2>&1 || { tail -20 $R/build-$v.log; exit 1; }
  echo "library $v $(tail -1 $R/build-$v.log) [$((SECONDS - t)) s]"
done
export PYTHONPATH=/tmp/site:$PWD Q3T_CACHE_DIR=$PWD/.libcache
py() { local name=$1 limit=$2; shift 2; timeout $limit python3 -m pytest -q -p no:cacheprovider -rs "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(tail -1 $R/$name.log) [$((SECONDS - t)) s]"; grep -h -E "^FAILED|^E  " $R/$name.log | head -6 | cut -c1-300; }
if has chain; then
  env $NEW timeout 120 python3 kernels/device/bench_gemv_chain.py new 2>&1 | tail -1 | tee -a $R/chain.jsonl
  env $BASE timeout 120 python3 .variant/kernels/device/bench_gemv_chain.py base 2>&1 | tail -1 | tee -a $R/chain.jsonl
  env $NEW timeout 120 python3 kernels/device/bench_gemv_chain.py new 2>&1 | tail -1 | tee -a $R/chain.jsonl
  echo "[$((SECONDS - t)) s]"
fi
if has profile; then
  for size in ${SIZES:-0.6b 1.7b}; do
    timeout 200 python3 kernels/device/profile_batched_step.py --size $size --out $R $PROFILE_ARGS > $R/profile-$size.log 2>&1
    echo "profile $size rc=$? [$((SECONDS - t)) s]"; grep -E "steps|per step|attn" $R/profile-$size.log
  done
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 kernels/device/sanitize_attention.py \
      > $R/san-attention-$tool.log 2>&1
    echo "sanitizer $tool attention rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san-attention-$tool.log | tail -1) [$((SECONDS - t)) s]"
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 kernels/device/sanitize_batched.py tiny bfloat16 \
      > $R/san-decode-$tool.log 2>&1
    echo "sanitizer $tool decode rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san-decode-$tool.log | tail -1) [$((SECONDS - t)) s]"
  done
fi
if has gemv; then
  py gemv 200 tests/test_batched_kernels_gpu.py -k gemv tests/test_int8_kernels_gpu.py
fi
if has tests; then
  py kernels 240 tests/test_batched_kernels_gpu.py tests/test_int8_kernels_gpu.py
  py engine 200 tests/test_batching_engine_gpu.py tests/test_batched_admission_gpu.py
fi
if has onestream; then
  py onestream 280 tests/test_engine_gpu.py tests/test_prefill_gpu.py tests/test_clone_gpu.py \
    tests/test_codec_slots_gpu.py tests/test_kernels_gpu.py -k "not full"
fi
ck() { [ -d /tmp/ck/$1 ] || python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $1 --out /tmp/ck/$1 --device cuda > /dev/null 2>&1; }
streams() {  # name, size, variant, then bench.streams arguments
  local name=$1 size=$2 v=$3; shift 3; ck $size
  (cd $(in_variant $v) && env ${!v} timeout 150 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/$size \
    --frames 200 --runs 2 --out $R/$name.json "$@") > $R/$name.log 2>&1
  echo "$name rc=$? [$((SECONDS - t)) s]"; grep -E "streams:|backend|batched step" $R/$name.log | cut -c1-150
}
if has streams; then
  for size in ${SIZES:-1.7b 0.6b}; do
    streams streams-$size $size NEW
    [ -n "$NOBASE" ] || streams streams-$size-base $size BASE --streams 4,8,16
  done
fi
tar czf $OUT/$NAME.tgz -C $OUT r && rm -rf $R
echo "total $((SECONDS - t)) s"
