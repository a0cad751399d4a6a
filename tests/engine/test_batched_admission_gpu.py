"""Batched admission on the GPU (float32, tiny checkpoints): streams admitted together, in one
BatchedDecoder.admit_all (one batched prefill of prompts of different lengths, right-padded to the
longest), decode the codes each gets when admitted alone, frame for frame; through the scheduler,
requests queued at once are admitted in one such prefill and each gets its codes alone. The torch
math of the batched prefill is checked on the CPU in tests/engine/test_batched_admission.py. GPU only.

Run: python3 -m pytest -q tests/engine/test_batched_admission_gpu.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gpu_engine import cuda_engine, text_request
from gpu_models import load_model_without_eos, text_ids
from kernel_ops import ops  # noqa: F401 - the kernels' fixture (skips without a build)

from wyoming_qwen3tts.backends.kernels.ops import Ops
from wyoming_qwen3tts.request import SamplingParams

pytestmark = pytest.mark.gpu

Wave = tuple[int, list[tuple[str, object, int]]]  # (join step, [(name, Admission, frames)])


def _decode(dec, waves: list[Wave]) -> dict[str, np.ndarray]:
    """Each wave joins at its step in ONE admit_all; a stream leaves (release) after its frames.
    Returns each stream's codes [frames, 16] by name, read as it leaves."""
    out: dict[str, np.ndarray] = {}
    running: dict[str, tuple[int, int, int]] = {}  # name -> (slot, leaving step, frames)
    last = max(join + frames for join, wave in waves for *_, frames in wave)
    for t in range(last + 1):
        for name, (slot, end, frames) in list(running.items()):
            if t == end:
                torch.cuda.synchronize()
                out[name] = dec.history[slot, :frames].cpu().numpy().astype(np.int64)
                dec.release(slot)
                del running[name]
        for join, wave in waves:
            if t == join:
                dec.admit_all([admission for _, admission, _ in wave])
                for name, admission, frames in wave:
                    running[name] = (admission.slot, t + frames, frames)  # type: ignore[attr-defined]
        dec.step()
    return out


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("size", ["tiny", "tiny-0.6b"])
def test_streams_admitted_together_decode_their_codes_alone(
    tiny_checkpoint: Path, tiny_checkpoint_06b: Path, ops: Ops, size: str, graphs: bool
) -> None:
    """Four prompts of 10 to 56 positions (one feeding its text streamed: 30 rows of trailing text)
    admitted in one admit_all into slots 3, 0, 5, 1 (out of order, slots 2 and 4 padding), then at step
    16, while two of them still run, two more together into slot 0 (used) and slot 2 (never used):
    each stream's float32 greedy codes equal those it decodes when admitted alone, frame for frame."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder
    from wyoming_qwen3tts.backends.kernels.options import KernelOptions
    from wyoming_qwen3tts.model.prompt import build_prompt

    model = load_model_without_eos(tiny_checkpoint if size == "tiny" else tiny_checkpoint_06b)
    kb = KernelBackend(model, KernelOptions(graph_prefill=False))
    prompts = {
        "a": build_prompt(model, text_ids(12, 1), "ryan", "english"),
        "b": build_prompt(model, text_ids(45, 2), "vivian", "chinese"),
        "c": build_prompt(model, text_ids(30, 3), "ryan", "english", non_streaming_text=False),
        "d": build_prompt(model, text_ids(3, 4), "vivian", "english"),
        "e": build_prompt(model, text_ids(20, 5), "vivian", "english", non_streaming_text=False),
        "f": build_prompt(model, text_ids(7, 6), "ryan", "chinese"),
    }
    lengths = [p.length for p in prompts.values()]
    assert len(set(lengths[:4])) == 4, lengths  # the first wave pads three of its four rows
    greedy = SamplingParams.greedy()

    def stream(name: str, slot: int, frames: int) -> tuple[str, Admission, int]:
        return name, Admission(slot, prompts[name], greedy, 0), frames

    waves: list[Wave] = [
        (0, [stream("a", 3, 20), stream("b", 0, 16), stream("c", 5, 24), stream("d", 1, 12)]),
        (16, [stream("e", 0, 14), stream("f", 2, 10)]),
    ]

    def decoder() -> BatchedDecoder:
        return BatchedDecoder(
            model,
            kb.ops,
            kb.weights,
            slots=6,
            max_seq=256,
            max_trailing=64,
            attn_splits=kb.options.attn_splits,
            graphs=graphs,
        )

    together = _decode(decoder(), waves)
    one = decoder()
    for _, wave in waves:
        for name, admission, frames in wave:
            alone = _decode(one, [(0, [(name, admission, frames)])])[name]
            assert alone.shape == (frames, 16)
            mism = np.argwhere(together[name] != alone)
            assert mism.size == 0, f"stream {name}: first mismatch at frame/code {mism[0].tolist()} of {frames}"


def test_streams_in_slots_past_16_decode_their_codes_alone(tiny_checkpoint: Path, ops: Ops) -> None:
    """A decoder of 64 slots (the most a step takes: its GEMVs run 16 vectors a launch, so rows 16-63 go
    through the later launches): streams in slots 63, 17, 40 and 0 (buckets 64 and, once 63 and 40 leave,
    32), then two more into 33 and 16, captured graphs on: each stream's float32 greedy codes equal those it
    decodes alone in the same decoder, frame for frame."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import (
        MAX_SLOTS,
        Admission,
        BatchedDecoder,
    )
    from wyoming_qwen3tts.backends.kernels.options import KernelOptions
    from wyoming_qwen3tts.model.prompt import build_prompt

    assert MAX_SLOTS == 64
    model = load_model_without_eos(tiny_checkpoint)
    kb = KernelBackend(model, KernelOptions(graph_prefill=False))
    greedy = SamplingParams.greedy()
    prompts = [build_prompt(model, text_ids(4 + 7 * i, 30 + i), ("ryan", "vivian")[i % 2], "english") for i in range(6)]

    def stream(i: int, slot: int, frames: int) -> tuple[str, Admission, int]:
        return str(i), Admission(slot, prompts[i], greedy, 0), frames

    waves: list[Wave] = [
        (0, [stream(0, 63, 10), stream(1, 17, 22), stream(2, 40, 12), stream(3, 0, 20)]),
        (14, [stream(4, 33, 9), stream(5, 16, 8)]),
    ]
    dec = BatchedDecoder(
        model, kb.ops, kb.weights, slots=MAX_SLOTS, max_seq=160, max_trailing=64, attn_splits=kb.options.attn_splits
    )
    assert sorted(dec.graphs) == [1, 2, 4, 8, 16, 32, 64]
    together = _decode(dec, waves)
    for _, wave in waves:
        for name, admission, frames in wave:
            alone = _decode(dec, [(0, [(name, admission, frames)])])[name]
            assert alone.shape == (frames, 16)
            mism = np.argwhere(together[name] != alone)
            assert mism.size == 0, f"stream {name}: first mismatch at frame/code {mism[0].tolist()} of {frames}"


def test_few_arrivals_are_prefilled_through_the_captured_graphs(tiny_checkpoint: Path, ops: Ops) -> None:
    """Up to GRAPHED_ADMISSIONS streams joining together are prefilled one by one through the one-stream
    backend's captured prefill graphs and copied into their slots; five at once take the eager batched
    forward. Each stream's float32 greedy codes equal those of a decoder that admits every stream eagerly."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import (
        GRAPHED_ADMISSIONS,
        Admission,
        BatchedDecoder,
    )
    from wyoming_qwen3tts.model.prompt import build_prompt

    model = load_model_without_eos(tiny_checkpoint)
    kb = KernelBackend(model)
    assert kb.warm_up() > 0
    greedy = SamplingParams.greedy()
    prompts = [build_prompt(model, text_ids(5 + 9 * i, 10 + i), ("ryan", "vivian")[i % 2], "english") for i in range(8)]

    def stream(i: int, slot: int, frames: int) -> tuple[str, Admission, int]:
        return str(i), Admission(slot, prompts[i], greedy, 0), frames

    waves: list[Wave] = [
        (0, [stream(0, 0, 12), stream(1, 1, 20)]),
        (3, [stream(2, 2, 9)]),
        (13, [stream(3, 0, 6), stream(4, 3, 6), stream(5, 4, 6), stream(6, 5, 6), stream(7, 6, 6)]),
    ]
    assert len(waves[2][1]) > GRAPHED_ADMISSIONS

    def decoder(graphed: bool) -> BatchedDecoder:
        extra = dict(prefills=kb.prefills, prefill_cache=kb.state.cache) if graphed else {}
        return BatchedDecoder(model, kb.ops, kb.weights, slots=8, max_seq=160, max_trailing=64, **extra)

    dec, eager = decoder(True), decoder(False)
    graphed, reference = _decode(dec, waves), _decode(eager, waves)
    assert dec.graphed_admissions == 3 and eager.graphed_admissions == 0
    for name, codes in reference.items():
        mism = np.argwhere(graphed[name] != codes)
        assert mism.size == 0, f"stream {name}: first mismatch at frame/code {mism[0].tolist()}"


@pytest.mark.parametrize("sampled", [False, True])
def test_requests_queued_together_are_admitted_in_one_prefill(tiny_checkpoint: Path, sampled: bool) -> None:
    """Four requests queued while the scheduler cannot run (its condition held) are admitted by one
    admit_all into slots 0-3; each one's codes (greedy, or sampled with its seed) are those it gets
    when it runs alone on the same backend (sampled: batch_invariant, so alone is the batched step too)."""
    base = SamplingParams() if sampled else SamplingParams.greedy()
    sampling = replace(base, suppress_eos=True)
    frames = [30, 20, 40, 12]
    engine = cuda_engine(tiny_checkpoint, 4, batch_invariant=sampled)
    backend = engine.backend
    requests = [text_request(i, sampling, frames[i]) for i in range(4)]
    prompts = [engine.prepare(r) for r in requests]

    def codes(session) -> np.ndarray:
        parts = []
        while len(got := session.next_frames(8)):
            parts.append(got)
        session.close()
        return np.concatenate(parts)

    alone = [codes(backend.start(p, sampling, r.seed, n)) for p, r, n in zip(prompts, requests, frames)]
    admitted: list[list[int]] = []
    admit_all = backend.decoder.admit_all

    def spy(streams) -> None:
        admitted.append([a.slot for a in streams])
        admit_all(streams)

    backend.decoder.admit_all = spy
    with backend.cond:  # re-entrant: start() takes it too; the scheduler sees all four or none
        sessions = [backend.start(p, sampling, r.seed, n) for p, r, n in zip(prompts, requests, frames)]
    together = [codes(s) for s in sessions]
    assert admitted == [[0, 1, 2, 3]], admitted
    for i in range(4):
        assert alone[i].shape == (frames[i], 16)
        assert np.array_equal(together[i], alone[i]), f"request {i}: codes changed when admitted with others"
    assert backend.active() == 0 and backend.queued() == 0


def test_many_arrivals_are_prefilled_through_captured_batched_graphs(tiny_checkpoint: Path, ops: Ops) -> None:
    """More than GRAPHED_ADMISSIONS streams joining together replay a captured batched prefill (capture_prefills:
    8 and 16 rows, prompts right-padded to their bucket, spare rows repeating the first): six at once take the
    8-row graph, then ten at once the 16-row one, into slots that earlier streams used. Each stream's float32
    greedy codes equal those of a decoder that admits every stream through the eager batched forward."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import (
        GRAPHED_ADMISSIONS,
        Admission,
        BatchedDecoder,
    )
    from wyoming_qwen3tts.model.prompt import build_prompt

    model = load_model_without_eos(tiny_checkpoint)
    kb = KernelBackend(model)
    greedy = SamplingParams.greedy()
    prompts = [
        build_prompt(
            model,
            text_ids(3 + 5 * i, 20 + i),
            ("ryan", "vivian")[i % 2],
            ("english", "chinese")[i % 3 == 0],
            non_streaming_text=i % 4 != 1,
        )
        for i in range(16)
    ]
    assert len({p.length for p in prompts}) > 8  # lengths differ: rows pad differently within a bucket

    def stream(i: int, slot: int, frames: int) -> tuple[str, Admission, int]:
        return str(i), Admission(slot, prompts[i], greedy, 0), frames

    waves: list[Wave] = [
        (0, [stream(i, i, 8 + i) for i in range(6)]),
        (14, [stream(6 + i, (i * 5) % 11, 7 + i) for i in range(10)]),
    ]
    assert min(len(w) for _, w in waves) > GRAPHED_ADMISSIONS

    def decoder() -> BatchedDecoder:
        return BatchedDecoder(model, kb.ops, kb.weights, slots=12, max_seq=160, max_trailing=64)

    dec, eager = decoder(), decoder()
    captured = dec.capture_prefills()
    assert captured > 0 and {r for r, _ in dec.batch_prefills.graphs} == {8, 16}  # type: ignore[union-attr]
    graphed, reference = _decode(dec, waves), _decode(eager, waves)
    assert dec.batch_graphed_admissions == 16 and eager.batch_graphed_admissions == 0
    for name, codes in reference.items():
        mism = np.argwhere(graphed[name] != codes)
        assert mism.size == 0, f"stream {name}: first mismatch at frame/code {mism[0].tolist()}"
