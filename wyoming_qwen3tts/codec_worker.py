"""The batching backend's codec: one thread turns every request's frame groups into PCM, many streams per call.

Request threads (Engine.synthesize) hand a frame group to their WorkerStream and wait for its PCM; the worker thread
decodes the groups that are waiting in batched calls (CodecSlots: one call for the streams whose groups have the same
length, at most rows_per_call of them), so many streams cost about the kernel launches of one and no request thread runs
the codec or holds a lock while the GPU works.  The smallest groups go first: a newly joined stream's first group (a
few frames) waits at most for the calls already on the GPU, never for a round of everyone's large groups.  Up to
DEPTH calls are in flight, so the host queues the next call while the GPU runs the last.  A call that fails is tried
again stream by stream, so a group that cannot be decoded fails its own request only.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from .decode_counters import DECODE
from .model.codec import CodecDecoder, CodecStream, int16_samples
from .model.codec_slots import CodecSlots

_LOGGER = logging.getLogger(__name__)
T = TypeVar("T")

DEPTH = int(os.environ.get("Q3T_CODEC_DEPTH", "2"))  # calls queued on the GPU at once
# Streams per call: bounds a call's activations and how long a newcomer may wait behind it. Larger calls cost less a
# frame (H100, 12-frame groups: 16 rows 140 us a frame, 64 rows 87: kernels/device/bench_codec.py); an A/B knob.
MAX_ROWS = int(os.environ.get("Q3T_CODEC_MAX_ROWS", "16"))
# Streams per call of a group of n frames: MAX_ROWS, or more for short groups (rows x n at most ROW_FRAMES), so a
# burst's first chunks (1 frame each) go out in one call rather than one call per MAX_ROWS of them, each behind the last.
ROW_FRAMES = int(os.environ.get("Q3T_CODEC_ROW_FRAMES", "16"))
# Frames one call may take in all (0: only the rows bound it): a newly joined stream's first group waits behind up
# to DEPTH calls already on the GPU, 16 rows of 12 frames each at most without it (an A/B knob, off by default).
CALL_FRAMES = int(os.environ.get("Q3T_CODEC_CALL_FRAMES", "0"))
# Captured calls take the conv algorithms cuDNN times for their shapes (torch.backends.cudnn.benchmark, on for the
# warm-up only: later eager calls keep the heuristic picks, and nothing else in the process is timed). Off: in the
# server (H100, de2bc46) a burst of 64 got 14 % more audio, but first audio p95 173 against 145 ms, and the warm-up
# took 18 s longer; and where the heuristic's pick is slow its timed search finds nothing faster, which the convs'
# own timed choice of a GEMM does (codec.gemm_is_faster, KernelOptions.codec_conv_timed).
TUNE_CONVS = os.environ.get("Q3T_CODEC_TUNE", "0") == "1"
# Groups of at least COALESCE_FRAMES frames (a stream's later groups: the client holds 0.5 s of audio or more ahead
# of them) wait up to COALESCE_S for more such groups to share their call, until the call is full or holds every
# open stream: fewer, larger calls cost the GPU less a frame, which the steps get back. First groups never wait.
# Measured (H100, de2bc46, one call, a burst of 64): 3,337 -> 3,858 audio frames/s, first audio p95 145.0 -> 125.8
# ms; bursts of 16 and Poisson loads within the spread (docs/performance.md). 0: launch whatever waits.
COALESCE_S = float(os.environ.get("Q3T_CODEC_COALESCE_MS", "30")) / 1000
COALESCE_FRAMES = 8


def rows_per_call(n: int) -> int:
    """The most streams one call takes when their groups have n frames."""
    n = max(n, 1)
    rows = max(MAX_ROWS, ROW_FRAMES // n)
    return max(1, min(rows, CALL_FRAMES // n)) if CALL_FRAMES > 0 else rows


POLL_S = 0.0002  # the wait for a call's PCM polls with sleeps: Event.synchronize() holds the GIL (scheduler.py)


class WorkerStream:
    """One request's audio on a CodecWorker: its thread decode()s the frame groups in order, then close()s it."""

    needs_engine_lock = False  # engine.AudioSink: the worker's thread runs the codec

    def __init__(self, worker: CodecWorker, start: CodecStream) -> None:
        self.worker = worker
        self.start: CodecStream | None = start  # the state it begins in, until the worker gives it a slot
        self.slot: int | None = None
        self.codes: np.ndarray | None = None  # the group waiting or being decoded
        self.pcm = b""
        self.error: BaseException | None = None  # what ended it; every later decode raises it
        self.done = threading.Event()
        self.submitted: np.ndarray | None = None  # the group submit() queued, which decode() then only waits for
        self.closed = False
        # Set when the worker has queued the call that decodes the waiting group (or failed it): wait_launched().
        self.launched = threading.Event()
        self.call_done: torch.cuda.Event | None = None  # recorded after that call, on the worker's CUDA stream
        self.queued_at = 0.0  # when the waiting group was queued (monotonic s)

    def submit(self, codes: np.ndarray) -> None:
        """Queue the next frame group [n, 16] now, from any thread (the batching scheduler, at the step that
        completed it, while the request's thread waits in collect()); decode() of the same array then waits for
        its PCM.  One group at a time: the last one's PCM has been taken."""
        if len(codes) == 0:
            return
        worker = self.worker
        with worker.cond:
            if self.error is not None or self.closed:
                return  # decode() raises the error, or nobody will ask
            self._queue(codes)
            self.submitted = codes

    def wait_launched(self, timeout: float) -> torch.cuda.Event | None:
        """Wait up to `timeout` s until the worker has queued the call that decodes the submitted group; the CUDA
        event recorded after that call, or None (not queued in time, failed, or decoded on the CPU)."""
        if not self.launched.wait(timeout):
            return None
        return self.call_done

    def _queue(self, codes: np.ndarray) -> None:
        worker = self.worker
        self.codes, self.pcm = codes, b""
        self.queued_at = time.monotonic()
        self.done.clear()
        self.launched.clear()
        self.call_done = None
        worker.waiting.append(self)
        worker.cond.notify_all()

    def decode(self, codes: np.ndarray) -> bytes:
        """s16le PCM of the next frame group [n, 16], waiting for it; raises the error that ended this stream."""
        if len(codes) == 0:
            return b""
        worker = self.worker
        with worker.cond:
            if self.error is not None:
                raise self.error
            if self.submitted is codes:
                self.submitted = None  # queued already
            else:
                self._queue(codes)
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.pcm

    def close(self) -> None:
        """The request is over (finished, cancelled or failed): its slot goes back, and a group it submitted and
        nobody waits for is dropped.  Safe while a call that used the slot is still on the GPU: the worker queues
        all its work on one stream, so a later open of the slot runs after it; a call picked but not yet launched
        gives the slot back when it ends (_deliver, _fail)."""
        worker = self.worker
        with worker.cond:
            if not self.closed:
                worker.streams_open -= 1
            self.closed = True
            if self in worker.waiting:
                worker.waiting.remove(self)
            if self.slot is not None:
                worker.released.append(self.slot)
                self.slot = None
            # The worker gives the slot back, and a call it holds for later groups may now hold every open stream.
            worker.cond.notify_all()


@dataclass
class _Call:
    streams: list[WorkerStream]
    samples: torch.Tensor  # int16 [B, n*1920] on the host, pinned
    done: torch.cuda.Event  # recorded after the copy to the host


class CodecWorker:
    """The thread that decodes every WorkerStream's groups, and its slots (CodecSlots, grown as needed)."""

    def __init__(self, codec: CodecDecoder, cuda_stream: torch.cuda.Stream | None, slots: int) -> None:
        """cuda_stream: where the codec runs (the engine's codec stream); slots: streams expected at once."""
        self.slots = CodecSlots(codec, slots)
        self.cuda_stream = cuda_stream
        self.cond = threading.Condition()
        self.waiting: list[WorkerStream] = []  # streams with a group to decode, oldest first
        self.released: list[int] = []  # slots of closed streams, to give back on the worker thread
        self._inflight: collections.deque[_Call] = collections.deque()
        self._jobs: list[tuple[Callable[[], object], concurrent.futures.Future]] = []  # run on the worker thread
        self.streams_open = 0  # WorkerStreams opened and not closed: the most one call could gather
        self._thread = threading.Thread(target=self._run, name="qwen3tts-codec", daemon=True)
        self._thread.start()

    def open(self, start: CodecStream) -> WorkerStream:
        """A stream for one request that continues `start` (a fresh CodecStream, or a cloned voice's context)."""
        with self.cond:
            self.streams_open += 1
        return WorkerStream(self, start)

    def warm_up(self, frames: Iterable[int]) -> int:
        """Meet every call shape the worker will use (CodecSlots.warm_up: these group lengths, each at the padded
        batch sizes up to rows_per_call) on the worker thread and its CUDA stream, and capture each (on a GPU), waiting for
        it; returns the shapes."""

        def job() -> int:
            shapes = 0
            tune = TUNE_CONVS and self.cuda_stream is not None
            before = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = before or tune
            try:
                for n in sorted(set(frames)):
                    most_rows = min(rows_per_call(n), self.slots.capacity)
                    shapes += self.slots.warm_up([n], most_rows, capture=self.cuda_stream is not None)
            finally:
                torch.backends.cudnn.benchmark = before
            if self.cuda_stream is not None:
                self.cuda_stream.synchronize()
            as_gemm, timed = self.slots.decoder.gemm_conv_shapes()
            if timed:
                _LOGGER.info("Codec convs: %d of %d conv shapes timed faster as GEMMs than on cuDNN", as_gemm, timed)
            return shapes

        return self._on_worker(job)

    def _on_worker(self, job: Callable[[], T]) -> T:
        """Run job on the worker thread between calls; its result or its exception comes back here."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.cond:
            self._jobs.append((job, future))
            self.cond.notify_all()
        return future.result()

    # -- the worker thread ------------------------------------------------------------------------
    def _run(self) -> None:
        stream = self.cuda_stream
        if stream is not None:
            torch.cuda.set_device(stream.device)
        with torch.inference_mode(), torch.cuda.stream(stream) if stream is not None else nullcontext():
            while True:
                try:
                    self._turn()
                except Exception as err:  # a bug here must not leave requests waiting forever
                    _LOGGER.exception("Codec worker failed")
                    with self.cond:
                        everyone = self.waiting + [s for call in self._inflight for s in call.streams]
                        self.waiting.clear()
                        self._inflight.clear()
                    self._fail(everyone, err)

    def _turn(self) -> None:
        """Give back released slots, then launch the next call, or hand out the oldest call's PCM once it is
        ready, or sleep a moment."""
        with self.cond:
            while not (self.waiting or self._inflight or self.released or self._jobs):
                self.cond.wait()
            jobs, self._jobs = self._jobs, []
            for slot in self.released:
                self.slots.close(slot)
            self.released.clear()
            streams, hold_s = self._pick() if len(self._inflight) < DEPTH and not jobs else ([], 0.0)
            if not (streams or jobs or self._inflight) and hold_s > 0:
                self.cond.wait(hold_s)  # later groups gathering into one call, nothing else to do
                return
        for job, future in jobs:
            try:
                future.set_result(job())
            except Exception as err:
                future.set_exception(err)
        if streams:
            self._launch(streams)
            return
        if not self._inflight:
            return
        call = self._inflight[0]
        try:
            ready = call.done.query()
        except Exception as err:  # an error of the call's kernels surfaces here
            self._inflight.popleft()
            self._fail(call.streams, err)
            return
        if ready:
            self._deliver(self._inflight.popleft().streams, call.samples)
        else:
            waited = time.monotonic()
            time.sleep(POLL_S)
            DECODE.codec_wait_s += time.monotonic() - waited

    def _pick(self) -> tuple[list[WorkerStream], float]:
        """The next call's streams (under cond): those whose groups have the smallest length, oldest first; or none
        and how long to wait while later groups gather (COALESCE_S)."""
        if not self.waiting:
            return [], 0.0
        n = min(len(s.codes) for s in self.waiting)  # type: ignore[arg-type]
        rows = rows_per_call(n)
        picked = [s for s in self.waiting if len(s.codes) == n][:rows]  # type: ignore[arg-type]
        if COALESCE_S > 0 and n >= COALESCE_FRAMES and len(picked) < min(rows, self.streams_open):
            hold = picked[0].queued_at + COALESCE_S - time.monotonic()
            if hold > 0:
                return [], hold
        for s in picked:
            self.waiting.remove(s)
        return picked, 0.0

    def _launch(self, streams: list[WorkerStream]) -> None:
        """Queue one batched call; if it fails, each stream alone (a failed call leaves its slots as they were)."""
        try:
            for s in streams:
                if s.slot is None:
                    s.slot = self.slots.open(s.start)
                    s.start = None
            codes = np.stack([s.codes for s in streams])  # type: ignore[misc]
            wav = self.slots.decode([s.slot for s in streams], codes)  # type: ignore[misc]
            DECODE.codec_calls += 1
            DECODE.codec_frames += codes.shape[0] * codes.shape[1]
        except Exception as err:
            if len(streams) == 1:
                _LOGGER.exception("Codec decode failed")
                self._fail(streams, err)
            else:
                for s in streams:
                    self._launch([s])
            return
        try:
            samples = int16_samples(wav)
            if self.cuda_stream is None:  # the CPU computed it already
                self._deliver(streams, samples)
                return
            host = torch.empty(samples.shape, dtype=torch.int16, pin_memory=True)
            host.copy_(samples, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._inflight.append(_Call(streams, host, done))
            for s in streams:
                s.call_done = done
                s.launched.set()
        except Exception as err:  # the slots have moved on: no retry
            _LOGGER.exception("Codec output copy failed")
            self._fail(streams, err)

    def _deliver(self, streams: list[WorkerStream], samples: torch.Tensor) -> None:
        rows = samples.numpy()
        pcm = [rows[r].astype("<i2").tobytes() for r in range(len(streams))]
        with self.cond:
            for s, data in zip(streams, pcm):
                s.pcm, s.codes = data, None
                s.launched.set()
                s.done.set()
            self._release_closed(streams)

    def _fail(self, streams: list[WorkerStream], err: BaseException) -> None:
        with self.cond:
            for s in streams:
                s.error, s.codes = err, None
                s.launched.set()
                s.done.set()
            self._release_closed(streams)

    def _release_closed(self, streams: list[WorkerStream]) -> None:
        """Slots of streams closed while their call was being launched (under cond): they go back now."""
        for s in streams:
            if s.closed and s.slot is not None:
                self.released.append(s.slot)
                s.slot = None
