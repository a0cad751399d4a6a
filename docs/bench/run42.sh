#!/usr/bin/env bash
# Run 42 (H200, fourteenth session): where a batched GEMV launch goes at 8 and 16 vectors (ncu, one launch at a
# time, caches flushed: kernels/device/gemv_shapes.py at the 1.7B step's shapes), with and without the cluster
# split; then compute-sanitizer memcheck and racecheck on the same GEMVs (clusters) and memcheck on a batched decode
# with lone steps (kernels/device/sanitize_batched.py). Carry .whl-lite and .libcache; results in $OUT/run42.tgz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-lite/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 Q3T_CACHE_DIR=$PWD/.libcache Q3T_REQUIRE=1
R=$OUT/r; mkdir -p $R
t=$SECONDS
python3 -m wyoming_qwen3tts.native > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
M=gpu__time_duration.sum,launch__grid_size,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,lts__t_bytes.sum,smsp__inst_executed.sum
for s in long_scoreboard barrier membar short_scoreboard mio_throttle lg_throttle wait math_pipe_throttle no_instruction dispatch_stall imc_miss branch_resolving sleeping; do
  M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio; done
for c in 1 0; do
  Q3T_GEMV_CLUSTER=$c timeout 200 ncu --clock-control none --kernel-name regex:k_bgemv_mma --metrics $M --csv \
    python3 kernels/device/gemv_shapes.py 8 16 > $R/ncu-cluster$c.csv 2> $R/ncu-cluster$c.err
  echo "ncu cluster=$c rc=$? $(grep -c k_bgemv_mma $R/ncu-cluster$c.csv) rows [$((SECONDS - t)) s]"
done
python3 - $R <<'PY'
import csv, sys, collections
for c in (1, 0):
    rows = [r for r in csv.DictReader(l for l in open(f"{sys.argv[1]}/ncu-cluster{c}.csv") if l.startswith('"'))]
    by = collections.OrderedDict()
    for r in rows:
        by.setdefault(r["ID"], {"name": r["Kernel Name"][:40]})[r["Metric Name"]] = r["Metric Value"]
    print(f"cluster={c}: {len(by)} launches")
    for i, (k, v) in enumerate(by.items()):
        if i % 3 == 0:
            continue  # the warm launch of each shape
        stalls = sorted(((float(v[m].replace(',', '')), m.split('stalled_')[1].split('_per')[0]) for m in v if 'stalled' in m), reverse=True)[:4]
        print(f"  {v['name']:40s} grid {v.get('launch__grid_size')} "
              f"t {v['gpu__time_duration.sum']} occ {float(v['sm__warps_active.avg.pct_of_peak_sustained_active']):.0f}% "
              f"dram {float(v['dram__bytes_read.sum'].replace(',', '')) / 1e6:.1f}MB inst {v['smsp__inst_executed.sum']} "
              + " ".join(f"{n}={s:.1f}" for s, n in stalls))
PY
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 kernels/device/gemv_shapes.py 1 16 > $R/san-gemv-$tool.log 2>&1
  echo "sanitizer $tool gemv rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san-gemv-$tool.log | tail -1) [$((SECONDS - t)) s]"
done
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 python3 kernels/device/sanitize_batched.py tiny bfloat16 > $R/san-decode.log 2>&1
echo "sanitizer memcheck decode rc=$? $(grep -E 'ERROR SUMMARY' $R/san-decode.log | tail -1) [$((SECONDS - t)) s]"
tar czf $OUT/run42.tgz -C $OUT r && rm -rf $R
echo "total $((SECONDS - t)) s"
