"""Batched admission on the CPU, float32: several prompts of different lengths prefilled in one
forward (Transformer.prefill_rows, stacked right-padded) give each prompt the last hidden state and
cache entries of its own plain prefill, in its own slot and nowhere else; BatchedDecoder.admit_all
leaves every slot in the state that admitting its stream alone leaves. The decoder runs here without
its kernels (graphs off, no step): admission is torch only.

Not bitwise: stacked, the matmuls run with B x T rows instead of L (see prefill_rows), and BLAS may
block and sum differently. Hence allclose at test_prefill.py's bounds (rtol 1e-5 / atol 4e-6). What
does not pass through a matmul (positions, seeds, sampling records, trailing text, the slot table)
is compared exactly. The decode from these states (greedy codes, float32, on the kernels) is
tests/engine/test_batched_admission_gpu.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.backends.kernels import batched, library
from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder, prefill_groups, stream_params
from wyoming_qwen3tts.backends.kernels.weights import ModelWeights
from wyoming_qwen3tts.model.checkpoint import load_checkpoint
from wyoming_qwen3tts.model.prompt import Prompt, build_prompt
from wyoming_qwen3tts.model.talker import Qwen3TTSModel
from wyoming_qwen3tts.request import SamplingParams

RTOL, ATOL = 1e-5, 4e-6
MAX_SEQ = 96
SLOTS = 6


def _model(path: Path) -> Qwen3TTSModel:
    ck = load_checkpoint(path, dtype=torch.float32, device="cpu")
    return Qwen3TTSModel.from_tensors(ck.config, ck.tensors, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module", params=["tiny", "tiny-0.6b"])
def model(request: pytest.FixtureRequest, tiny_checkpoint: Path, tiny_checkpoint_06b: Path) -> Qwen3TTSModel:
    return _model(tiny_checkpoint if request.param == "tiny" else tiny_checkpoint_06b)


def _text_ids(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [151644, 77091, 198, *[int(t) for t in rng.integers(300, 20000, size=n)], 151645, 198, 151644, 77091, 198]


def _prompts(model: Qwen3TTSModel) -> list[Prompt]:
    """Four prompts of 10 to 56 positions; the third feeds its text streamed (30 rows of trailing text)."""
    return [
        build_prompt(model, _text_ids(12, 1), "ryan", "english"),
        build_prompt(model, _text_ids(45, 2), "vivian", "chinese"),
        build_prompt(model, _text_ids(30, 3), "ryan", "english", non_streaming_text=False),
        build_prompt(model, _text_ids(3, 4), "vivian", "english"),
    ]


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def test_prefill_rows_equals_each_prompt_alone(model: Qwen3TTSModel) -> None:
    """Slots 4, 0, 2 and 5 (out of order, not contiguous) get their prompt's K/V at positions 0..L-1
    and its last hidden state; the pads' K/V stay within the slot's positions L..T-1; every other
    slot and every position from T on keeps what it held, bit for bit."""
    tc = model.cfg.talker
    stack = model.talker.model
    prompts = [p.embeds for p in _prompts(model)]
    lengths = [p.shape[0] for p in prompts]
    assert len(set(lengths)) == len(lengths) and max(lengths) <= MAX_SEQ
    slots = [4, 0, 2, 5]
    g = torch.Generator().manual_seed(0)
    before = torch.randn(SLOTS, tc.num_hidden_layers, 2, MAX_SEQ, tc.num_key_value_heads, tc.head_dim, generator=g)
    cache = before.clone()
    with torch.inference_mode():
        hidden = stack.prefill_rows(prompts, cache, torch.tensor(slots))
        for b, (embeds, slot) in enumerate(zip(prompts, slots)):
            alone = model.new_talker_cache(MAX_SEQ)
            want = stack(embeds, alone)[-1]
            n = lengths[b]
            _close(hidden[b], want, f"prompt {b}: last hidden state")
            _close(cache[slot, :, :, :n], alone.data[:, :, :n], f"prompt {b}: cache positions 0..{n - 1}")
            assert cache[slot, :, :, n : max(lengths)].isfinite().all(), f"prompt {b}: pad K/V"
    t = max(lengths)
    assert torch.equal(cache[:, :, :, t:], before[:, :, :, t:]), "positions past the longest prompt were written"
    for other in set(range(SLOTS)) - set(slots):
        assert torch.equal(cache[other], before[other]), f"slot {other} was written"


def test_prefill_rows_of_one_prompt_is_the_plain_prefill(model: Qwen3TTSModel) -> None:
    """B = 1 (admit() of one stream): no pad row, the same numbers as forward() within rounding."""
    tc = model.cfg.talker
    embeds = _prompts(model)[2].embeds
    cache = torch.zeros(2, tc.num_hidden_layers, 2, MAX_SEQ, tc.num_key_value_heads, tc.head_dim)
    alone = model.new_talker_cache(MAX_SEQ)
    with torch.inference_mode():
        hidden = model.talker.model.prefill_rows([embeds], cache, torch.tensor([1]))
        _close(hidden[0], model.talker.model(embeds, alone)[-1], "last hidden state")
    n = embeds.shape[0]
    _close(cache[1, :, :, :n], alone.data[:, :, :n], "cache")
    assert not cache[0].any()


@pytest.mark.parametrize("budget", [batched.PREFILL_POSITIONS, 60])
def test_admit_all_leaves_each_slot_as_admitting_it_alone(
    model: Qwen3TTSModel, budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four streams admitted together into used slots (their last stream's seen set, frame index and
    trailing text still there) against each admitted alone into a fresh decoder: the same state in
    every per-slot buffer. Budget 60: the prompts take three forwards (prefill_groups)."""
    monkeypatch.setattr(batched, "PREFILL_POSITIONS", budget)
    prompts = _prompts(model)
    sampled = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1)
    samplings = [SamplingParams.greedy(), sampled, replace(sampled, suppress_eos=True), SamplingParams()]
    seeds = [0, -5, 2**64 - 1, 2**63 + 12345]  # stored as the seed's 64 bits, two's complement
    slots = [4, 0, 2, 5]
    streams = [Admission(s, p, sp, seed) for s, p, sp, seed in zip(slots, prompts, samplings, seeds)]

    # No kernels: admission only (graphs off, nothing steps); the GEMV scratch is sized by a stub.
    no_kernels = SimpleNamespace(batched_gemv_scratch_floats=lambda matrices: 0)
    weights = ModelWeights.from_model(model)

    def decoder() -> BatchedDecoder:
        return BatchedDecoder(
            model,
            no_kernels,
            weights,
            slots=SLOTS,
            max_seq=MAX_SEQ,
            max_trailing=16,  # type: ignore[arg-type]
            graphs=False,
        )

    together = decoder()
    together.seen.fill_(1)
    together.step_index.fill_(7)
    together.trailing.fill_(3.0)
    together.admit_all(streams)
    assert [together.active[s] for s in range(SLOTS)] == [s in slots for s in range(SLOTS)]
    assert together.slot[:SLOTS].tolist() == [s if s in slots else -1 for s in range(SLOTS)]

    size = library.SAMPLE_PARAMS_DTYPE.itemsize
    for a in streams:
        alone = decoder()
        alone.admit(a.slot, a.prompt, a.sampling, a.seed)
        s = a.slot
        m = min(a.prompt.trailing.shape[0], 16)
        what = f"slot {s}"
        _close(together.hn[s], alone.hn[s], f"{what}: hn")
        _close(together.cache[s, :, :, : a.prompt.length], alone.cache[s, :, :, : a.prompt.length], f"{what}: cache")
        assert together.pos[s] == alone.pos[s] == a.prompt.length, what
        assert together.n_trailing[s] == alone.n_trailing[s] == m, what
        assert together.step_index[s] == alone.step_index[s] == 0, what
        assert not together.seen[s].any(), what
        assert np.array([together.seed[s].item()]).view(np.uint64)[0] == a.seed & 0xFFFF_FFFF_FFFF_FFFF, what
        assert torch.equal(together.seed[s], alone.seed[s]), what
        assert torch.equal(together.trailing[s, :m], alone.trailing[s, :m]), what
        assert torch.equal(together.trailing[s, :m], a.prompt.trailing[:m].float()), what
        assert torch.equal(together.pad[s], alone.pad[s]) and torch.equal(together.pad[s], a.prompt.pad.float()), what
        for name, want in zip(
            ("params_code0", "params_sub"), stream_params(a.sampling, model.cfg.talker.codec_eos_token_id)
        ):
            got = getattr(together, name)[s * size : (s + 1) * size]
            assert torch.equal(got, getattr(alone, name)[s * size : (s + 1) * size]), f"{what}: {name}"
            record = got.numpy().view(library.SAMPLE_PARAMS_DTYPE)[0]
            assert {k: record[k].item() for k in want} == pytest.approx(want), f"{what}: {name}"
    for other in set(range(SLOTS)) - set(slots):
        assert together.seen[other].all() and together.step_index[other] == 7, f"slot {other} was touched"


def test_admit_all_refuses_busy_repeated_and_oversized() -> None:
    """Checked before anything is written: a slot in use, the same slot twice, a prompt past max_seq."""
    dec = BatchedDecoder.__new__(BatchedDecoder)  # only the checks run: no buffers needed
    dec.slots, dec.max_seq, dec.active = 4, 8, [False, True, False, False]
    prompt = Prompt(embeds=torch.zeros(4, 2), trailing=torch.zeros(1, 2), pad=torch.zeros(2), language_id=None)
    greedy = SamplingParams.greedy()
    for slots in ([1], [0, 0], [4], [-1]):
        with pytest.raises(ValueError, match="not free and distinct"):
            dec.admit_all([Admission(s, prompt, greedy, 0) for s in slots])
    with pytest.raises(ValueError, match="a slot holds 8"):
        dec.admit_all([Admission(0, replace(prompt, embeds=torch.zeros(7, 2)), greedy, 0)])


def test_prefill_groups() -> None:
    assert prefill_groups([], 4096) == []
    assert prefill_groups([100] * 16, 4096) == [range(0, 16)]  # 16 one-sentence prompts: one forward
    assert prefill_groups([300] * 16, 4096) == [range(0, 13), range(13, 16)]  # 13 x 300 <= 4096 < 14 x 300
    # At most max_rows a group (the largest captured batched prefill): 64 arrivals in four replays of 16.
    assert prefill_groups([50] * 64, 4096, 16) == [range(0, 16), range(16, 32), range(32, 48), range(48, 64)]
    assert prefill_groups([50] * 64, 4096) == [range(0, 64)]  # 3,200 padded positions: one forward
    assert prefill_groups([300] * 20, 4096, 16) == [range(0, 13), range(13, 20)]  # the budget still binds first
    assert prefill_groups([10, 5000, 10], 4096) == [range(0, 1), range(1, 2), range(2, 3)]  # the long one alone
    assert prefill_groups([40, 20, 20], 60) == [range(0, 1), range(1, 3)]


def test_row_bytes_is_what_each_decoder_row_holds(model: Qwen3TTSModel) -> None:
    """BatchedDecoder.row_bytes (max_streams auto sizes the decoder by it) counts each row's cache, CodePredictor
    cache, trailing text, code history and penalty set: exactly what the decoder allocates for them."""
    no_kernels = SimpleNamespace(batched_gemv_scratch_floats=lambda matrices: 0)
    dec = BatchedDecoder(
        model,
        no_kernels,
        ModelWeights.from_model(model),
        slots=3,
        max_seq=MAX_SEQ,  # type: ignore[arg-type]
        max_trailing=16,
        graphs=False,
        invariant=True,
    )
    held = sum(t.numel() * t.element_size() for t in (dec.cache, dec.cp_cache, dec.trailing, dec.history, dec.seen))
    assert dec.rows == 4 and held == 4 * BatchedDecoder.row_bytes(model.cfg, model.dtype, MAX_SEQ, 16)


def test_streams_for_memory_fits_half_the_free_memory_less_the_reserve() -> None:
    from wyoming_qwen3tts.backends.kernels.scheduler import WORK_RESERVE_BYTES, streams_for_memory

    gib = 1 << 30
    row = gib // 4  # ~ the 1.7B's row at 2,048 frames (bf16)
    assert WORK_RESERVE_BYTES == 2 * gib
    assert streams_for_memory(120 * gib, row)[0] == 64  # an H200: 240 rows fit in 60 GiB, capped at 64
    assert streams_for_memory(27 * gib, row)[0] == 32  # an R9700 (32 GB) after the 1.7B: 54 rows, a bucket of 32
    assert streams_for_memory(20 * gib, row)[0] == 32  # 10 GiB: 40 rows
    assert streams_for_memory(15 * gib, row)[0] == 16  # 7.5 GiB: 30 rows, a bucket of 16
    assert streams_for_memory(6 * gib, row)[0] == 8  # min(6 - 2, 3) GiB: 12 rows fit, a bucket of 8
    assert streams_for_memory(int(2.5 * gib), row)[0] == 2  # 0.5 GiB: two rows
    assert streams_for_memory(gib, row)[0] == 1  # less than the reserve: one stream (the batch-1 backend)
    streams, why = streams_for_memory(6 * gib, row)
    assert "12 stream(s) of 0.25 GiB fit in 3.0 GiB" in why and "6.0 GiB free" in why
