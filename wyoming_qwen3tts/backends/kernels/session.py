"""A decode session on the kernel backend: frame graph replays launched ahead, codes read back per group."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .frame import NUM_GROUPS

if TYPE_CHECKING:
    from .backend import KernelBackend


def _no_codes() -> np.ndarray:
    return np.zeros((0, NUM_GROUPS), dtype=np.int64)


class KernelDecodeSession:
    # DecodeSession: a one-stream session starts at once and holds nothing beyond its own buffers.
    queued_at: float | None = None
    admitted_at: float | None = None
    first_codes_at: float | None = None

    def close(self) -> None:
        pass

    def __init__(self, backend: KernelBackend, graph: torch.cuda.CUDAGraph, max_frames: int) -> None:
        self.backend = backend
        self.graph = graph
        self.max_frames = max_frames
        self.frames_done = 0
        self.finished = False
        # Pinned host copy of the codes so the device-to-host copies are asynchronous.
        self._host = torch.empty(max_frames, NUM_GROUPS, dtype=torch.int32, pin_memory=True)
        self._pending: list[tuple[int, int, torch.cuda.Event]] = []

    def launch(self, n: int) -> int:
        """Enqueue up to n frames (graph replays) and an async copy of their codes; no sync.

        The engine launches group k+1 before it decodes group k's audio on another stream, so
        the codec overlaps the decode loop. Returns how many frames were enqueued.
        """
        if not self.backend.owns(self):
            raise RuntimeError("another session started on this backend; a KernelBackend runs one session at a time")
        start = self.frames_done + sum(k for _, k, _ in self._pending)
        k = 0 if self.finished else min(n, self.max_frames - start)
        if k <= 0:
            return 0
        for _ in range(k):
            self.graph.replay()
        self._host[start : start + k].copy_(self.backend.history[start : start + k], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._pending.append((start, k, done))
        return k

    def collect(self) -> np.ndarray:
        """Codes of the oldest launched group, cut at end of speech (waits for that group only)."""
        if not self._pending:
            return _no_codes()
        start, k, done = self._pending.pop(0)
        done.synchronize()  # the one host sync of this frame group
        if self.finished:  # end of speech came in an earlier group: this one is discarded
            return _no_codes()
        codes = self._host[start : start + k].numpy().astype(np.int64)
        eos = np.nonzero(codes[:, 0] == self.backend.eos_id)[0]
        if eos.size:
            codes = codes[: eos[0]]
            self.finished = True
        self.frames_done += codes.shape[0]
        if self.frames_done >= self.max_frames:
            self.finished = True
        return codes

    def next_frames(self, n: int) -> np.ndarray:
        if self.finished or n <= 0:
            return _no_codes()
        while self._pending:  # groups launched ahead come first
            codes = self.collect()
            if len(codes) or self.finished:
                return codes
        self.launch(n)
        return self.collect()
