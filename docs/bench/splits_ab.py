"""A/B in one process: the batched step's Talker attention splits per head at 2, 4 and 8 streams in a 16-slot
decoder (attention_splits(16) = 4 today, fixed per decoder) against more splits (16 and 32 at 2-4 streams, 8 at 8).

    python docs/bench/splits_ab.py /tmp/ck/1.7b
"""

import statistics
import sys
import time
from dataclasses import replace

import torch

from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder
from wyoming_qwen3tts.engine import Engine, EngineOptions
from wyoming_qwen3tts.request import SynthesisRequest

FRAMES = 200
engine = Engine.from_pretrained(sys.argv[1], EngineOptions(backend="kernels", max_frames=2048, local_files_only=True,
                                                           max_streams=1))  # fmt: skip
kb = engine.backend
sampling = replace(engine.default_sampling, suppress_eos=True)
prompt = engine.prepare(SynthesisRequest(text="The quick brown fox jumps over the lazy dog while the kettle starts to sing.",
                                         speaker=engine.speakers[0], language="english", seed=0, max_frames=FRAMES))
decoders = {s: BatchedDecoder(kb.model, kb.ops, kb.weights, slots=16, max_seq=prompt.length + 2048 + 1,
                              max_trailing=max(prompt.trailing.shape[0], 1), attn_splits=s, pdl=kb.pdl,
                              lone_splits=kb.options.attn_splits) for s in (4, 8, 16, 32)}  # fmt: skip


def timed(dec: BatchedDecoder, n: int, seed: int) -> float:
    dec.admit_all([Admission(s, prompt, sampling, seed + s) for s in range(n)])
    torch.cuda.synchronize()
    a = time.perf_counter()
    for _ in range(FRAMES):
        dec.step()
    torch.cuda.synchronize()
    b = time.perf_counter()
    for s in range(n):
        dec.release(s)
    return (b - a) / FRAMES * 1e3


for n in (2, 4, 8, 16):
    for dec in decoders.values():
        timed(dec, n, 1)  # warm
    ms = {s: [] for s in decoders}
    for r in range(3):  # interleaved
        for s, dec in decoders.items():
            ms[s].append(timed(dec, n, 100 * r))
    row = "  ".join(f"splits {s}: {statistics.median(v):.3f} ms ({n * 1e3 / statistics.median(v):.0f} fps)"
                    for s, v in ms.items())
    print(f"{n:>2} streams  {row}", flush=True)
