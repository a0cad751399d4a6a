"""The engine on the GPU for the batching tests: float32 on CUDA with the batching backend (max_streams > 1), and
the requests they send it (four texts of different lengths, speakers and languages)."""

from __future__ import annotations

import pytest

from wyoming_qwen3tts.backends.kernels.options import KernelOptions
from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest

TEXTS = [
    ("The first request of the batch speaks this sentence.", "ryan", "english"),
    ("A second one, shorter.", "vivian", "chinese"),
    ("The third request joins a little later than the others and runs the longest of them all.", "ryan", "english"),
    ("Four.", "sohee", "korean"),
]


def cuda_engine(
    path,
    max_streams: int,
    backend: str = "kernels",
    batch_invariant: bool = False,
    kernels: KernelOptions | None = None,
) -> Engine:
    options = EngineOptions(
        device="cuda",
        dtype="float32",
        backend=backend,
        first_chunk_frames=2,
        chunk_frames=8,
        max_streams=max_streams,
        max_frames=256,
        batch_invariant=batch_invariant,
        kernels=kernels,
    )  # type: ignore[arg-type]
    engine = Engine.from_pretrained(str(path), options)
    if backend == "kernels" and max_streams > 1 and engine.info.backend != "kernels-batched":
        pytest.fail(f"batching backend did not load: {engine.info.backend_reason}")
    return engine


def text_request(i: int, sampling: SamplingParams, frames: int) -> SynthesisRequest:
    text, speaker, language = TEXTS[i]
    return SynthesisRequest(
        text=text, speaker=speaker, language=language, sampling=sampling, max_frames=frames, seed=10 + i
    )
