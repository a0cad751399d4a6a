"""What a synthesis request asks for and what comes back: sampling settings, the request, PCM chunks."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SAMPLE_RATE = 24000
SAMPLE_WIDTH = 2  # bytes, signed 16-bit little endian
CHANNELS = 1
SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz


@dataclass(frozen=True)
class SamplingParams:
    """Logits processing and sampling, with the defaults of the release's generation_config.json."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    # Never end at code-0 EOS (benchmarks decode a fixed number of frames on random weights).
    suppress_eos: bool = False

    @classmethod
    def greedy(cls) -> "SamplingParams":
        return cls(do_sample=False, subtalker_do_sample=False)


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    speaker: str
    language: str = "auto"
    instruct: str | None = None
    seed: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_frames: int | None = None  # None: the engine's limit
    non_streaming_text: bool = True  # the reference's non_streaming_mode (text fed all at once)
    first_chunk_frames: int | None = None  # None: the engine's setting
    chunk_frames: int | None = None


@dataclass
class AudioChunk:
    pcm: bytes  # s16le, mono, 24 kHz; len == num_frames * 1920 * 2
    codes: np.ndarray  # [num_frames, 16] int64

    @property
    def num_frames(self) -> int:
        return int(self.codes.shape[0])
