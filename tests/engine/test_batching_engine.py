"""The engine on a batching backend (concurrent, thread-safe sessions) and its codec worker, on the CPU.

A fake of BatchingBackend's contract (fake_batching.py: the real BatchedSession, a thread stepping every stream)
drives the engine; the codec worker (codec_worker.py) decodes every request's groups in batched calls.  Requests
from many threads at once each get the audio they get alone; a newcomer's first group is not held behind larger
groups; cancelled and abandoned requests free their slots while the others go on; a group the codec cannot decode
fails its own request only, and every request ends.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fake_batching import FakeBatchingBackend

from wyoming_qwen3tts.backends.kernels.scheduler import Arrivals, BatchedSession, gather_wait_s
from wyoming_qwen3tts.codec_worker import CodecWorker
from wyoming_qwen3tts.decode_counters import DECODE
from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest, pcm16
from wyoming_qwen3tts.errors import SynthesisCancelled, UnknownSpeakerError
from wyoming_qwen3tts.model.codec_slots import padded_rows

OPTIONS = EngineOptions(device="cpu", dtype="float32", first_chunk_frames=2, chunk_frames=8, max_text_chars=200)
FRAMES = [30, 17, 45, 9, 24, 3]  # per request: different lengths, so different last groups


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def loaded(tiny_checkpoint) -> Engine:
    return Engine.from_pretrained(str(tiny_checkpoint), OPTIONS)


def _engine(loaded: Engine, **backend) -> Engine:
    """An engine with the loaded model's parts on a fresh fake batching backend (and so its own codec worker)."""
    engine = Engine(
        loaded.checkpoint, loaded.model, loaded.codec, loaded.tokenizer, FakeBatchingBackend(**backend), OPTIONS
    )
    assert isinstance(engine._codec_worker, CodecWorker)
    return engine


def _request(i: int, frames: int) -> SynthesisRequest:
    return SynthesisRequest(
        text=f"Request number {i} speaks.",
        speaker="ryan",
        sampling=SamplingParams.greedy(),
        seed=100 + i,
        max_frames=frames,
    )


def _chunks(engine: Engine, request: SynthesisRequest, cancel: threading.Event | None = None):
    return [(c.pcm, c.codes) for c in engine.synthesize(request, cancel)]


def _at_once(fns: list, delays: list[float], timeout: float = 120) -> list:  # type: ignore[type-arg]
    """Run each fn on its own thread after its delay; their results (or exceptions). Every thread must end."""
    out: list = [None] * len(fns)  # type: ignore[type-arg]

    def run(i: int) -> None:
        time.sleep(delays[i])
        try:
            out[i] = fns[i]()
        except BaseException as err:
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a request never ended"
    return out


def _assert_same_audio(got: list, want: list, what: str) -> None:  # type: ignore[type-arg]
    """Same chunks, same codes, the same PCM up to one 16-bit step (rows of a batched call round their last float
    bits differently from a call of one, and a stream from one pass: ~1e-6, which can flip a sample's rounding)."""
    assert [len(c) for _, c in got] == [len(c) for _, c in want], what
    for (pcm, codes), (pcm_alone, codes_alone) in zip(got, want):
        assert np.array_equal(codes, codes_alone), what
        a = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
        b = np.frombuffer(pcm_alone, dtype="<i2").astype(np.int32)
        assert a.shape == b.shape and np.abs(a - b).max() <= 1, what


def _all_freed(engine: Engine) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if engine.backend.active() == 0 and engine._codec_worker.slots.in_use() == 0:  # type: ignore[union-attr]
            return True
        time.sleep(0.01)
    return False


def _record_calls(engine: Engine) -> list[tuple[int, int]]:
    """(streams, frames) of every batched codec call from now on."""
    slots = engine._codec_worker.slots  # type: ignore[union-attr]
    calls: list[tuple[int, int]] = []
    decode = slots.decode

    def recording(ids, codes):
        calls.append((len(ids), codes.shape[1]))
        return decode(ids, codes)

    slots.decode = recording  # type: ignore[method-assign]
    return calls


def test_requests_at_once_get_the_audio_they_get_alone(loaded):
    """Six requests of different lengths from six threads, joining 0-40 ms apart on four decode slots (two wait for
    a slot): each gets the chunks, codes and PCM it gets alone, and the worker did decode groups together."""
    engine = _engine(loaded, max_streams=4)
    requests = [_request(i, n) for i, n in enumerate(FRAMES)]
    alone = [_chunks(engine, r) for r in requests]
    for chunks in alone:  # alone, the worker's audio is the one-pass decode of the codes
        codes = np.concatenate([c for _, c in chunks])
        one_pass = pcm16(engine.codec.decode(torch.from_numpy(codes)))
        _assert_same_audio([(b"".join(p for p, _ in chunks), codes)], [(one_pass, codes)], "one pass")
    calls = _record_calls(engine)
    before = DECODE.snapshot()
    together = _at_once([lambda r=r: _chunks(engine, r) for r in requests], [0.0, 0.005, 0.02, 0.0, 0.04, 0.01])
    for i in range(len(requests)):
        assert not isinstance(together[i], BaseException), together[i]
        _assert_same_audio(together[i], alone[i], f"request {i}")
    assert max(b for b, _ in calls) >= 2, f"the worker never batched: {calls}"
    # /metrics' codec counters (decode_counters.py): every call and every frame it turned into audio, once.
    assert DECODE.codec_calls - before["codec_calls"] == len(calls)
    assert DECODE.codec_frames - before["codec_frames"] == sum(FRAMES) == sum(b * n for b, n in calls)
    assert DECODE.codec_wait_s >= before["codec_wait_s"]
    assert _all_freed(engine)


class _Gate:
    """Holds the worker's first call until `waiting` streams wait behind it, recording every call's (streams,
    frames): the next calls then show the worker's choice among them."""

    def __init__(self, worker: CodecWorker, waiting: int) -> None:
        self.calls: list[tuple[int, int]] = []
        entered, release = threading.Event(), threading.Event()
        decode = worker.slots.decode

        def gated(ids, codes):
            self.calls.append((len(ids), codes.shape[1]))
            entered.set()
            release.wait(30)
            return decode(ids, codes)

        def opener() -> None:
            entered.wait(30)
            deadline = time.monotonic() + 30
            while len(worker.waiting) < waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            release.set()

        worker.slots.decode = gated  # type: ignore[method-assign]
        threading.Thread(target=opener, daemon=True).start()


def test_a_first_group_goes_before_larger_groups(loaded):
    """Three streams' 8-frame groups wait, then a newcomer's 2-frame group: the newcomer's call comes first."""
    worker = CodecWorker(loaded.codec, None, 4)
    gate = _Gate(worker, waiting=4)
    codes = np.random.default_rng(0).integers(0, 2048, (5, 8, 16))
    streams = [worker.open(loaded.codec.new_stream()) for _ in range(5)]
    sizes = [1, 8, 8, 8, 2]
    out = _at_once([lambda i=i: streams[i].decode(codes[i, : sizes[i]]) for i in range(5)], [0.0, 0.2, 0.2, 0.2, 0.3])
    assert gate.calls == [(1, 1), (1, 2), (3, 8)]
    for i in range(5):
        assert isinstance(out[i], bytes) and len(out[i]) == sizes[i] * 1920 * 2


def test_rows_per_call_and_its_frame_bound(monkeypatch):
    """16 streams a call, more for short groups (rows x frames up to ROW_FRAMES); with CALL_FRAMES, rows x frames at
    most that many (at least one row): what the worker's calls and its warm-up shapes take."""
    import wyoming_qwen3tts.codec_worker as cw

    monkeypatch.setattr(cw, "ROW_FRAMES", 64)
    monkeypatch.setattr(cw, "CALL_FRAMES", 0)
    assert [cw.rows_per_call(n) for n in (0, 1, 2, 4, 8, 12)] == [64, 64, 32, 16, 16, 16]
    monkeypatch.setattr(cw, "CALL_FRAMES", 48)
    assert [cw.rows_per_call(n) for n in (1, 2, 4, 8, 12, 64)] == [48, 24, 12, 6, 4, 1]


def test_later_groups_gather_into_one_call_and_first_groups_do_not_wait(loaded, monkeypatch):
    """With COALESCE_S 0.4 s and four streams open: an 8-frame group and another 0.15 s behind it go in one call when
    the first has waited 0.4 s (two rows fill no call); a lone 8-frame group goes alone after 0.4 s; a 2-frame group
    (a stream's first) goes at once, and so does the group of the only open stream (also when the others close while
    it is held), or of a full call."""
    import wyoming_qwen3tts.codec_worker as cw

    monkeypatch.setattr(cw, "COALESCE_S", 0.4)
    worker = CodecWorker(loaded.codec, None, 4)
    calls: list[tuple[int, int, float]] = []
    decode = worker.slots.decode
    t0 = time.monotonic()

    def recorded(ids, codes):
        calls.append((len(ids), codes.shape[1], time.monotonic() - t0))
        return decode(ids, codes)

    worker.slots.decode = recorded  # type: ignore[method-assign]
    codes = np.random.default_rng(3).integers(0, 2048, (4, 8, 16))
    streams = [worker.open(loaded.codec.new_stream()) for _ in range(4)]
    out = _at_once([lambda i=i: streams[i].decode(codes[i]) for i in range(2)], [0.0, 0.15])
    assert [c[:2] for c in calls] == [(2, 8)] and 0.4 <= calls[0][2] < 0.55, calls
    calls.clear()
    t0 = time.monotonic()
    streams[2].decode(codes[2, :2])
    assert [c[:2] for c in calls] == [(1, 2)] and calls[0][2] < 0.2, calls
    calls.clear()
    t0 = time.monotonic()
    streams[3].decode(codes[3])
    assert [c[:2] for c in calls] == [(1, 8)] and calls[0][2] >= 0.4, calls
    for i in range(2):
        assert isinstance(out[i], bytes) and len(out[i]) == 8 * 1920 * 2
    # A held group goes when the streams that could have joined it close: it then holds every open stream.
    calls.clear()
    t0 = time.monotonic()
    _at_once([lambda: streams[0].decode(codes[0]), lambda: [streams[i].close() for i in (1, 2, 3)]], [0.0, 0.1])
    assert [c[:2] for c in calls] == [(1, 8)] and 0.1 <= calls[0][2] < 0.3, calls
    # A group of the only open stream goes at once: nobody could join it.
    calls.clear()
    t0 = time.monotonic()
    streams[0].decode(codes[0])
    assert [c[:2] for c in calls] == [(1, 8)] and calls[0][2] < 0.2, calls
    streams[1:] = [worker.open(loaded.codec.new_stream()) for _ in range(3)]
    # A call that is full (rows_per_call rows: 2 here) goes as soon as its last group comes.
    monkeypatch.setattr(cw, "MAX_ROWS", 2)
    monkeypatch.setattr(cw, "ROW_FRAMES", 16)
    calls.clear()
    t0 = time.monotonic()
    _at_once([lambda i=i: streams[i].decode(codes[i]) for i in range(2)], [0.0, 0.15])
    assert [c[:2] for c in calls] == [(2, 8)] and 0.15 <= calls[0][2] < 0.3, calls


def test_a_bad_group_in_a_batched_call_fails_its_stream_only(loaded):
    """The call of a good and a bad group fails; the worker decodes each alone: the good stream gets its audio
    (as a stream alone decodes it), the bad one its error; both streams' slots go back when closed."""
    worker = CodecWorker(loaded.codec, None, 4)
    gate = _Gate(worker, waiting=2)
    codes = np.random.default_rng(1).integers(0, 2048, (2, 4, 16))
    codes[1, 2, 5] = 5000
    holder, good, bad = (worker.open(loaded.codec.new_stream()) for _ in range(3))
    out = _at_once(
        [lambda: holder.decode(codes[0, :1]), lambda: good.decode(codes[0]), lambda: bad.decode(codes[1])],
        [0.0, 0.2, 0.2],
    )
    assert gate.calls[:2] == [(1, 1), (2, 4)], gate.calls  # the two were tried together first
    assert isinstance(out[2], IndexError)
    want = np.frombuffer(pcm16(loaded.codec.decode(torch.from_numpy(codes[0]))), dtype="<i2").astype(np.int32)
    assert np.abs(np.frombuffer(out[1], dtype="<i2").astype(np.int32) - want).max() <= 1
    with pytest.raises(IndexError):  # the stream stays failed
        bad.decode(codes[0])
    for s in (holder, good, bad):
        s.close()
    deadline = time.monotonic() + 5
    while worker.slots.in_use() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.slots.in_use() == 0


def test_cancel_and_disconnect_free_everything_and_the_others_go_on(loaded):
    """One request cancelled after its first chunk, one abandoned after two (a client gone: its generator closed),
    two that run to the end: those two get their audio alone, and every decode and codec slot is free after."""
    engine = _engine(loaded, max_streams=4)
    requests = [_request(i, 60) for i in range(4)]
    alone = {i: _chunks(engine, requests[i]) for i in (2, 3)}
    cancel = threading.Event()

    def cancelled() -> str:
        chunks = engine.synthesize(requests[0], cancel)
        next(chunks)
        cancel.set()
        with pytest.raises(SynthesisCancelled):
            next(chunks)
        return "cancelled"

    def abandoned() -> str:
        chunks = engine.synthesize(requests[1])
        next(chunks)
        next(chunks)
        chunks.close()
        return "closed"

    out = _at_once(
        [cancelled, abandoned, lambda: _chunks(engine, requests[2]), lambda: _chunks(engine, requests[3])],
        [0.0, 0.0, 0.0, 0.01],
    )
    assert out[:2] == ["cancelled", "closed"], out[:2]
    for i in (2, 3):
        _assert_same_audio(out[i], alone[i], f"request {i}")
    assert _all_freed(engine)


def test_a_codec_error_fails_only_its_request(loaded):
    """A stream whose codes the codec cannot decode (from its 5th frame): its request ends with the error, the
    three beside it get their audio, every request ends, and the engine serves the next one."""
    engine = _engine(loaded, max_streams=4, bad_seed=102, bad_frame=5)
    requests = [_request(i, 30) for i in range(4)]
    alone = {i: _chunks(engine, requests[i]) for i in (0, 1, 3)}
    out = _at_once([lambda r=r: _chunks(engine, r) for r in requests], [0.0] * 4)
    assert isinstance(out[2], IndexError), out[2]
    for i in (0, 1, 3):
        _assert_same_audio(out[i], alone[i], f"request {i}")
    assert _all_freed(engine)
    _assert_same_audio(_chunks(engine, requests[0]), alone[0], "after the error")


def test_one_stream_backends_keep_the_codec_under_the_engine_lock(loaded):
    """The torch and batch-1 kernel backends (sessions not thread-safe) run no codec worker."""
    assert loaded._codec_worker is None


def test_a_request_needs_no_engine_lock_on_the_batching_backend(loaded):
    """A batching engine's request builds its prompt and starts its session without the engine's lock (a burst's
    requests do not wait for each other's prompts); the one-stream engine's still takes it."""
    engine = _engine(loaded)
    request = _request(0, 6)
    with engine._lock:  # held by "someone else" for the whole request
        done = threading.Event()
        thread = threading.Thread(target=lambda: (_chunks(engine, request), done.set()), daemon=True)
        thread.start()
        assert done.wait(60), "the batching engine's request waited for the engine lock"
    with loaded._lock:
        started = threading.Event()
        thread = threading.Thread(target=lambda: (loaded.prepare(request), started.set()), daemon=True)
        thread.start()
        assert not started.wait(0.5), "the one-stream engine built a prompt without its lock"
    assert started.wait(60)


def test_warm_up_runs_max_streams_requests_at_once(loaded):
    """On a batching backend the warm-up speaks max_streams requests together (the batched admission, the largest
    bucket and the codec worker's largest calls meet their first allocations there), long enough for the
    later, larger groups; on one stream it speaks one."""
    engine = _engine(loaded, max_streams=3)
    peak = 0
    seen = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not seen.is_set():
            peak = max(peak, engine.backend.active())
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        engine.warm_up()
    finally:
        seen.set()
        watcher.join()
    assert peak == 3


def test_warm_up_meets_every_codec_call_shape_first(loaded):
    """Before the warm-up's synthesis, the codec worker's thread decodes once at every padded batch size up to its
    slots (twice max_streams) and every group length of the first-to-largest ladder (2, 4, 8 here), so no request's call is the first
    at its shape (a first call costs ~200 ms more on a GPU); the warm-up's own requests then find them all."""
    engine = _engine(loaded, max_streams=3)
    slots = engine._codec_worker.slots
    calls: list[tuple[str, int, int]] = []
    decode = slots.decode

    def spy(ids, codes):
        calls.append((threading.current_thread().name, padded_rows(len(ids)), codes.shape[1]))
        return decode(ids, codes)

    slots.decode = spy
    engine.warm_up()
    # The worker holds twice the streams' slots (a request's slot may go back after the next one opens its own).
    assert slots.capacity == 6
    warmed = {(rows, n) for rows in (1, 2, 4, 8) for n in (2, 4, 8)}
    assert {(rows, n) for _, rows, n in calls[: len(warmed)]} == warmed
    assert {thread for thread, _, _ in calls} == {"qwen3tts-codec"}
    later = {(rows, n) for _, rows, n in calls[len(warmed) :]}
    assert later and later <= warmed, later - warmed
    deadline = time.monotonic() + 5  # the slots go back on the worker thread
    while slots.in_use() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slots.in_use() == 0


def test_the_scheduler_hands_a_waiting_requests_groups_to_the_codec(loaded):
    """A group a request's thread already waits for goes to the codec worker from the stepping thread, at the step
    that completed it (WorkerStream.submit), and the request's own decode then only waits: every group but those
    ready before the request asked for them, and the audio is the same as without the hand-off."""
    # Steps slow enough (20 ms) that the request's thread has taken each group's PCM and waits again before the next
    # group completes, whatever the CPU codec's speed on this machine (at 4 ms a step it sometimes had not).
    engine = _engine(loaded, step_s=0.02)
    request = _request(0, 30)
    submitted: list[tuple[str, int]] = []
    worker = engine._codec_worker
    assert worker is not None
    opened = []

    def open_recording(start):  # type: ignore[no-untyped-def]
        stream = worker.open(start)
        plain = stream.submit

        def recording(codes):  # type: ignore[no-untyped-def]
            submitted.append((threading.current_thread().name, len(codes)))
            plain(codes)

        stream.submit = recording  # type: ignore[method-assign]
        opened.append(stream)
        return stream

    engine._open_audio = open_recording  # type: ignore[assignment]
    got = _chunks(engine, request)
    assert len(opened) == 1
    groups = [len(c) for _, c in got]
    assert len(submitted) >= len(groups) - 1, (submitted, groups)  # the last, short group may be ready already
    assert {name for name, _ in submitted} == {"fake-batch"}
    assert [n for _, n in submitted] == groups[: len(submitted)]
    engine._open_audio = worker.open
    _assert_same_audio(_chunks(engine, request), got, "with the hand-off against again")
    assert _all_freed(engine)


def test_a_submitted_group_nobody_waits_for_is_dropped_with_its_stream(loaded):
    """A stream closed with a submitted group still queued (its request cancelled between the step and its decode)
    leaves the worker's queue and holds no slot; a closed stream's slot picked for a call comes back after it."""
    engine = _engine(loaded)
    worker = engine._codec_worker
    assert worker is not None
    with worker.cond:  # the worker cannot pick the group before the stream closes
        stream = worker.open(loaded.codec.new_stream())
        stream.submit(np.zeros((2, 16), dtype=np.int64))
        assert stream in worker.waiting
        stream.close()
        assert stream not in worker.waiting
    other = worker.open(loaded.codec.new_stream())
    assert len(other.decode(np.zeros((2, 16), dtype=np.int64))) == 2 * 2 * 1920
    other.close()
    late = worker.open(loaded.codec.new_stream())
    late.decode(np.zeros((1, 16), dtype=np.int64))
    late.closed = True  # as if close() came while its next call was being launched: the slot comes back after it
    late.decode(np.zeros((1, 16), dtype=np.int64))
    assert late.slot is None
    assert _all_freed(engine)


def test_only_a_streams_first_handed_group_is_reported_as_its_first_audio(loaded):
    """BatchedSession._wake_if_ready returns the sink when the group it just handed over is the stream's first (the
    scheduler then lets that group's codec call run before its next step), and None for every later group and when
    nothing was handed; WorkerStream.wait_launched says when the worker has queued the call (never on a timeout)."""
    lock = threading.RLock()
    session = BatchedSession(SimpleNamespace(lock=lock, eos_id=2150), None, None, 0, 100)  # type: ignore[arg-type]
    engine = _engine(loaded)
    worker = engine._codec_worker
    assert worker is not None
    handed: list[int] = []
    with worker.cond:  # nothing is decoded until this test lets go: only what _wake_if_ready did is seen
        stream = worker.open(loaded.codec.new_stream())
        plain = stream.submit
        stream.submit = lambda codes: (handed.append(len(codes)), plain(codes))  # type: ignore[method-assign]
        session.hand_groups_to(stream)
        with lock:
            session._want, session._waiting = 2, True
            session._push(np.arange(16))
            assert session._wake_if_ready() is None  # one frame of the two it waits for: nothing handed yet
            session._push(np.arange(16))
            assert session._wake_if_ready() is stream  # the first group: its first audio
            assert handed == [2]
        assert stream.wait_launched(0.01) is None  # the worker cannot queue it while the test holds its lock
    assert stream.decode(session.collect()) and stream.launched.is_set()
    assert stream.wait_launched(0.0) is None  # decoded on the CPU: there is no GPU event to wait for
    with lock:
        session._want, session._waiting = 1, True
        session._push(np.arange(16))
        assert session._wake_if_ready() is None  # handed, but not the first group
        assert handed == [2, 1]
    stream.decode(session.collect())
    stream.close()
    assert _all_freed(engine)


def test_gather_wait_s_waits_only_for_expected_prompts_that_fit():
    """Admission waits until gather_s after the oldest arrival, only while prompts are expected, something is queued
    and the queue leaves a free slot for them; never with gathering off."""
    assert gather_wait_s(0.008, expected=3, queued=1, free=8, oldest_queued_at=10.0, now=10.002) == pytest.approx(0.006)
    assert gather_wait_s(0.008, expected=3, queued=1, free=8, oldest_queued_at=10.0, now=10.009) == 0.0
    assert gather_wait_s(0.0, expected=3, queued=1, free=8, oldest_queued_at=10.0, now=10.0) == 0.0
    assert gather_wait_s(0.008, expected=0, queued=1, free=8, oldest_queued_at=10.0, now=10.0) == 0.0
    assert gather_wait_s(0.008, expected=3, queued=0, free=8, oldest_queued_at=10.0, now=10.0) == 0.0
    assert gather_wait_s(0.008, expected=3, queued=8, free=8, oldest_queued_at=10.0, now=10.0) == 0.0


def test_arrivals_count_each_thread_once_until_its_start_or_failure():
    """expect() counts a thread's coming prompt once; took() (its start) and forget() (its failure) each give it
    back once, on that thread only; forget() after took() changes nothing and wakes the scheduler's condition."""
    cond = threading.Condition()
    arrivals = Arrivals(cond)
    arrivals.expect()
    arrivals.expect()
    assert arrivals.expected == 1
    other = threading.Thread(target=arrivals.expect)
    other.start()
    other.join()
    assert arrivals.expected == 2
    with cond:
        arrivals.took()
    assert arrivals.expected == 1
    arrivals.forget()
    assert arrivals.expected == 1  # this thread's was taken; the other thread's is still coming
    gone = threading.Thread(target=arrivals.forget)  # a thread that expected nothing gives nothing back
    gone.start()
    gone.join()
    assert arrivals.expected == 1


def _prompts_meet(engine: Engine, n: int) -> None:
    """Every request's prompt is built only once n requests are building theirs (so all are expected at once), then
    20 ms apart: without gathering, each would be admitted at its own step boundary."""
    barrier = threading.Barrier(n, timeout=30)
    prepare = engine._prepare

    def meeting(request, marks=None):
        time.sleep(0.02 * barrier.wait())
        return prepare(request, marks)

    engine._prepare = meeting  # type: ignore[method-assign]


def test_gathered_prompts_are_admitted_together_and_get_their_audio(loaded):
    """admit_gather: four requests whose prompts are built at once are admitted in one admission (the fake records
    each), and each still gets the audio it gets alone; without gathering the same backend admits them as they
    come. A lone request is not held by a long gather (nothing else is expected)."""
    requests = [_request(i, n) for i, n in enumerate([12, 9, 15, 6])]
    engine = _engine(loaded, max_streams=4, gather_s=5.0)
    alone = [_chunks(engine, r) for r in requests]
    assert engine.backend.admissions == [[r.seed] for r in requests]  # type: ignore[union-attr]
    started = time.monotonic()
    _chunks(engine, requests[0])
    assert time.monotonic() - started < 2.0, "a lone request waited for the gather"
    engine.backend.admissions.clear()  # type: ignore[union-attr]
    _prompts_meet(engine, len(requests))
    got = _at_once([lambda r=r: _chunks(engine, r) for r in requests], [0.0] * len(requests))
    assert sorted(engine.backend.admissions[0]) == sorted(r.seed for r in requests)  # type: ignore[union-attr]
    assert len(engine.backend.admissions) == 1  # type: ignore[union-attr]
    for i, (g, a) in enumerate(zip(got, alone)):
        _assert_same_audio(g, a, f"request {i}")
    assert engine.backend.arrivals.expected == 0  # type: ignore[union-attr]
    assert _all_freed(engine)


def test_a_prompt_that_fails_is_not_waited_for(loaded):
    """A request that fails while its prompt is built (an unknown voice) gives its arrival back: the request built
    beside it is admitted at once, not after the gather (5 s here), and nothing stays expected."""
    engine = _engine(loaded, max_streams=4, gather_s=5.0)
    _prompts_meet(engine, 2)
    bad = SynthesisRequest(text="No such voice.", speaker="nobody", max_frames=4)
    started = time.monotonic()
    got = _at_once([lambda: _chunks(engine, _request(0, 6)), lambda: _chunks(engine, bad)], [0.0, 0.0])
    assert time.monotonic() - started < 2.5, "the good request waited for the failed prompt"
    assert isinstance(got[1], UnknownSpeakerError)
    assert len(got[0]) > 0 and not isinstance(got[0], BaseException)
    assert engine.backend.arrivals.expected == 0  # type: ignore[union-attr]
