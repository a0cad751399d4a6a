"""CodecSlots and the codec worker on CUDA: batched rows against CodecStreams, float32 and bf16, tiny and full-size
random codecs. GPU only.

float32 runs with TF32 off (cuDNN and matmul), so the only differences left are the rounding of batched kernels
(bound F32_BOUND); bf16 rows against bf16 streams are held to BF16_MAX / BF16_RMS (tests/support/codec_slots_check.py
says why those sizes) and the measured differences are printed (pytest -s).  The worker test covers what the CPU tests
cannot: the pinned copies, the events and two calls in flight on the codec's own CUDA stream, six request threads
at once.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from codec_slots_check import BF16_MAX, BF16_RMS, F32_BOUND, SlotsCheck, random_decoder

from wyoming_qwen3tts.codec_worker import CodecWorker
from wyoming_qwen3tts.model.codec import int16_samples
from wyoming_qwen3tts.model.codec_slots import CodecSlots

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def no_tf32():
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


# How the codec's convs run: on cuDNN; every one that can as a GEMM (CodecDecoder.use_gemm_convs(1)); each input
# shape on the path timed faster (use_gemm_convs(1, timed=True), the kernel backend's default).
CONV_PATHS = {"convs": (0, False), "gemm-convs": (1, False), "timed-convs": (1, True)}


@pytest.mark.parametrize("paths", CONV_PATHS)
@pytest.mark.parametrize("size", ["tiny", "1.7b"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_slots_equal_streams_on_cuda(size, dtype, paths):
    """Streams with histories of 0, 3, 30 and 150 frames, then calls of all of them and of subsets, with group
    lengths 1, 2, 4, 12 and 5; one stream leaves and a new one takes its slot; with each of CONV_PATHS (the GEMMs'
    BLAS kernels, and the timed paths, may differ with the call's rows)."""
    dec = random_decoder(dtype, size=size, device="cuda")
    min_channels, timed = CONV_PATHS[paths]
    assert bool(dec.use_gemm_convs(min_channels, timed=timed)) == bool(min_channels)
    check = SlotsCheck(dec, CodecSlots(dec, 4), seed=11)
    for name, history in (("a", 0), ("b", 3), ("c", 30), ("d", 150)):
        check.open(name)
        if history:
            check.call([name], history)
    for n in (1, 2, 4, 12):
        check.call(["a", "b", "c", "d"], n)
    check.call(["d", "b"], 5)
    check.close("c")
    check.open("e")
    for n in (2, 4, 12):
        check.call(["e", "a", "d"], n)
    worst = {name: check.worst(name) for name in "abcde"}
    rms = {name: check.rms(name) for name in "abcde"}
    print(f"{size} {dtype}: |slots - stream| per stream, max {worst}, rms {rms}")
    if dtype == torch.float32:
        assert max(worst.values()) <= F32_BOUND[size], worst
    else:
        assert max(worst.values()) <= BF16_MAX and max(rms.values()) <= BF16_RMS, (worst, rms)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_gemm_convs_decode_as_cudnn_convs(dtype):
    """The full-size codec with its convs as GEMMs (use_gemm_convs(1): every one it can take) against cuDNN's convs,
    a stream of groups 12, 12, 1 after 80 frames: float32 (TF32 off) within F32_BOUND, bf16 within BF16_MAX /
    BF16_RMS (the sums run in another order; bf16 adds the bias after rounding)."""
    dec = random_decoder(dtype, size="1.7b", device="cuda")
    codes = torch.from_numpy(np.random.default_rng(9).integers(0, 2048, (105, 16)))

    def decode() -> torch.Tensor:
        stream = dec.new_stream(codes[:80])
        return torch.cat([stream.decode(codes[a:b]) for a, b in ((80, 92), (92, 104), (104, 105))])

    want = decode()
    assert len(dec.use_gemm_convs(1)) == 14  # pre_conv, conv_in and the four blocks' three dilated convs
    got = decode()
    diff = (got - want).abs()
    rms = diff.pow(2).mean().sqrt().item()
    print(f"{dtype}: GEMM convs against cuDNN's, max {diff.max().item():.3g}, rms {rms:.3g}")
    assert not torch.equal(got, want)
    if dtype == torch.float32:
        assert diff.max().item() <= F32_BOUND["1.7b"]
    else:
        assert diff.max().item() <= BF16_MAX and rms <= BF16_RMS


def test_timed_convs_time_each_shape_once_on_the_gpu():
    """use_gemm_convs(1, timed=True) on the full-size bf16 codec: a call of 16 rows by 12 frames times each
    candidate conv at its shape (14) and the next call of that shape times nothing. Which path wins depends on the
    card and the libraries, so the count is printed, not held (H100: cuDNN wins the narrow convs and loses the
    768-channel ones of dilation 3 and 9 at 16 rows, 10x)."""
    dec = random_decoder(torch.bfloat16, size="1.7b", device="cuda")
    dec.use_gemm_convs(1, timed=True)
    slots = CodecSlots(dec, 16)
    ids = [slots.open() for _ in range(16)]
    codes = np.random.default_rng(4).integers(0, 2048, (16, 12, 16))
    slots.decode(ids, codes)
    as_gemm, timed = dec.gemm_conv_shapes()
    print(f"16 rows x 12 frames: {as_gemm} of {timed} conv shapes as GEMMs")
    assert timed == 14
    slots.decode(ids, codes)
    assert dec.gemm_conv_shapes() == (as_gemm, timed)


@pytest.mark.parametrize("paths", CONV_PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_captured_calls_equal_eager_calls_bit_for_bit(dtype, paths):
    """CodecSlots with its call shapes captured (warm_up(capture=True)) against one without, on one decoder and the
    same calls: every waveform and every open slot's state equal bit for bit through calls at captured shapes
    (2, 4 and 12 frames, 1-4 rows padded to 1, 2 or 4), one at an uncaptured length (5 frames: eager), a slot
    reused, and the state grown (which drops the graphs: the calls go on eagerly and still agree)."""
    dec = random_decoder(dtype, size="1.7b", device="cuda")
    min_channels, timed = CONV_PATHS[paths]
    dec.use_gemm_convs(min_channels, timed=timed)
    eager, graphed = CodecSlots(dec, 4), CodecSlots(dec, 4)
    assert graphed.warm_up([2, 4, 12], most_rows=4, capture=True) == 9
    assert graphed.graphs == 9 and eager.graphs == 0
    rng = np.random.default_rng(5)
    slot: dict[str, tuple[int, int]] = {}

    def call(names: str, n: int) -> None:
        codes = rng.integers(0, 2048, (len(names), n, 16))
        want = eager.decode([slot[x][0] for x in names], codes)
        got = graphed.decode([slot[x][1] for x in names], codes)
        assert got.shape == want.shape == (len(names), n * 1920)
        assert torch.equal(got, want), f"{names} x {n}: max |diff| {(got - want).abs().max().item()}"

    for name in "abc":
        slot[name] = (eager.open(), graphed.open())
    for names, n in (("abc", 2), ("a", 4), ("cb", 12), ("abc", 5), ("b", 2), ("bca", 12)):
        call(names, n)
    for s_e, s_g in (slot.pop("a"),):
        eager.close(s_e)
        graphed.close(s_g)
    slot["d"] = (eager.open(), graphed.open())
    call("dc", 4)
    call("bdc", 12)
    for name in "ef":  # the fifth open stream grows the state
        slot[name] = (eager.open(), graphed.open())
    assert graphed.graphs == 0 and graphed.capacity == 8
    call("bcdef", 4)
    torch.cuda.synchronize()
    for name, (s_e, s_g) in slot.items():
        assert torch.equal(eager.state[s_e], graphed.state[s_g]), name
        assert eager.frames[s_e] == graphed.frames[s_g], name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_worker_on_cuda_equals_streams(dtype):
    """Six threads, each a stream of groups 2, 4, 8, 8, 5 through one worker on its own CUDA stream: each gets the
    PCM its own CodecStream gives (float32: within F32_BOUND, a step or two; bf16: BF16_MAX / BF16_RMS), and calls
    batched."""
    dec = random_decoder(dtype, size="1.7b", device="cuda")
    worker = CodecWorker(dec, torch.cuda.Stream(), 8)
    calls: list[int] = []
    decode = worker.slots.decode

    def recording(ids, codes):
        calls.append(len(ids))
        return decode(ids, codes)

    assert worker.warm_up([2, 4, 8]) == 12  # captured: the groups of 2, 4 and 8 replay graphs, the 5s run eagerly
    assert worker.slots.graphs == 12
    worker.slots.decode = recording  # type: ignore[method-assign]
    groups = [2, 4, 8, 8, 5]
    codes = np.random.default_rng(3).integers(0, 2048, (6, sum(groups), 16))
    out: list[list[bytes] | BaseException] = [[] for _ in range(6)]

    def run(i: int) -> None:
        stream = worker.open(dec.new_stream())
        try:
            start = 0
            for n in groups:
                out[i].append(stream.decode(codes[i, start : start + n]))  # type: ignore[union-attr]
                start += n
        except BaseException as err:
            out[i] = err
        finally:
            stream.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    diffs = []
    for i in range(6):
        assert not isinstance(out[i], BaseException), out[i]
        alone = dec.new_stream()
        start = 0
        for n, pcm in zip(groups, out[i]):  # type: ignore[arg-type]
            with torch.inference_mode():
                want = int16_samples(alone.decode(torch.from_numpy(codes[i, start : start + n]).cuda())).cpu().numpy()
            got = np.frombuffer(pcm, dtype="<i2")
            assert got.shape == want.shape
            diffs.append(got.astype(np.float64) - want.astype(np.float64))
            start += n
    diff = np.concatenate(diffs)
    worst, rms = np.abs(diff).max(), np.sqrt((diff**2).mean())
    print(f"worker {dtype}: calls of {calls} streams; PCM difference max {worst} steps, rms {rms:.2f}")
    if dtype == torch.float32:
        assert worst <= F32_BOUND["1.7b"] * 32767 + 1
    else:
        assert worst <= BF16_MAX * 32767 and rms <= BF16_RMS * 32767
    assert max(calls) >= 2
    assert worker.slots.graphs == 12  # six streams fit the eight slots: no growth dropped the graphs
    deadline = time.monotonic() + 5  # the slots go back on the worker thread
    while worker.slots.in_use() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.slots.in_use() == 0
