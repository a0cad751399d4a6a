"""Process-wide counts of the decode pipeline's work and of its threads' waits for the GPU, for /metrics.

The batching scheduler (backends/kernels/scheduler.py) counts its steps, the stream frames they decoded, its
admissions and the time it spent waiting for a step on the GPU; the codec worker (codec_worker.py) counts its calls,
the frames they turned into audio and the time it spent waiting for a call. Each counter has one writer thread, so
plain adds suffice; a scrape reads them as they stand. Over a load, decode frames/s against audio frames/s, and
each thread's wait share, say whether the GPU or the host bounds the server: a scheduler that seldom waits for the
GPU is held up on the host (the interpreter's lock), one that waits most of the time has the GPU as its bound.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class DecodeCounters:
    steps: int = 0  # batched decode steps launched
    step_frames: int = 0  # stream frames those steps decoded (codes read back for a busy stream)
    admissions: int = 0  # admissions (one prefill pass each, of one or more streams)
    admitted: int = 0  # streams admitted
    step_wait_s: float = 0.0  # the scheduler's time waiting for its oldest step on the GPU
    codec_calls: int = 0  # codec calls launched
    codec_frames: int = 0  # frames those calls turned into audio
    codec_wait_s: float = 0.0  # the codec worker's time waiting for its oldest call on the GPU

    def snapshot(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DECODE = DecodeCounters()
