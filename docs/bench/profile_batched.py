"""Where a batched step's time goes: one eager step per stream count under the torch profiler, GPU time by kernel.

    python3 docs/bench/profile_batched.py MODEL_DIR [NB ...]
"""
import sys
from collections import defaultdict
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from wyoming_qwen3tts.backends.kernels.batched import BatchedDecoder
from wyoming_qwen3tts.engine import Engine, EngineOptions
from wyoming_qwen3tts.request import SynthesisRequest

model = sys.argv[1]
nbs = [int(a) for a in sys.argv[2:]] or [1, 16]
engine = Engine.from_pretrained(model, EngineOptions(backend="kernels", local_files_only=True, max_streams=1))
kb = engine.backend
sampling = replace(engine.default_sampling, suppress_eos=True)
prompt = engine.prepare(SynthesisRequest(text="The quick brown fox jumps over the lazy dog.", speaker=engine.speakers[0],
                                         max_frames=50))
dec = BatchedDecoder(kb.model, kb.ops, kb.weights, slots=16, max_seq=512, max_trailing=64, graphs=False)
for nb in nbs:
    for s in range(nb):
        dec.admit(s, prompt, sampling, s)
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(3):
        dec.launch_step(nb, stream)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            dec.launch_step(nb, stream)
        torch.cuda.synchronize()
    by = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            key = e.name.replace("(anonymous namespace)::", "")[:90]
            by[key][0] += e.device_time / 5
            by[key][1] += 1 / 5
    total = sum(v[0] for v in by.values())
    print(f"nb={nb}: GPU time per step {total / 1000:.3f} ms over {sum(v[1] for v in by.values()):.0f} kernels")
    for k, (t, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:14]:
        print(f"  {t / 1000:7.3f} ms  {n:5.0f}x  {k}")
    for s in range(nb):
        dec.release(s)
