#!/usr/bin/env bash
# One device run: build (-Werror), op + backend tests, sanitizers on a short decode,
# optional full-size parity (Q3T_FULL=1) and the per-frame benchmark. Logs go to $OUT.
# sass: the GEMVs' 16-byte weight loads issued before the grid-dependency wait, in the SASS of this
# machine's nvcc. bench_gemv: every GEMV shape alone (kernels/device/bench_gemv.py).
# profile: where one frame's time goes, kernel by kernel (kernels/device/profile_frame.py).
# bench_options: ms per frame under kernel backend options or libraries side by side
# (kernels/device/bench_options.py). launch_floor: µs per kernel of an empty dependent chain in one
# graph (kernels/device/launch_floor.cu).
# tests_batched, sanitize_batched, bench_batched: the batched-step kernels (kernels/README.md).
# tests_int8: the GEMVs on int8 weights and the int8 kernel backends (docs/int8.md).
set -uo pipefail
OUT=${OUT:-/tmp/q3t-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 Q3T_REQUIRE=1 Q3T_CACHE_DIR=${Q3T_CACHE_DIR:-/tmp/q3t-cache}
STEPS=${STEPS:-build,tests,tests_pdl,sanitize,full,bench}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if has build; then
  /usr/bin/time -f "build %e s" python3 -m wyoming_qwen3tts.backends.kernels.build --werror --force 2>&1 | tee "$OUT/build.log"
fi
if has tests; then
  Q3T_PDL=0 timeout 400 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k "not full" -rs 2>&1 | tee "$OUT/pytest.log" | tail -30
fi
if has tests_pdl; then
  Q3T_PDL=1 timeout 400 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k "not full" -rs 2>&1 | tee "$OUT/pytest_pdl.log" | tail -30
fi
if has sass; then
  Q3T_REQUIRE_SASS=1 timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_native_build.py -k sass 2>&1 | tee "$OUT/sass.log" | tail -8
fi
if has sanitize; then
  for tool in ${SANITIZERS:-memcheck racecheck}; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 python3 kernels/device/sanitize_decode.py > "$OUT/san_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?"; tail -4 "$OUT/san_$tool.log"
  done
fi
if has full; then
  Q3T_FULL=1 timeout 400 python3 -m pytest -q -x -s -p no:cacheprovider tests/kernels/test_kernels_gpu.py -k full 2>&1 | tee "$OUT/full.log" | tail -15
fi
if has bench_gemv; then
  timeout 300 python3 kernels/device/bench_gemv.py 2>&1 | tee "$OUT/bench_gemv.log"
fi
if has profile; then
  # Per-kernel busy time and the gaps between kernels inside one replayed frame, for deciding what
  # to fuse next.
  timeout 240 python3 kernels/device/profile_frame.py ${BENCH_SIZES:-0.6b 1.7b} --out "$OUT/profile" 2>&1 | grep -v Warn
  # Without PDL each kernel's trace duration is its own work (with PDL it includes the wait).
  Q3T_PDL=0 timeout 240 python3 kernels/device/profile_frame.py ${BENCH_SIZES:-0.6b 1.7b} --out "$OUT/profile_nopdl" 2>&1 | grep -v Warn
fi
if has launch_floor; then
  nvcc -O3 -arch=sm_90 -o /tmp/q3t-lf kernels/device/launch_floor.cu && /tmp/q3t-lf | tee "$OUT/launch_floor.md"
fi
if has bench_options; then
  # BENCH_OPTIONS: the settings to compare, e.g. "- attn_splits=16" (kernels/device/bench_options.py).
  timeout 400 python3 kernels/device/bench_options.py ${BENCH_OPTIONS:--} --sizes ${BENCH_SIZES_CSV:-0.6b,1.7b} 2>&1 | grep -v Warn | tee "$OUT/bench_options.log"
fi
if has tests_batched; then
  # The batched-step kernels (tests/kernels/test_batched_kernels_gpu.py), PDL off then on.
  for pdl in 0 1; do
    Q3T_PDL=$pdl timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_batched_kernels_gpu.py -rs 2>&1 | tee "$OUT/pytest_batched_pdl$pdl.log" | tail -15
  done
fi
if has tests_int8; then
  # int8 weights (tests/kernels/test_int8_kernels_gpu.py), PDL off then on.
  for pdl in 0 1; do
    Q3T_PDL=$pdl timeout 500 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_int8_kernels_gpu.py -rs 2>&1 | tee "$OUT/pytest_int8_pdl$pdl.log" | tail -15
  done
fi
if has sanitize_batched; then
  # memcheck and racecheck over a few small batched-kernel tests (the GEMV's NaN-row case, attention, draws).
  for tool in ${SANITIZERS:-memcheck racecheck}; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider \
      tests/kernels/test_batched_kernels_gpu.py -k "never_mix or (split_rows and 4-2-16 and dtype0) or (rows_equal_one_stream and 2-1-16 and 3) or sample_rows or embed_sum or store" > "$OUT/san_batched_$tool.log" 2>&1
    echo "compute-sanitizer $tool (batched kernels) rc=$?"; tail -4 "$OUT/san_batched_$tool.log"
    # A whole batched decode: joins, a leave, a reused slot, padding rows (kernels/device/sanitize_batched.py).
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 python3 kernels/device/sanitize_batched.py \
      ${SANITIZE_BATCHED_ARGS:-} > "$OUT/san_batched_decode_$tool.log" 2>&1
    echo "compute-sanitizer $tool (batched decode) rc=$?"; tail -4 "$OUT/san_batched_decode_$tool.log"
  done
fi
if has bench_batched; then
  timeout 300 python3 kernels/device/bench_batched.py 2>&1 | tee "$OUT/bench_batched.log"
fi
if has bench; then
  timeout 400 python3 kernels/device/bench.py ${BENCH_SIZES:-0.6b 1.7b} 2>&1 | tee "$OUT/bench.log"
fi
