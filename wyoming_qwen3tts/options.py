"""How an Engine loads and runs a model: one home for each option's default.

The server builds EngineOptions from its Settings (Settings.engine_options), `say` from its flags,
the bench and the tests directly. Imports no torch: the server reads the defaults before it loads
anything heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .backends.kernels.options import KernelOptions
from .request import SamplingOverrides

# max_queued_streams unset: this many waiting sentences per decode slot, and at least QUEUED_MIN. A
# request that has to wait then starts after about this many sentences of each slot, whatever
# max_streams is: a second or two on a GPU, where an unbounded queue lets a burst make every later
# request wait longer. The floor keeps a burst of 16 requests (several satellites and the HTTP API at
# once) waiting rather than refused on the default single slot.
QUEUED_PER_STREAM = 4
QUEUED_MIN = 16
# Streams one batched decoder steps at most: the kernels' Q3T_BATCH_MAX (kernels/include/q3t.h, batched.MAX_SLOTS).
MAX_STREAMS = 64

Backend = Literal["auto", "kernels", "torch"]
Weights = Literal["bf16", "int8"]


@dataclass(frozen=True)
class EngineOptions:
    data_dir: Path | None = None  # where downloaded models are kept (None: the Hugging Face cache)
    local_files_only: bool = False  # never download
    device: str = "auto"  # torch device: auto, cuda, cuda:1, cpu
    dtype: str = "auto"  # weights dtype: auto (bfloat16 on a GPU, float32 on the CPU), bfloat16, float16, float32
    backend: Backend = "auto"  # decode loop: fused kernels where they load, else torch
    # The Talker's and CodePredictor's matrices: as loaded ("bf16": in `dtype`), or int8 with a scale per row,
    # quantized at load (model/quant.py): half the bytes a frame reads and half their memory.
    weights: Weights = "bf16"
    first_chunk_frames: int = 1  # frames (80 ms each) in the first audio chunk (1: docs/performance.md, "first audio")
    chunk_frames: int = 12  # largest later chunk (groups double from the first up to this)
    max_frames: int = 2048  # most frames per request (12.5 frames = 1 s)
    max_text_chars: int = 5000  # longest text accepted per request
    # Streams decoded together on the batched kernels (continuous batching); 1: one request at a time on
    # the batch-1 frame; 0 ("auto"): as many as the GPU's free memory holds (scheduler.streams_for_memory),
    # 1 on the CPU. A stream decoding alone runs the batch-1 frame's kernels either way (lone.py).
    max_streams: int = 0
    # Every stream on the batched step even when it decodes alone: a stream's codes then never depend on
    # other requests (with it off they can, through float32 rounding, at frames where it ran alone), and a
    # lone request decodes ~13 % slower (H200, 1.7B, run 51: 286 against 328 frames/s).
    batch_invariant: bool = False
    # Voices' prompt prefixes (instruct, role, control block, a clip's transcript) prefilled once and their K/V
    # kept, up to this many MiB (model/prefix_cache.py); 0: every prompt prefilled whole. Off until a GPU
    # measurement shows it pays: a one-sentence prefill at batch 1 is bound by its launches and weight reads,
    # not by its positions.
    prefix_cache_mb: int = 0
    stop_runaway: bool = True  # end a sentence at a budget from its length, or on a stuck loop (runaway.py)
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)  # over generation_config.json
    kernels: KernelOptions | None = None  # None: KernelOptions.from_env()
    voice_cache_dir: Path | None = None  # Base models: clone prompts kept here (None: computed at every start)

    def __post_init__(self) -> None:
        if not 0 <= self.max_streams <= MAX_STREAMS:
            raise ValueError(f"max_streams must be 0 (auto) or 1..{MAX_STREAMS}")
        if min(self.first_chunk_frames, self.chunk_frames, self.max_frames, self.max_text_chars) < 1:
            raise ValueError("frame counts and max_text_chars must be >= 1")
        if self.backend not in ("auto", "kernels", "torch"):
            raise ValueError(f"unknown backend {self.backend!r}: use auto, kernels or torch")
        if self.prefix_cache_mb < 0:
            raise ValueError("prefix_cache_mb must be >= 0")
        if self.weights not in ("bf16", "int8"):
            raise ValueError(f"unknown weights {self.weights!r}: use bf16 or int8")


@dataclass(frozen=True)
class TextOptions:
    """How a request's text is taken: the same for Wyoming and HTTP."""

    max_text_chars: int = EngineOptions.max_text_chars  # the engine's own limit by default
    max_sentence_chars: int = 400
    text_frontend: bool = True  # Markdown, emoji, links, numbers as words (text/)
    seed: int | None = None  # sampling seed of every request; None: random
