"""The engine on a GPU: the kernel backend behind Engine.synthesize (launch-ahead frame groups,
codec on its own stream) gives the same codes and audio as the torch backend."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest
from wyoming_qwen3tts.errors import SynthesisCancelled

pytestmark = pytest.mark.gpu

TEXT = "The engine on the GPU speaks this sentence for the test, and then another one after it."


def _engine(path, backend: str, dtype: str = "float32") -> Engine:
    options = EngineOptions(
        device="cuda",
        dtype=dtype,
        backend=backend,
        first_chunk_frames=2,
        chunk_frames=8,  # type: ignore[arg-type]
        max_streams=1,
    )  # the one-stream kernel backend (tests/engine/test_batching_engine_gpu.py: batching)
    engine = Engine.from_pretrained(str(path), options)
    if backend == "kernels" and engine.info.backend != "kernels":
        pytest.fail(f"kernel backend did not load: {engine.info.backend_reason}")
    return engine


@pytest.mark.parametrize("suppress_eos", [False, True])
def test_kernels_engine_matches_torch_engine(tiny_checkpoint, suppress_eos):
    sampling = replace(SamplingParams.greedy(), suppress_eos=suppress_eos)
    request = SynthesisRequest(text=TEXT, speaker="ryan", language="english", sampling=sampling, max_frames=60, seed=3)
    torch_pcm, torch_codes = _engine(tiny_checkpoint, "torch").synthesize_all(request)
    kern = _engine(tiny_checkpoint, "kernels")
    chunks = list(kern.synthesize(request))
    codes = np.concatenate([c.codes for c in chunks])
    assert np.array_equal(codes, torch_codes)
    if suppress_eos:
        assert len(codes) == 60
    a = np.frombuffer(b"".join(c.pcm for c in chunks), dtype="<i2").astype(np.int32)
    b = np.frombuffer(torch_pcm, dtype="<i2").astype(np.int32)
    assert a.shape == b.shape and np.abs(a - b).max() <= 2
    assert [c.num_frames for c in chunks][:3] == [2, 4, 8][: len(chunks)]


def test_kernels_engine_cancel_then_next_request(tiny_checkpoint):
    engine = _engine(tiny_checkpoint, "kernels")
    sampling = replace(SamplingParams(), suppress_eos=True)
    cancel = threading.Event()
    gen = engine.synthesize(SynthesisRequest(text=TEXT, speaker="vivian", sampling=sampling, max_frames=200), cancel)
    next(gen)
    cancel.set()
    with pytest.raises(SynthesisCancelled):
        next(gen)
    pcm, codes = engine.synthesize_all(
        SynthesisRequest(text="Next one.", speaker="sohee", sampling=sampling, max_frames=20, seed=1)
    )
    assert codes.shape == (20, 16) and len(pcm) == 20 * 1920 * 2


def test_kernels_engine_bf16_sampled_is_reproducible(tiny_checkpoint):
    engine = _engine(tiny_checkpoint, "kernels", dtype="bfloat16")
    request = SynthesisRequest(
        text=TEXT, speaker="aiden", sampling=replace(SamplingParams(), suppress_eos=True), max_frames=40, seed=11
    )
    first = engine.synthesize_all(request)
    second = engine.synthesize_all(request)
    assert np.array_equal(first[1], second[1]) and first[0] == second[0]
    assert first[1].shape == (40, 16)
