"""What a synthesis request asks for and what comes back: sampling settings, the request, PCM chunks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

SAMPLE_RATE = 24000
SAMPLE_WIDTH = 2  # bytes, signed 16-bit little endian
CHANNELS = 1
SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz


@dataclass(frozen=True)
class SamplingParams:
    """Logits processing and sampling. The defaults are the release's generation_config.json values;
    a checkpoint's own file (from_generation_config) is the rule, these fill what it leaves out."""

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
    def greedy(cls) -> SamplingParams:
        return cls(do_sample=False, subtalker_do_sample=False)

    @classmethod
    def from_generation_config(cls, gen: Mapping[str, Any]) -> SamplingParams:
        """The sampling a checkpoint's generation_config.json asks for."""
        d = cls()
        return cls(
            do_sample=bool(gen.get("do_sample", d.do_sample)),
            temperature=float(gen.get("temperature", d.temperature)),
            top_k=int(gen.get("top_k", d.top_k)),
            top_p=float(gen.get("top_p", d.top_p)),
            repetition_penalty=float(gen.get("repetition_penalty", d.repetition_penalty)),
            subtalker_do_sample=bool(gen.get("subtalker_dosample", d.subtalker_do_sample)),
            subtalker_temperature=float(gen.get("subtalker_temperature", d.subtalker_temperature)),
            subtalker_top_k=int(gen.get("subtalker_top_k", d.subtalker_top_k)),
            subtalker_top_p=float(gen.get("subtalker_top_p", d.subtalker_top_p)),
        )


@dataclass(frozen=True)
class SamplingOverrides:
    """Sampling settings that replace the checkpoint's (None: keep the checkpoint's value)."""

    greedy: bool = False  # argmax for code 0 and the CodePredictor
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None

    def apply(self, base: SamplingParams) -> SamplingParams:
        changes = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "greedy"}
        changes = {name: value for name, value in changes.items() if value is not None}
        if self.greedy:
            changes.update(do_sample=False, subtalker_do_sample=False)
        return replace(base, **changes)


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    speaker: str
    language: str = "auto"
    instruct: str | None = None
    seed: int | None = None
    sampling: SamplingParams | None = None  # None: the engine's (the checkpoint's, with the settings' overrides)
    max_frames: int | None = None  # None: the engine's limit
    # The reference's non_streaming_mode (text fed all at once). None: the reference's default for the voice,
    # False for a cloned voice (generate_voice_clone), True otherwise.
    non_streaming_text: bool | None = None
    first_chunk_frames: int | None = None  # None: the engine's setting
    chunk_frames: int | None = None
    clone: Any = None  # a Base model's cloned voice (model.prompt.ClonePrompt); speaker is then unused


@dataclass
class AudioChunk:
    pcm: bytes  # s16le, mono, 24 kHz; len == num_frames * 1920 * 2
    codes: np.ndarray  # [num_frames, 16] int64
    # On a sentence's last chunk when the runaway guard ended it: "loop" (a repeating pattern) or
    # "budget" (no end of speech within the text's frame budget); counted by the front ends' meters.
    stopped: str | None = None
    made_at: float = 0.0  # time.monotonic() when the engine handed it over (0: not from the engine, e.g. replayed)

    @property
    def num_frames(self) -> int:
        return int(self.codes.shape[0])
