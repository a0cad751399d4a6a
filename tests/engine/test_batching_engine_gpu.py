"""The engine on the batching backend (max_streams > 1: continuous batching through the scheduler
thread, backends/kernels/scheduler.py): requests run side by side from several threads, joining at
different times, and each gets the codes it gets alone; a cancelled request frees its slot and
changes no other's codes; the codes match the torch engine's (greedy, float32). GPU only."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from gpu_engine import cuda_engine, text_request

from wyoming_qwen3tts.backends.kernels.options import KernelOptions
from wyoming_qwen3tts.decode_counters import DECODE
from wyoming_qwen3tts.engine import Engine, SamplingParams, SynthesisRequest
from wyoming_qwen3tts.errors import SynthesisCancelled

pytestmark = pytest.mark.gpu


def _concurrently(engine: Engine, requests: list[SynthesisRequest], delays: list[float]) -> list[np.ndarray]:
    out: list[np.ndarray | BaseException] = [None] * len(requests)  # type: ignore[list-item]

    def run(i: int) -> None:
        time.sleep(delays[i])
        try:
            out[i] = engine.synthesize_all(requests[i])[1]
        except BaseException as err:
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("sampled", [False, True])
def test_batched_requests_equal_their_codes_alone(tiny_checkpoint, sampled: bool) -> None:
    """Four requests from four threads, joining 0-60 ms apart: each one's codes (greedy, or sampled
    with its seed) are the codes it gets alone on the same engine; greedy also the torch engine's.
    Greedy with the default lone steps (a request alone decodes on the batch-1 frame's kernels, which
    round differently: float32 greedy codes still agree); sampled with batch_invariant, where a stream's
    codes cannot depend on its batch-mates at all (every step batched, rows independent)."""
    base = SamplingParams() if sampled else SamplingParams.greedy()
    sampling = replace(base, suppress_eos=True)
    frames = [30, 20, 48, 12]
    engine = cuda_engine(tiny_checkpoint, 4, batch_invariant=sampled)
    requests = [text_request(i, sampling, frames[i]) for i in range(4)]
    alone = [engine.synthesize_all(r)[1] for r in requests]
    together = _concurrently(engine, requests, [0.0, 0.01, 0.06, 0.03])
    for i in range(4):
        assert alone[i].shape == (frames[i], 16)
        assert np.array_equal(together[i], alone[i]), f"request {i}: codes changed next to its batch-mates"
    assert engine.backend.active() == 0 and engine.backend.queued() == 0
    lone_steps = engine.backend.decoder.lone_steps
    assert lone_steps == 0 if sampled else lone_steps >= sum(frames), lone_steps  # alone: every frame lone
    if not sampled:
        torch_engine = cuda_engine(tiny_checkpoint, 1, backend="torch")
        for i in range(4):
            assert np.array_equal(torch_engine.synthesize_all(requests[i])[1], alone[i]), f"request {i} vs torch"


def test_more_requests_than_streams_queue_and_cancel_frees_a_slot(tiny_checkpoint) -> None:
    """Six requests on two streams all complete with their own codes (the rest wait their turn); a
    request cancelled after its first chunk ends with SynthesisCancelled and its slot serves the next."""
    sampling = replace(SamplingParams.greedy(), suppress_eos=True)
    engine = cuda_engine(tiny_checkpoint, 2)
    requests = [text_request(i % 4, sampling, 16 + 2 * i) for i in range(6)]
    alone = [engine.synthesize_all(r)[1] for r in requests]
    cancel = threading.Event()
    gen = engine.synthesize(text_request(2, sampling, 250), cancel)
    next(gen)
    assert engine.backend.active() == 1
    cancel.set()
    with pytest.raises(SynthesisCancelled):
        for _ in gen:
            pass
    deadline = time.monotonic() + 0.5  # well before its 250 frames could have run
    while engine.backend.active() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine.backend.active() == 0, "the cancelled request still holds its slot"
    together = _concurrently(engine, requests, [0.0] * 6)
    for i in range(6):
        assert np.array_equal(together[i], alone[i]), f"request {i}"
    assert engine.backend.active() == 0 and engine.backend.queued() == 0


def test_a_new_streams_first_audio_runs_before_the_next_step(tiny_checkpoint) -> None:
    """first_audio_hold (the default): the step after a lone request's first group waits on the GPU for the codec
    call that decodes it (the scheduler's stream waits on that call's event), and on no later call; off, no step
    waits on a codec call. The codes are the same either way. After the engine's warm-up, as in the server."""
    sampling = replace(SamplingParams.greedy(), suppress_eos=True)
    got = {}
    for hold in (True, False):
        engine = cuda_engine(tiny_checkpoint, 4, kernels=KernelOptions(first_audio_hold=hold))
        # As the server starts: every codec call shape met once, so no first call takes longer than the scheduler
        # waits for it to be queued (FIRST_AUDIO_HOLD_S; a shape's first call costs ~200 ms).
        engine.warm_up()
        worker = engine._codec_worker
        assert worker is not None
        calls: list[list[object]] = []  # each codec call's event, per stream in it
        launch = worker._launch

        def recording_launch(streams, launch=launch, calls=calls):  # type: ignore[no-untyped-def]
            launch(streams)
            calls.append([s.call_done for s in streams])

        worker._launch = recording_launch  # type: ignore[method-assign]
        waited: list[object] = []
        stream = engine.backend.stream
        wait_event = stream.wait_event

        def recording_wait(event, wait_event=wait_event, waited=waited):  # type: ignore[no-untyped-def]
            waited.append(event)
            return wait_event(event)

        stream.wait_event = recording_wait  # type: ignore[method-assign]
        got[hold] = []
        for i in range(3):  # one request at a time: each is a new stream alone
            calls.clear()
            waited.clear()
            got[hold].append(engine.synthesize_all(text_request(i, sampling, 24))[1])
            assert len(calls) >= 3 and all(len(c) == 1 for c in calls), calls  # groups of 2, 4, 8, 8, 2 frames
            first, later = calls[0][0], [c[0] for c in calls[1:]]
            assert first is not None
            assert any(e is first for e in waited) == hold, f"request {i}, hold {hold}"
            assert not any(e is c for c in later for e in waited), f"request {i}: a later call was waited for"
    for i in range(3):
        assert np.array_equal(got[True][i], got[False][i]), f"request {i}: codes changed with the hold"


def test_gathered_arrivals_share_one_admission_and_keep_their_codes(tiny_checkpoint) -> None:
    """admit_gather_ms: four requests whose prompts are built at once, then 20 ms apart, are admitted in one
    admission (their sessions' admitted_at is one time) and each keeps the codes it gets alone; a lone request is
    not held by the long gather (nothing else is being built)."""
    sampling = replace(SamplingParams.greedy(), suppress_eos=True)
    engine = cuda_engine(tiny_checkpoint, 4, kernels=KernelOptions(admit_gather_ms=1000))  # the longest allowed
    requests = [text_request(i, sampling, 10 + 3 * i) for i in range(4)]
    alone = []
    for r in requests:
        started = time.monotonic()
        alone.append(engine.synthesize_all(r)[1])
        assert time.monotonic() - started < 0.9, "a lone request waited for the gather"
    sessions = []
    start = engine.backend.start

    def recording_start(*args, **kwargs):  # type: ignore[no-untyped-def]
        session = start(*args, **kwargs)
        sessions.append(session)
        return session

    engine.backend.start = recording_start  # type: ignore[method-assign]
    barrier = threading.Barrier(len(requests), timeout=30)
    prepare = engine._prepare

    def meeting(request, marks=None):  # type: ignore[no-untyped-def]
        time.sleep(0.02 * barrier.wait())
        return prepare(request, marks)

    engine._prepare = meeting  # type: ignore[method-assign]
    together = _concurrently(engine, requests, [0.0] * len(requests))
    assert len({s.admitted_at for s in sessions}) == 1, [s.admitted_at for s in sessions]
    for i in range(len(requests)):
        assert np.array_equal(together[i], alone[i]), f"request {i}"
    assert engine.backend.arrivals.expected == 0
    assert engine.backend.active() == 0 and engine.backend.queued() == 0


def test_the_scheduler_counts_its_steps_frames_and_admissions(tiny_checkpoint) -> None:
    """/metrics' decode counters (decode_counters.py) on the real scheduler: every stream admitted once, every frame
    read back once, as many steps as the longest stream needs at least and no more than one per frame."""
    sampling = replace(SamplingParams.greedy(), suppress_eos=True)
    engine = cuda_engine(tiny_checkpoint, 4)
    frames = [12, 20, 7]
    before = DECODE.snapshot()
    _concurrently(engine, [text_request(i, sampling, frames[i]) for i in range(3)], [0.0, 0.0, 0.01])
    assert DECODE.admitted - before["admitted"] == 3
    assert 1 <= DECODE.admissions - before["admissions"] <= 3
    assert DECODE.step_frames - before["step_frames"] == sum(frames)
    assert max(frames) <= DECODE.steps - before["steps"] <= sum(frames)
    assert DECODE.step_wait_s >= before["step_wait_s"]
