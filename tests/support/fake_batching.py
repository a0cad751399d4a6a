"""BatchingBackend's contract on the CPU, for engine tests: one thread steps every admitted stream together.

Sessions are the real BatchedSession (scheduler.py): start() queues a stream from any thread, the step thread
admits it into a free slot, hands every active stream one frame per step (after `step_s`), and frees a slot at
the stream's frame limit or when its session is closed.  A stream's codes come from its own seed only, so a
request gets the same codes alone and beside others; `bad_seed`'s stream gets codes the codec cannot decode
(out of range) from its `bad_frame`-th frame on.  With `gather_s` it gathers arrivals as the real scheduler does
(its Arrivals and gather_wait_s), and `admissions` lists the streams (seeds) each admission took.
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np

from wyoming_qwen3tts.backends.kernels.scheduler import Arrivals, BatchedSession, gather_wait_s

EOS = 2150


class FakeBatchingBackend:
    name = "fake-batched"
    concurrent_sessions = True
    exclusive_sessions = False
    thread_safe_sessions = True

    def warm_up(self) -> int:
        return 0

    def __init__(
        self,
        max_streams: int = 4,
        step_s: float = 0.002,
        bad_seed: int | None = None,
        bad_frame: int = 0,
        gather_s: float = 0.0,
    ) -> None:
        self.max_streams = max_streams
        self.eos_id = EOS
        self.step_s = step_s
        self.bad_seed, self.bad_frame = bad_seed, bad_frame
        self.lock = threading.RLock()  # BatchedSession's own condition (its wake) is on this lock
        self.cond = threading.Condition(self.lock)
        self.arrivals = Arrivals(self.cond)
        self.gather_s = gather_s
        self.admissions: list[list[int]] = []
        self._queue: collections.deque[BatchedSession] = collections.deque()
        self._slots: list[BatchedSession | None] = [None] * max_streams
        self._rngs: list[np.random.Generator | None] = [None] * max_streams
        self._frames = [0] * max_streams
        threading.Thread(target=self._run, name="fake-batch", daemon=True).start()

    def start(self, prompt, sampling, seed: int, max_frames: int) -> BatchedSession:
        session = BatchedSession(self, prompt, sampling, seed, max_frames)  # type: ignore[arg-type]
        with self.cond:
            self._queue.append(session)
            self.arrivals.took()
            self.cond.notify_all()
        return session

    def expect_arrival(self) -> None:
        self.arrivals.expect()

    def forget_arrival(self) -> None:
        self.arrivals.forget()

    def active(self) -> int:
        with self.cond:
            return sum(s is not None for s in self._slots)

    def _run(self) -> None:
        while True:
            with self.cond:
                while True:
                    idle = not any(self._slots)
                    if idle and not self._queue:
                        self.cond.wait()
                        continue
                    free = sum(s is None for s in self._slots)
                    gather = gather_wait_s(
                        self.gather_s,
                        self.arrivals.expected,
                        len(self._queue),
                        free,
                        self._queue[0].queued_at if self._queue else 0.0,
                        time.monotonic(),
                    )
                    if idle and gather > 0:
                        self.cond.wait(gather)
                        continue
                    break
                for s, sess in enumerate(self._slots):
                    if sess is not None and sess.cancelled:
                        sess._end()
                        self._slots[s] = None
                admitted = []
                for s in range(self.max_streams):
                    if self._slots[s] is None and self._queue and gather <= 0:
                        sess = self._queue.popleft()
                        if sess.cancelled:
                            sess._end()
                            continue
                        self._slots[s], self._rngs[s], self._frames[s] = sess, np.random.default_rng(sess.seed), 0
                        admitted.append(sess.seed)
                if admitted:
                    self.admissions.append(admitted)
            time.sleep(self.step_s)  # the step's GPU time, without the condition held
            with self.cond:
                for s, sess in enumerate(self._slots):
                    if sess is None:
                        continue
                    row = self._rngs[s].integers(0, 2048, 16)  # type: ignore[union-attr]
                    if sess.seed == self.bad_seed and self._frames[s] >= self.bad_frame:
                        row[3] = 5000
                    self._frames[s] += 1
                    if sess._push(row):
                        sess._end()
                        self._slots[s] = None
                    sess._wake_if_ready()
