"""CodecSlots (many codec streams in one call) against CodecStream (one stream a call), on the CPU.

Streams at different positions (before and past the 72-position attention window), joining late, leaving early,
starting from a decoded context, in calls of different subsets and group lengths: every stream's audio equals what
its own CodecStream decodes from the same codes, in float32 to F32_BOUND (batched kernels round differently, nothing
else differs) and in bf16 to BF16_MAX / BF16_RMS.  The state costs a constant number of launches per call.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from codec_slots_check import BF16_MAX, BF16_RMS, F32_BOUND, SlotsCheck, random_decoder
from torch.utils._python_dispatch import TorchDispatchMode

from wyoming_qwen3tts.model.codec import CodecDecoder
from wyoming_qwen3tts.model.codec_slots import CodecSlots

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def decoder() -> CodecDecoder:
    return random_decoder()


def test_streams_at_different_positions_decode_as_alone(decoder):
    """Five streams with histories of 0, 1, 30, 71 and 150 frames (around the 71 cached positions), then decoded
    together in calls of 1, 2, 4, 8, 12 and 3 frames."""
    check = SlotsCheck(decoder, CodecSlots(decoder, 8))
    histories = {"a": [], "b": [1], "c": [2, 4, 8, 12, 4], "d": [30, 41], "e": [12] * 12 + [6]}
    for name, groups in histories.items():
        check.open(name)
        for n in groups:
            check.call([name], n)
    for n in (1, 2, 4, 8, 12, 3):
        check.call(list(histories), n)
    for name in histories:
        assert check.worst(name) <= F32_BOUND["tiny"], name


def test_random_schedule_with_joins_and_leaves(decoder):
    """Calls of random subsets and lengths; streams join late, leave early, and their slots serve new streams."""
    rng = np.random.default_rng(5)
    check = SlotsCheck(decoder, CodecSlots(decoder, 3), seed=6)
    live: list[str] = []
    finished: list[str] = []
    for step in range(40):
        if len(live) < 5 and (not live or rng.random() < 0.25):
            live.append(f"s{step}")
            check.open(live[-1])
        elif len(live) > 1 and rng.random() < 0.1:
            gone = live.pop(int(rng.integers(len(live))))
            check.close(gone)
            finished.append(gone)
        names = [x for x in live if rng.random() < 0.7] or live[:1]
        check.call(names, int(rng.choice([1, 2, 4, 8, 12, 5])))
    assert len(finished) >= 2 and check.slots.capacity > 3  # slots were reused, and the state grew
    for name in check.got:
        assert check.worst(name) <= F32_BOUND["tiny"], name


def test_a_reused_slot_starts_fresh(decoder):
    check = SlotsCheck(decoder, CodecSlots(decoder, 2))
    check.open("a")
    check.open("b")
    check.call(["a", "b"], 12)
    check.call(["a", "b"], 12)
    reused = check.slot["b"]
    check.close("b")
    check.open("c")
    assert check.slot["c"] == reused
    check.call(["c", "a"], 4)
    check.call(["a", "c"], 8)
    for name in "abc":
        assert check.worst(name) <= F32_BOUND["tiny"], name


@pytest.mark.parametrize("context", [20, 100])
def test_open_from_a_decoded_context(decoder, context):
    """A cloned voice's codec context: a slot opened from a stream that decoded it (fewer and more frames than the
    window) continues as that stream's fork does."""
    base = decoder.new_stream(torch.from_numpy(np.random.default_rng(context).integers(0, 2048, (context, 16))))
    check = SlotsCheck(decoder, CodecSlots(decoder, 2))
    check.open("ctx", start=base)
    check.open("fresh")
    assert check.slots.frames[check.slot["ctx"]] == context
    check.call(["ctx", "fresh"], 2)
    check.call(["fresh", "ctx"], 12)
    for name in ("ctx", "fresh"):
        assert check.worst(name) <= F32_BOUND["tiny"], name


def test_bf16_rows_match_their_streams():
    dec = random_decoder(torch.bfloat16)
    check = SlotsCheck(dec, CodecSlots(dec, 4), seed=9)
    for name, history in (("a", 0), ("b", 3), ("c", 80)):
        check.open(name)
        if history:
            check.call([name], history)
    for n in (2, 4, 12):
        check.call(["a", "b", "c"], n)
    for name in "abc":
        assert check.worst(name) <= BF16_MAX and check.rms(name) <= BF16_RMS, name


def test_a_failed_call_leaves_its_slots_unchanged(decoder):
    """Codes out of range fail the call; the slots then decode as if it never happened (the worker retries the
    streams of a failed call one by one on this promise)."""
    check = SlotsCheck(decoder, CodecSlots(decoder, 2))
    check.open("a")
    check.open("b")
    check.call(["a", "b"], 4)
    bad = np.full((2, 3, 16), 5000)
    with pytest.raises(IndexError):
        check.slots.decode([check.slot["a"], check.slot["b"]], bad)
    check.call(["a", "b"], 4)
    for name in "ab":
        assert check.worst(name) <= F32_BOUND["tiny"], name


def test_bad_shapes(decoder):
    slots = CodecSlots(decoder, 2)
    a, b = slots.open(), slots.open()
    with pytest.raises(ValueError, match="distinct"):
        slots.decode([a, a], np.zeros((2, 1, 16), dtype=np.int64))
    with pytest.raises(ValueError):
        slots.decode([a, b], np.zeros((2, 1, 8), dtype=np.int64))
    with pytest.raises(ValueError):
        slots.decode([a], np.zeros((2, 1, 16), dtype=np.int64))
    assert slots.decode([a, b], np.zeros((2, 0, 16), dtype=np.int64)).shape == (2, 0)


class _Launches(TorchDispatchMode):
    """Counts the ops that compute (a kernel each, roughly): not views, nor a to() that returns its input."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliased = (
            func.is_view
            and isinstance(out, torch.Tensor)
            and isinstance(args[0], torch.Tensor)
            and (out.untyped_storage().data_ptr() == args[0].untyped_storage().data_ptr())
        )
        self.count += not aliased
        return out


def launches(fn) -> int:
    with _Launches() as mode:
        fn()
    return mode.count


def test_launches_per_call_do_not_grow_with_the_batch(decoder):
    """Gathering and scattering the rows costs two launches whatever B; a batched call launches about what one
    stream's call does (the tiny codec: 2 transformer layers; the full one has 8)."""
    rng = np.random.default_rng(0)
    stream = decoder.new_stream(torch.from_numpy(rng.integers(0, 2048, (80, 16))))
    one = launches(lambda: stream.decode(torch.from_numpy(rng.integers(0, 2048, (12, 16)))))
    counts = {}
    for b in (1, 4, 16):
        slots = CodecSlots(decoder, 16)
        ids = [slots.open() for _ in range(b)]
        slots.decode(ids, rng.integers(0, 2048, (b, 80, 16)))
        counts[b] = launches(lambda: slots.decode(ids, rng.integers(0, 2048, (b, 12, 16))))  # noqa: B023
    assert counts[1] == counts[4] == counts[16], counts
    assert one <= counts[1] <= one + 16, (one, counts)


def test_calls_run_at_padded_batch_sizes(decoder):
    """A call of b streams computes next-power-of-two rows (copies of its first stream), so the GPU meets few
    shapes; only the b real rows come back and only their slots move on."""
    from wyoming_qwen3tts.model.codec_slots import padded_rows

    assert [padded_rows(b) for b in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    check = SlotsCheck(decoder, CodecSlots(decoder, 8), seed=4)
    for name in "abcde":
        check.open(name)
    check.call(["a", "b", "c", "d", "e"], 3)  # 8 rows
    check.call(["c", "e", "a"], 5)  # 4 rows: c's copy rides along; b and d are not in the call
    check.call(["b", "d"], 2)
    assert [check.slots.frames[check.slot[x]] for x in "abcde"] == [8, 5, 8, 5, 8]
    for name in "abcde":
        assert check.worst(name) <= F32_BOUND["tiny"], name


def test_warm_up_meets_every_shape_and_leaves_the_slots_as_they_were(decoder):
    check = SlotsCheck(decoder, CodecSlots(decoder, 2), seed=8)
    check.open("a")
    check.call(["a"], 12)
    shapes = []
    decode = check.slots.decode
    check.slots.decode = lambda slots, codes: shapes.append(codes.shape[:2]) or decode(slots, codes)  # type: ignore[method-assign]
    assert check.slots.warm_up([2, 4, 2], most_rows=5, capture=True) == 8
    check.slots.decode = decode  # type: ignore[method-assign]
    # 8 rows from 5 streams (a call pads them): no more slots open than a call of most_rows streams takes.
    assert shapes == [(1, 2), (1, 4), (2, 2), (2, 4), (4, 2), (4, 4), (5, 2), (5, 4)]
    assert check.slots.graphs == 0  # capturing is for CUDA; the CPU runs every call eagerly
    assert check.slots.in_use() == 1
    check.call(["a"], 4)  # continues as if the warm-up never happened
    assert check.worst("a") <= F32_BOUND["tiny"]
