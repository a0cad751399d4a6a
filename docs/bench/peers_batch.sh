#!/usr/bin/env bash
# Issue 16, peers side by side (H200, no internet): qwen3-tts-triton 0.3.0 generate_batch() (hybrid, CustomVoice 1.7B)
# and faster-qwen3-tts-batch 0.2.0 generate_voice_clone_batch() (Base 1.7B) at 1, 2, 4, 8, 16 streams, 200 frames per
# stream, full-size random weights built in memory. JSON, table and log under $OUT.
#
# Carry the ignored folder .whl-peers (19 MB: common/ = qwen-tts 0.1.1, transformers 4.57.3, faster-qwen3-tts 0.2.4
# and the rest that both peers import; triton/ and fqb/ = the two peers). torch 2.11 brings triton 3.6 itself.
# Time: ~6 min at most. Each peer has 160 s (--timeout) for a capture/warm-up call and ONE timed call (--runs 1) per
# stream count, counts run 1, 16, 2, 4, 8; what a timeout cuts off is listed as "not run" in the JSON and table.
#
# WITH_OURS=1 also builds our kernels and times bench.streams on a random 1.7B checkpoint first (as run 22 did; needs
# .whl too, and several minutes more), then reports x_aggregate / x_TTFA against it. Without it, run later:
#   python -m wyoming_qwen3tts.bench.peers_batch --from peers-batch.json --ours streams-1.7b.json
set -u
PIP="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target"
t=$SECONDS
$PIP /tmp/site_pcommon .whl-peers/common/*.whl || exit 1
$PIP /tmp/site_triton .whl-peers/triton/*.whl || exit 1
$PIP /tmp/site_fqb .whl-peers/fqb/*.whl || exit 1
echo "peer wheels installed in $((SECONDS - t)) s"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

OURS=()
if [ "${WITH_OURS:-0}" = 1 ]; then
  # .whl-lite (our wheels without av: the bench needs no HTTP) where it was carried, else .whl; a library built
  # beforehand in .libcache where carried (it fits the transfer with the peers' wheels), else built here.
  WHL=.whl-lite; [ -d $WHL ] || WHL=.whl
  $PIP /tmp/site --upgrade $WHL/*.whl || exit 1
  export Q3T_REQUIRE=1 Q3T_CACHE_DIR=/tmp/q3t-cache; FORCE=--force
  [ -d .libcache ] && { Q3T_CACHE_DIR=$PWD/.libcache; FORCE=; }
  PYTHONPATH=/tmp/site:$PWD python3 -m wyoming_qwen3tts.native --werror $FORCE > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
  [ -d /tmp/ck/1.7b ] || PYTHONPATH=/tmp/site:$PWD python3 -m wyoming_qwen3tts.tools.random_checkpoint --size 1.7b \
    --out /tmp/ck/1.7b --device cuda > /dev/null
  PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m wyoming_qwen3tts.bench.streams --model /tmp/ck/1.7b --frames 200 \
    --runs 2 --out $OUT/streams-1.7b.json 2>&1 | grep -v "^ \|^{\|^}" | tail -8
  [ -s $OUT/streams-1.7b.json ] && OURS=(--ours $OUT/streams-1.7b.json)
  echo "ours done at $((SECONDS - t)) s"
fi

# The bench itself needs only the standard library and our package; each worker gets its peer's folders first.
PYTHONPATH=$PWD python3 -m wyoming_qwen3tts.bench.peers_batch \
  --triton-path /tmp/site_triton:/tmp/site_pcommon --fqb-path /tmp/site_fqb:/tmp/site_pcommon \
  --streams 1,2,4,8,16 --frames 200 --runs 1 --size 1.7b --triton-mode hybrid --timeout 160 \
  "${OURS[@]}" --out $OUT/peers-batch.json
grep -E "^\[(triton|fqb)\]|Error" $OUT/peers-batch.log | tail -20
# If the Triton kernels themselves fail (they were only ever tested on an RTX 5090), the same batched graphs without
# them still say what the batching is worth: its "faster" mode, while time is left.
if [ $((SECONDS - t)) -lt 240 ] && ! python3 -c "import json, sys; r = json.load(open('$OUT/peers-batch.json'))
sys.exit(not any(x.get('ok') for x in r['peers']['triton']['rows']))"; then
  echo "no hybrid row: qwen3-tts-triton in faster mode (its CUDA graphs without the Triton kernels)"
  PYTHONPATH=$PWD python3 -m wyoming_qwen3tts.bench.peers_batch --peers triton \
    --triton-path /tmp/site_triton:/tmp/site_pcommon --streams 1,4,16 --frames 200 --runs 1 --size 1.7b \
    --triton-mode faster --timeout 90 "${OURS[@]}" --out $OUT/peers-batch-faster.json
fi
echo "total $((SECONDS - t)) s"
