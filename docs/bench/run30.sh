#!/usr/bin/env bash
# Run 30 (H200, twelfth session): the int8 kernels (issue 20) on a GPU for the first time.
# STEPS=tests: the SASS checks, the int8 GEMV and backend tests (PDL off and on), then the suites the ABI 8 change
#   touches (kernels, batched kernels, prefill, batched admission, batching engine).
# STEPS=bench: frames/s and peak memory bf16 against int8, both sizes, one stream (bench, kernels backend) and
#   1 and 16 streams (bench.streams), the prefill's ms per prompt, then quant_check on the full-size random 1.7B.
# Carry .whl-lite and .libcache (built here with Q3T_ARCHS=sm_90). Logs and JSON under $OUT/r30.
STEPS=${STEPS:-tests,bench,streams}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r30; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
py() { local name=$1 limit=$2; shift 2; timeout $limit python3 -m pytest -q -x -p no:cacheprovider -rs "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(tail -1 $R/$name.log) [$((SECONDS - t)) s]"; }
if has tests; then
  Q3T_REQUIRE_SASS=1 py sass 120 -s tests/test_native_build.py -k sass
  Q3T_PDL=0 py int8_pdl0 150 tests/test_int8_kernels_gpu.py
  Q3T_PDL=1 py int8_pdl1 150 tests/test_int8_kernels_gpu.py
  py kernels 150 tests/test_kernels_gpu.py -k "not full"
  py batched 100 tests/test_batched_kernels_gpu.py tests/test_batched_admission_gpu.py tests/test_batching_engine_gpu.py
  py prefill 100 tests/test_prefill_gpu.py
  grep -h -E "FAILED|Error" $R/sass.log $R/int8_pdl*.log $R/kernels.log $R/batched.log $R/prefill.log | head -8 | cut -c1-300
fi
if has bench; then
  for w in bf16 int8; do
    timeout 200 python3 -m wyoming_qwen3tts.bench --sizes 1.7b,0.6b --backends kernels --weights $w --runs 3 \
      --no-copy-bw --out $R/bench-$w > $R/bench-$w.log 2>&1
    echo "bench $w rc=$? [$((SECONDS - t)) s]"; grep -E "frames/s|fps|kernels" $R/bench-$w.log | tail -4 | cut -c1-200
  done
fi
if has streams; then  # 1 and 16 streams (also in bench; on its own after run 30's JSON were lost to the file count)
  [ -d /tmp/q3t-bench-ckpt/0.6b ] || for size in 1.7b 0.6b; do
    python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $size --out /tmp/q3t-bench-ckpt/$size --device cuda > /dev/null 2>&1; done
  for size in 1.7b 0.6b; do for w in bf16 int8; do
    timeout 100 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/q3t-bench-ckpt/$size --streams 1,16 --runs 2 \
      --weights $w --out $R/streams-$w-$size.json > $R/streams-$w-$size.log 2>&1
    echo "streams $size $w rc=$? [$((SECONDS - t)) s]"; grep -v "^ \|^{\|^}" $R/streams-$w-$size.log | tail -3 | cut -c1-200
  done; done
fi
if has bench; then
  timeout 120 python3 -m wyoming_qwen3tts.tools.quant_check --model /tmp/q3t-bench-ckpt/1.7b --sentences 3 --frames 60 \
    --json $R/quant-check.json > $R/quant-check.log 2>&1
  echo "quant_check rc=$? [$((SECONDS - t)) s]"; tail -12 $R/quant-check.log | cut -c1-200
fi
# Few files come back from the device: one archive.
tar czf $OUT/r30-${STEPS//,/-}.tgz -C $OUT r30 && rm -rf $R
echo "total $((SECONDS - t)) s"
