"""Continuous batching: one thread steps every active stream together on a BatchedDecoder.

`BatchingBackend.start()` (any thread) queues a stream and returns its session at once; the
scheduler thread admits queued streams into free slots first come first served at the next step
boundary (one batched prefill between steps), steps all busy slots, and hands each step's codes to
their sessions. A stream leaves at end of speech, at its frame limit or when cancelled (its session
closed), and its slot is free for the next step; no stream waits for another to finish. The codes
of a step are read back a few steps later (a small ring of pinned copies with events), so the host
never waits for the GPU between steps; a slot that ended keeps computing padding work for those
few steps, whose codes are dropped.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...decode_counters import DECODE
from ...model.prompt import Prompt
from ...request import SamplingParams
from .batched import BUCKETS, MAX_SLOTS, Admission, BatchedDecoder
from .frame import NUM_GROUPS

if TYPE_CHECKING:
    from ...model.codec import CodecDecoder
    from .. import GroupSink

_LOGGER = logging.getLogger(__name__)

# The interpreter's GIL switch interval while a scheduler runs. The scheduler thread gives up the
# GIL at every launch and poll; taking it back waits for the thread holding it (request threads
# issuing codec ops) to reach the switch interval, 5 ms by default: a few such waits per step
# starve every stream (on the H200, 4 clients at max_streams 16 got ~12 frames/s each).
SWITCH_INTERVAL_S = 0.0005
# The longest the scheduler waits, before its next step, for the codec worker to queue the call of a first group
# it just handed over (BatchingBackend._yield_to_first_audio): the worker queues it within a poll (0.2 ms) unless
# DEPTH calls of larger groups are still on the GPU, and the streams' decode should not wait for those.
FIRST_AUDIO_HOLD_S = 0.003
# max_streams "auto" (0): the streams whose decoder rows fit in at most FREE_SHARE of the GPU memory free after
# the model loaded, less WORK_RESERVE_BYTES for what grows while serving (prefill activations, the codec's
# batched calls and graphs, the allocator's slack), rounded down to a step bucket (the decoder allocates rows
# for the bucket its slots need). Half, so that a GPU shared with another service (an LLM beside the speech)
# keeps room for it; 16 streams of the 1.7B at 2,048 frames take ~4 GiB.
FREE_SHARE = 0.5
WORK_RESERVE_BYTES = 2 << 30


def streams_for_memory(free_bytes: int, row_bytes: int) -> tuple[int, str]:
    """max_streams "auto": how many streams a GPU with free_bytes free can batch, and why (for the log)."""
    budget = min(free_bytes - WORK_RESERVE_BYTES, free_bytes * FREE_SHARE)
    fits = max(int(budget // row_bytes), 0) if row_bytes > 0 else 0
    streams = max((b for b in BUCKETS if b <= fits), default=1)
    gib = 1024**3
    why = (
        f"{fits} stream(s) of {row_bytes / gib:.2f} GiB fit in {max(budget, 0) / gib:.1f} GiB: "
        f"{FREE_SHARE:.0%} of the {free_bytes / gib:.1f} GiB free after loading, keeping "
        f"{WORK_RESERVE_BYTES / gib:.0f} GiB for work memory; at most {MAX_SLOTS}, a power of two"
    )
    return streams, why


def gather_wait_s(gather_s: float, expected: int, queued: int, free: int, oldest_queued_at: float, now: float) -> float:
    """How much longer admission waits for prompts still being built (KernelOptions.admit_gather_ms): none when
    gathering is off, nothing is queued or expected, or the queue already fills the free slots; else until
    gather_s after the oldest queued stream arrived."""
    if gather_s <= 0 or expected <= 0 or queued <= 0 or queued >= free:
        return 0.0
    return max(oldest_queued_at + gather_s - now, 0.0)


class Arrivals:
    """The prompts being built for a backend right now, which its scheduler may wait for to admit them together.

    The engine calls expect() on a request's thread before it builds the prompt; start() on the same thread takes
    it (took(), under the scheduler's condition, in the same hold that queues the stream, so the scheduler never
    sees the stream queued and still expected); forget() gives it up when the request fails before its start().
    """

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.expected = 0
        self._local = threading.local()

    def expect(self) -> None:
        if getattr(self._local, "pending", False):
            return
        with self.cond:
            self.expected += 1
        self._local.pending = True

    def took(self) -> None:
        """start() queued this thread's stream (call it under the condition)."""
        if getattr(self._local, "pending", False):
            self._local.pending = False
            self.expected -= 1

    def forget(self) -> None:
        if getattr(self._local, "pending", False):
            self._local.pending = False
            with self.cond:
                self.expected -= 1
                self.cond.notify_all()


class BatchedSession:
    """One stream's codes as the scheduler produces them; launch/collect as KernelDecodeSession."""

    def __init__(
        self, scheduler: BatchingBackend, prompt: Prompt, sampling: SamplingParams, seed: int, max_frames: int
    ) -> None:
        self.scheduler = scheduler
        self.prompt, self.sampling, self.seed, self.max_frames = prompt, sampling, seed, max_frames
        self.finished = False  # no more codes will come (end of speech, limit, cancel, error)
        self.error: BaseException | None = None
        self._codes: list[np.ndarray] = []  # frames received, not yet collected
        self._ready = 0
        self._received = 0  # frames pushed in all
        self._asked: collections.deque[int] = collections.deque()  # launch(n) sizes not yet collected
        self.frames_done = 0
        self.cancelled = False
        # Its own condition on the scheduler's lock: a step wakes only the sessions it gave what they wait for
        # (`_want` frames, or the end), not every request thread (64 woken per step for nothing starved the
        # event loop and the prompts of the interpreter's lock).
        self.wake = threading.Condition(scheduler.lock)
        self._want = 1  # frames the collect() waiting now needs
        self._waiting = False  # a collect() is waiting: the request's thread has nothing else to do
        # Where the scheduler hands a group a waiting collect() asks for (hand_groups_to): the codec worker's stream,
        # so the codec starts on it at the step that completed it, not after the request's thread has woken up,
        # taken the interpreter's lock and passed it on itself (a burst's first groups went out in several calls).
        self._sink: GroupSink | None = None
        self._handed: np.ndarray | None = None  # the group handed to the sink, for the waiting collect() to return
        self.prompt_ready: torch.cuda.Event | None = None  # recorded where the prompt was made (BatchingBackend.start)
        # Host times (time.monotonic) for the first chunk's timeline (the engine logs it at debug level):
        # queued, admitted (its prefill issued), first codes read back.
        self.queued_at = time.monotonic()
        self.admitted_at: float | None = None
        self.first_codes_at: float | None = None

    # -- the scheduler's side (under its condition) ----------------------------------------------
    def _end(self, error: BaseException | None = None) -> None:
        """No more codes will come (end of speech, limit, cancel or `error`): its collect() returns now."""
        self.finished = True
        if error is not None:
            self.error = error
        self.wake.notify_all()

    def _wake_if_ready(self) -> GroupSink | None:
        """After a step: wake its collect() once it has the frames it waits for (or the stream ended), and hand the
        group to the sink first when there is one and the collect() is already waiting. Returns the sink when the
        group it was handed is the stream's first (its first audio)."""
        first: GroupSink | None = None
        if self.finished or self._ready >= self._want:
            if self._sink is not None and self._waiting and self._handed is None and self._ready and self.error is None:
                self._handed = self._take(min(self._want, self._ready))
                self._sink.submit(self._handed)
                if self.frames_done == len(self._handed):
                    first = self._sink
            self.wake.notify_all()
        return first

    def _push(self, row: np.ndarray) -> bool:
        """One frame's codes; returns True when the stream has ended (EOS or its limit)."""
        if row[0] == self.scheduler.eos_id:
            return True
        if self.first_codes_at is None:
            self.first_codes_at = time.monotonic()
        self._codes.append(row)
        self._ready += 1
        self._received += 1
        return self._received >= self.max_frames

    def _take(self, k: int) -> np.ndarray:
        """The oldest k frames received (under the condition)."""
        rows, self._codes = self._codes[:k], self._codes[k:]
        self._ready -= k
        self.frames_done += k
        return np.stack(rows).astype(np.int64) if rows else np.zeros((0, NUM_GROUPS), dtype=np.int64)

    # -- the engine's side ------------------------------------------------------------------------
    def hand_groups_to(self, sink: GroupSink) -> None:
        """From now on a group that a waiting collect() asks for goes to `sink` (sink.submit) as the scheduler reads
        it back; collect() returns the same array, whose decode then only waits for it."""
        self._sink = sink

    def launch(self, n: int) -> int:
        """Ask for the next n frames (the scheduler is already decoding them)."""
        if self.finished and not self._ready:
            return 0
        self._asked.append(max(n, 1))
        return n

    def collect(self) -> np.ndarray:
        """The frames of the oldest launch (fewer at the end), waiting for them."""
        want = self._asked.popleft() if self._asked else 1
        with self.wake:
            self._want = want
            self._waiting = True
            try:
                while self._ready < want and not self.finished and self._handed is None:
                    self.wake.wait()
            finally:
                self._waiting = False
            handed, self._handed = self._handed, None
            if handed is not None:
                return handed
            if self.error is not None:
                raise self.error
            return self._take(min(want, self._ready))

    def next_frames(self, n: int) -> np.ndarray:
        self.launch(n)
        return self.collect()

    def close(self) -> None:
        """The caller is done (finished or cancelled): the stream leaves at the next step."""
        with self.scheduler.cond:
            if not self.finished:
                self.cancelled = True
                self.scheduler.cond.notify_all()


class BatchingBackend:
    """The kernel backend for many streams at once: sessions from any thread, one scheduler thread.

    Same contract as KernelBackend (start -> session with launch/collect/next_frames), with
    concurrent_sessions True: the engine runs requests side by side and each collect() waits for
    its own stream only."""

    name = "kernels-batched"
    concurrent_sessions = True
    exclusive_sessions = False
    thread_safe_sessions = True  # collect() may be called without the engine's lock

    def __init__(
        self,
        single,
        max_streams: int,
        max_seq: int,
        max_trailing: int = 512,
        invariant: bool = False,
    ) -> None:
        """single: the KernelBackend whose weights, ops and options this shares (it stays usable on its own).
        invariant: the batch_invariant setting (BatchedDecoder): no lone steps, no paired positions."""
        self.single = single
        self.model = single.model
        self.eos_id = single.eos_id
        self.max_streams = max_streams
        # Few arrivals at once are prefilled through the one-stream backend's captured graphs (warm_up
        # captures them), into its cache and then copied into their slots: that backend runs no stream itself.
        self.decoder = BatchedDecoder(
            single.model,
            single.ops,
            single.weights,
            slots=max_streams,
            max_seq=max_seq,
            max_trailing=max_trailing,
            prefills=single.prefills,
            prefill_cache=single.state.cache,
            pdl=single.pdl,
            invariant=invariant,
            lone_splits=single.options.attn_splits,
            lone_cp_persistent=single.cp_persistent,
            blas_rows=single.options.blas_rows,
            attn_splits=single.options.batched_attn_splits or None,
        )
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)  # the scheduler thread's: arrivals, cancels, stop
        self._queue: collections.deque[BatchedSession] = collections.deque()
        self._slots: list[BatchedSession | None] = [None] * max_streams
        self._frames: list[int] = [0] * max_streams  # steps each slot's stream has run (host count)
        rows = self.decoder.rows
        self.steps_ahead = single.options.steps_ahead  # steps launched ahead of the oldest not yet read back
        self._ring = torch.empty(self.steps_ahead + 1, rows, NUM_GROUPS, dtype=torch.int32, pin_memory=True)
        self._inflight: collections.deque[tuple[torch.cuda.Event, int, list[tuple[int, BatchedSession]]]] = (
            collections.deque()
        )
        self._stopping = False
        # Prompts being built, and how long admission may wait for them (KernelOptions.admit_gather_ms).
        self.arrivals = Arrivals(self.cond)
        self.admit_gather_s = single.options.admit_gather_ms / 1000
        # First audio before the next step (KernelOptions.first_audio_hold): streams admitted whose first codes
        # have not been read back, and the sinks a read-back just handed a first group (scheduler thread only).
        self.first_audio_hold = single.options.first_audio_hold
        self._awaiting_first: set[BatchedSession] = set()
        self._first_groups: list[GroupSink] = []
        # The scheduler's own CUDA stream (torch's pool streams do not wait for the default one). On the default
        # stream, every ordinary host-to-device copy or kernel of another thread (a request's prompt, built
        # under the engine's lock) queues behind the steps launched ahead, several ms each: a lone request's
        # first audio through the server was 75 ms against 30 on the one-stream path.
        torch.cuda.synchronize(self.model.device)  # the decoder's buffers, zeroed on the default stream
        self.stream = torch.cuda.Stream(self.model.device)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._run, name="qwen3tts-batch", daemon=True)
        self._thread.start()

    def start(self, prompt: Prompt, sampling: SamplingParams, seed: int, max_frames: int) -> BatchedSession:
        max_frames = min(max_frames, self.decoder.max_seq - prompt.length - 1)
        if max_frames < 1:
            raise ValueError(f"the prompt has {prompt.length} positions; a stream's cache holds {self.decoder.max_seq}")
        session = BatchedSession(self, prompt, sampling, seed, max_frames)
        # The prompt's tensors were made on this thread's stream: its admission waits for them there.
        session.prompt_ready = torch.cuda.Event()
        session.prompt_ready.record()
        with self.cond:
            self._queue.append(session)
            self.arrivals.took()
            self.cond.notify_all()
        return session

    def expect_arrival(self) -> None:
        self.arrivals.expect()

    def forget_arrival(self) -> None:
        self.arrivals.forget()

    def _gather_wait_s(self) -> float:
        """How much longer admission waits for prompts still being built (under the condition)."""
        if not self._queue:
            return 0.0
        free = sum(s is None for s in self._slots)
        return gather_wait_s(
            self.admit_gather_s,
            self.arrivals.expected,
            len(self._queue),
            free,
            self._queue[0].queued_at,
            time.monotonic(),
        )

    def fuse_codec(self, codec: CodecDecoder) -> None:
        """The codec on the kernels too (KernelBackend.fuse_codec: the library is shared)."""
        self.single.fuse_codec(codec)

    def warm_up(self) -> int:
        """Capture the prefill graphs that admissions replay: the one-stream backend's (a few arrivals at once)
        and the decoder's batched ones (more), while no stream runs (the engine's warm-up calls this). Returns
        how many were captured."""
        with self.cond:
            if self._queue or any(self._slots) or self._inflight:
                raise RuntimeError("the prefill graphs are captured while no stream runs")
            captured = self.single.warm_up()
            with torch.cuda.stream(self.stream):  # where the scheduler replays them
                captured += self.decoder.capture_prefills()
            self.stream.synchronize()
            return captured

    def queued(self) -> int:
        return len(self._queue)

    def active(self) -> int:
        return sum(s is not None for s in self._slots)

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        self._thread.join(timeout=5)

    # -- the scheduler thread -----------------------------------------------------------------------
    def _run(self) -> None:
        torch.cuda.set_device(self.model.device)
        with torch.cuda.stream(self.stream):  # every launch, copy and event of this thread
            self._loop()

    def _loop(self) -> None:
        dec = self.decoder
        ring = 0
        while True:
            with self.cond:
                gather = 0.0
                while not self._stopping:
                    idle = not any(self._slots) and not self._inflight
                    if idle and not self._queue:
                        self.cond.wait()
                        continue
                    # Prompts still being built may join this admission (admit_gather): with nothing else to do,
                    # wait for them here (start() and forget() notify); with streams decoding, step on and look
                    # again at the next step boundary.
                    gather = self._gather_wait_s()
                    if idle and gather > 0:
                        self.cond.wait(gather)
                        continue
                    break
                if self._stopping:
                    self._fail_all(RuntimeError("the batch scheduler stopped"))
                    return
                self._leave_cancelled()
                # The lowest free slots first: low slots keep the step's bucket small.
                free = [s for s, sess in enumerate(self._slots) if sess is None]
                admit = []
                while self._queue and free and gather <= 0:
                    session = self._queue.popleft()
                    if session.cancelled:
                        session._end()
                        continue
                    slot = free.pop(0)
                    self._slots[slot], self._frames[slot] = session, 0
                    admit.append((slot, session))
            try:
                if admit:
                    for _slot, session in admit:
                        if session.prompt_ready is not None:
                            self.stream.wait_event(session.prompt_ready)
                    dec.admit_all([Admission(slot, s.prompt, s.sampling, s.seed) for slot, s in admit])
                    DECODE.admissions += 1
                    DECODE.admitted += len(admit)
                    admitted = time.monotonic()
                    for _slot, session in admit:
                        session.admitted_at = admitted
                        if self.first_audio_hold:
                            self._awaiting_first.add(session)
                nb = dec.nb
                if nb:
                    if self._first_groups:
                        self._yield_to_first_audio()
                    dec.step(nb)
                    DECODE.steps += 1
                    rows = [(s, sess) for s, sess in enumerate(self._slots[:nb]) if sess is not None]
                    self._ring[ring, :nb].copy_(dec.cur[:nb], non_blocking=True)
                    done = torch.cuda.Event()
                    done.record()
                    self._inflight.append((done, ring, rows))
                    ring = (ring + 1) % self._ring.shape[0]
                    with self.cond:  # a stream at its frame limit leaves now; its codes come as they are read
                        for s, sess in rows:
                            self._frames[s] += 1
                            if self._frames[s] >= sess.max_frames and self._slots[s] is sess:
                                self._slots[s] = None
                                dec.release(s)
                # A step that makes a new stream's first codes is read back before the next is launched, which
                # can then wait for their audio (_yield_to_first_audio) with no step of ours beside it on the GPU.
                self._read_back(wait=len(self._inflight) >= self.steps_ahead or nb == 0 or bool(self._awaiting_first))
            except BaseException as err:  # a failed step (e.g. out of memory) ends every stream in it
                _LOGGER.exception("Batched decode step failed")
                with self.cond:
                    self._fail_all(err)

    def _read_back(self, wait: bool) -> None:
        """Hand the codes of finished steps to their sessions (the oldest waited for when `wait`)."""
        while self._inflight:
            done, ring, rows = self._inflight[0]
            if not done.query():
                if not wait:
                    return
                # Poll with sleeps rather than Event.synchronize(), which holds the GIL while it waits
                # and so starved the request threads (codec, collect) and the event loop: on the H200 a
                # lone request's first audio took 130 ms, not ~40.
                waited = time.monotonic()
                while not done.query():
                    time.sleep(0.0002)
                DECODE.step_wait_s += time.monotonic() - waited
            self._inflight.popleft()
            wait = False
            codes = self._ring[ring].numpy()
            with self.cond:
                for s, sess in rows:
                    if sess.finished:
                        self._awaiting_first.discard(sess)
                        continue
                    DECODE.step_frames += 1
                    if sess._push(codes[s].copy()):
                        sess._end()
                        if self._slots[s] is sess:
                            self._slots[s] = None
                            self.decoder.release(s)
                    first = sess._wake_if_ready()
                    if first is not None and self.first_audio_hold:
                        self._first_groups.append(first)
                    if sess.finished or sess.frames_done:  # its first group is out (handed, or collected)
                        self._awaiting_first.discard(sess)

    def _yield_to_first_audio(self) -> None:
        """Make the next step wait on the GPU for the codec calls of the first groups just handed over: the codec's
        many small kernels then run alone (2.5 ms for a lone stream's first frame on an H100) instead of beside a
        step (7.0 ms), at the cost of that call's time once per arrival for the streams already decoding. A call
        the worker has not queued within FIRST_AUDIO_HOLD_S is not waited for."""
        sinks, self._first_groups = self._first_groups, []
        deadline = time.monotonic() + FIRST_AUDIO_HOLD_S
        for sink in sinks:
            done = sink.wait_launched(max(deadline - time.monotonic(), 0.0))
            if done is not None:
                self.stream.wait_event(done)

    def _leave_cancelled(self) -> None:
        for s, sess in enumerate(self._slots):
            if sess is not None and sess.cancelled:
                sess._end()
                self._slots[s] = None
                self.decoder.release(s)

    def _fail_all(self, err: BaseException) -> None:
        for s, sess in enumerate(self._slots):
            if sess is not None:
                sess._end(err)
                self._slots[s] = None
                self.decoder.release(s)
        while self._queue:
            self._queue.popleft()._end(err)
        self._inflight.clear()
        self._awaiting_first.clear()
        self._first_groups.clear()
        self.cond.notify_all()
