"""Prometheus metrics of both protocols: speech requests, time to first audio, frames, streams, the engine's queue, GPU memory,
and the decode pipeline's steps, codec calls and their waits for the GPU (decode_counters.py).

The process's own resident memory, open file descriptors and CPU time (prometheus_client's standard
`process_*` series) and its OS threads (qwen3tts_process_threads) come with them: with the GPU's
memory they are what the soak tool (wyoming_qwen3tts/tools/soak.py --metrics) watches for growth.

One process-wide `METRICS` object, so the Wyoming handler and the HTTP API count into the same
series (`protocol` label: "wyoming" or "http"); the HTTP server exposes them at /metrics.  A speech
request is measured by a SpeechMeter:

    meter = METRICS.speech("wyoming", started_at=exchange.started_at)
    ...  meter.audio(chunk.num_frames)          # each chunk sent; the first one gives the TTFA
    ...  meter.synthesized(seconds)             # time spent waiting for the engine
    meter.finish("ok" | err.code | "client-gone")   # once; later calls are ignored

Frames per second are `rate(qwen3tts_audio_frames_total) / rate(qwen3tts_synthesis_seconds_total)`
(the engine's speed while it works), and per request in qwen3tts_frames_per_second.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .decode_counters import DECODE
from .errors import Qwen3TTSError

if TYPE_CHECKING:
    from .service import TtsService

PROTOCOLS = ("wyoming", "http")
# Seconds.  TTFA on a GPU is tens of milliseconds, on a CPU seconds; both ends are covered.
TTFA_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# 12.5 frames/s is real time.
FPS_BUCKETS = (2.5, 5.0, 12.5, 25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 600.0)


class Metrics:
    """Every series the server exports, in its own registry (not prometheus_client's global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.speech_requests = Counter(
            "qwen3tts_speech_requests",
            "Speech requests answered, by protocol and outcome (ok or an error code)",
            ["protocol", "outcome"],
            registry=r,
        )
        self.http_requests = Counter(
            "qwen3tts_http_requests",
            "HTTP requests, by route, method and status code",
            ["route", "method", "status"],
            registry=r,
        )
        self.ttfa = Histogram(
            "qwen3tts_time_to_first_audio_seconds",
            "From the request to its first audio chunk",
            ["protocol"],
            buckets=TTFA_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "qwen3tts_speech_duration_seconds",
            "From the request to its last audio chunk (successful requests)",
            ["protocol"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.frames = Counter("qwen3tts_audio_frames", "Audio frames (80 ms each) sent", ["protocol"], registry=r)
        self.synthesis_seconds = Counter(
            "qwen3tts_synthesis_seconds",
            "Seconds requests waited for the engine to speak their sentences",
            ["protocol"],
            registry=r,
        )
        self.frames_per_second = Histogram(
            "qwen3tts_frames_per_second",
            "Frames per second of synthesis, per successful request",
            ["protocol"],
            buckets=FPS_BUCKETS,
            registry=r,
        )
        self.runaway_stops = Counter(
            "qwen3tts_runaway_stops",
            "Sentences cut short by the runaway guard: at their frame budget, or on a stuck loop",
            ["reason"],
            registry=r,
        )
        self.active = Gauge("qwen3tts_active_streams", "Speech requests being answered now", ["protocol"], registry=r)
        for protocol in PROTOCOLS:  # export zeros before the first request
            self.active.labels(protocol)
            self.frames.labels(protocol)
        for reason in ("budget", "loop"):
            self.runaway_stops.labels(reason)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_open_fds, ... (Linux)
        r.register(_ThreadsCollector())
        r.register(_DecodeCollector())
        self._service_collector: _ServiceCollector | None = None

    def speech(self, protocol: str, started_at: float | None = None) -> SpeechMeter:
        """Start measuring one speech request (`started_at`: its time.monotonic() start, default now)."""
        return SpeechMeter(self, protocol, time.monotonic() if started_at is None else started_at)

    def watch(self, service: TtsService) -> None:
        """Export the service's queue depth and model state, and the GPU's memory, at each scrape."""
        if self._service_collector is not None:
            self.registry.unregister(self._service_collector)
        self._service_collector = _ServiceCollector(service)
        self.registry.register(self._service_collector)


class SpeechMeter:
    """The measurements of one speech request; a context manager that finishes it on exit."""

    def __init__(self, metrics: Metrics, protocol: str, started_at: float) -> None:
        self._metrics = metrics
        self.protocol = protocol
        self.started_at = started_at
        self.first_audio_at: float | None = None
        self.frames = 0
        self.busy = 0.0
        self.outcome: str | None = None
        metrics.active.labels(protocol).inc()

    def audio(self, frames: int) -> None:
        """`frames` more frames were sent; the first call records the time to first audio."""
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
            self._metrics.ttfa.labels(self.protocol).observe(self.first_audio_at - self.started_at)
        self.frames += frames
        self._metrics.frames.labels(self.protocol).inc(frames)

    def runaway_stop(self, kind: str) -> None:
        """A sentence of this request was cut short by the runaway guard (AudioChunk.stopped)."""
        self._metrics.runaway_stops.labels(kind).inc()

    def synthesized(self, seconds: float) -> None:
        """The request waited `seconds` for the engine (one sentence)."""
        self.busy += seconds
        self._metrics.synthesis_seconds.labels(self.protocol).inc(seconds)

    def finish(self, outcome: str = "ok") -> None:
        """Count the request with its outcome; only the first call counts."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        m = self._metrics
        m.active.labels(self.protocol).dec()
        m.speech_requests.labels(self.protocol, outcome).inc()
        if outcome == "ok":
            m.duration.labels(self.protocol).observe(time.monotonic() - self.started_at)
            if self.busy > 0 and self.frames:
                m.frames_per_second.labels(self.protocol).observe(self.frames / self.busy)

    def __enter__(self) -> SpeechMeter:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        if err is None:
            self.finish("ok")
        elif isinstance(err, Qwen3TTSError):
            self.finish(err.code)
        else:  # CancelledError (client gone, shutdown) is a BaseException
            self.finish("error" if isinstance(err, Exception) else "cancelled")


class _ServiceCollector(Collector):
    """Values read at scrape time: the engine's queue, whether the model is loaded, GPU memory."""

    def __init__(self, service: TtsService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service
        jobs = GaugeMetricFamily(
            "qwen3tts_engine_jobs",
            "Jobs (one sentence each, or the model load) queued or running on the engine's worker",
        )
        jobs.add_metric([], service.jobs_running)
        yield jobs
        state = GaugeMetricFamily("qwen3tts_model_state", "1 for the model's current state", labels=["state"])
        current = model_state(service)
        for name in ("loading", "ready", "failed"):
            state.add_metric([name], 1.0 if name == current else 0.0)
        yield state
        cache = service.announcements
        lookups = CounterMetricFamily(
            "qwen3tts_announcement_cache",
            "Sentences looked up in the announcement cache: hit (replayed) or miss (synthesized)",
            labels=["result"],
        )
        lookups.add_metric(["hit"], cache.hits)
        lookups.add_metric(["miss"], cache.misses)
        yield lookups
        yield from _gpu_memory()


class _DecodeCollector(Collector):
    """The decode pipeline's counters (decode_counters.py): the batching scheduler's steps and waits, the codec
    worker's calls and waits. Zero on the one-stream backends, which run neither."""

    def collect(self) -> Iterator[Metric]:
        c = DECODE.snapshot()
        for name, key, doc in (
            ("qwen3tts_decode_steps", "steps", "Batched decode steps launched"),
            ("qwen3tts_decode_frames", "step_frames", "Stream frames the batched steps decoded"),
            ("qwen3tts_decode_admissions", "admissions", "Admissions of queued streams (one prefill pass each)"),
            ("qwen3tts_decode_admitted_streams", "admitted", "Streams admitted into the batch"),
            ("qwen3tts_decode_gpu_wait_seconds", "step_wait_s", "The scheduler's time waiting for a step on the GPU"),
            ("qwen3tts_codec_calls", "codec_calls", "Batched codec calls launched"),
            ("qwen3tts_codec_frames", "codec_frames", "Frames the codec calls turned into audio"),
            (
                "qwen3tts_codec_gpu_wait_seconds",
                "codec_wait_s",
                "The codec worker's time waiting for a call on the GPU",
            ),
        ):
            yield CounterMetricFamily(name, doc, value=c[key])


class _ThreadsCollector(Collector):
    """The process's OS threads (Python's, torch's and OpenMP's alike), from /proc/self/status (Linux)."""

    def collect(self) -> Iterator[Metric]:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("Threads:"):
                yield GaugeMetricFamily("qwen3tts_process_threads", "OS threads of the server process", int(line[8:]))
                return


def model_state(service: TtsService) -> str:
    """The model load's state: loading, ready or failed."""
    if service.load_error is not None:
        return "failed"
    if service.loaded is not None and service.loaded.done():
        return "ready"
    return "loading"


def _gpu_memory() -> Iterator[Metric]:
    """torch's allocator statistics per GPU, once the engine has initialised CUDA/ROCm.

    Never imports torch or initialises a device itself: the scrape runs on the event loop, and
    the engine owns the GPU.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    family = GaugeMetricFamily(
        "qwen3tts_gpu_memory_bytes",
        "GPU memory: allocated by tensors, reserved by torch's caching allocator, total",
        labels=["device", "kind"],
    )
    for index in range(torch.cuda.device_count()):
        device = f"cuda:{index}"
        family.add_metric([device, "allocated"], torch.cuda.memory_allocated(index))
        family.add_metric([device, "reserved"], torch.cuda.memory_reserved(index))
        family.add_metric([device, "total"], torch.cuda.get_device_properties(index).total_memory)
    yield family


METRICS = Metrics()
