"""A decode backend for tests whose sessions get stuck: ordinary-looking codes, then one pattern forever.

It follows the DecodeBackend protocol of engine.py (start -> session with launch/collect), so an
Engine built on a tiny checkpoint can use it in place of the torch backend.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class LoopingSession:
    queued_at = admitted_at = first_codes_at = None

    def close(self) -> None:
        pass

    def __init__(self, normal_frames: int, pattern: np.ndarray, max_frames: int, seed: int) -> None:
        self.normal_frames = normal_frames
        self.pattern = pattern
        self.max_frames = max_frames
        self.rng = np.random.default_rng(seed)
        self.frames_done = 0
        self.finished = False
        self._asked: deque[int] = deque()

    def launch(self, n: int) -> None:
        self._asked.append(n)

    def collect(self) -> np.ndarray:
        n = self._asked.popleft() if self._asked else 0
        n = min(n, self.max_frames - self.frames_done)
        rows = []
        for _ in range(max(n, 0)):
            t = self.frames_done
            if t < self.normal_frames:
                rows.append(self.rng.integers(0, 2048, size=16))
            else:
                rows.append(self.pattern[(t - self.normal_frames) % len(self.pattern)])
            self.frames_done += 1
        self.finished = self.frames_done >= self.max_frames
        return np.array(rows, dtype=np.int64).reshape(-1, 16)

    def next_frames(self, n: int) -> np.ndarray:
        self.launch(n)
        return self.collect()


class LoopingBackend:
    """Sessions give `normal_frames` random frames, then repeat `pattern` ([P, 16]) until max_frames."""

    name = "looping"
    concurrent_sessions = exclusive_sessions = thread_safe_sessions = False
    max_streams = 1

    def warm_up(self) -> int:
        return 0

    def __init__(self, normal_frames: int, pattern: np.ndarray) -> None:
        self.normal_frames = normal_frames
        self.pattern = np.asarray(pattern, dtype=np.int64).reshape(-1, 16)

    def start(self, prompt, sampling, seed: int, max_frames: int) -> LoopingSession:
        return LoopingSession(self.normal_frames, self.pattern, max_frames, seed)
