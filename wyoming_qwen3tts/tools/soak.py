"""Soak test against a running server: every answer checked, and whether anything in the server grows.

    python -m wyoming_qwen3tts.tools.soak --uri tcp://127.0.0.1:10200 --clients 8 [--requests 10000]
        [--seconds 60] [--streaming] [--server-pid PID] [--metrics http://127.0.0.1:8000/metrics]
        [--every 500] [--warmup 500] [--settle 2] [--max-rss-growth 64] [--max-fd-growth 2]
        [--max-thread-growth 2] [--max-gpu-growth 64] [--voice ryan] [--json]

N clients each send requests back to back (one connection per request, as Home Assistant does)
until --requests have been sent in all or --seconds have passed, whichever comes first (neither
given: 30 s).  Every answer is checked (audio-start, audio-chunk..., audio-stop[,
synthesize-stopped]; 24 kHz 16-bit mono; whole 80 ms frames); reported are requests served and
failed and time to first audio (p50/p95).

Readings of the server: its RSS, threads and open file descriptors from /proc/PID (--server-pid,
same machine) and, from its Prometheus endpoint (--metrics; the server's `http` setting serves
/metrics), the GPU memory torch's allocator holds per device (allocated and reserved), and RSS,
threads and fds too when there is no --server-pid (a server in a container).  One reading before
the first request; then --warmup requests (default 5 % of --requests, at least 200, at most half
of them: caches and the allocator's pools fill at first), a pause until they are all answered and
--settle seconds more, and the warm-up reading, the baseline; a reading every --every completed
requests under load (while every client still sends); and after the last answer and --settle
seconds the end reading.  Per quantity it reports the warm-up value, the end value, the max after
the warm-up, the growth (end minus warm-up) and the least-squares slope per 1,000 requests over the
readings under load.

The verdict: exit status 0 when every request succeeded and nothing grew past its limit: RSS by
--max-rss-growth MiB, open fds by --max-fd-growth, threads by --max-thread-growth, GPU memory
(allocated and reserved, each device) by --max-gpu-growth MiB, end against warm-up, both read
with the server idle; 1 otherwise.  --json prints one object with every reading.  Point it only
at servers you run.

The no-growth check (10,000 requests at 64 streams): start the server with room for 64 clients
and 64 waiting requests (`--max-connections 70 --max-queued-streams 64`; the HTTP side and its
/metrics count against max_connections too), the announcement cache off
(WYOMING_QWEN3TTS_ANNOUNCEMENT_CACHE=false: the soak repeats four sentences, and replayed takes are
not decodes) and `--http tcp://127.0.0.1:8000` for the GPU's memory (a CPU-only server: also
OMP_NUM_THREADS=1 when the soak shares its cores, or torch's spinning threads slow it tenfold), then

    python -m wyoming_qwen3tts.tools.soak --uri tcp://127.0.0.1:10200 --clients 64 --requests 10000 \\
        --every 500 --server-pid "$(pgrep -f 'wyoming_qwen3tts --model')" \\
        --metrics http://127.0.0.1:8000/metrics --json > soak.json

Exit status 0 is the pass; soak.json holds the readings behind it, for a plot or for a slope that
is small but not zero (a leak too slow to pass a limit in 10,000 requests shows there).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from prometheus_client.parser import text_string_to_metric_families
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from ..request import CHANNELS, SAMPLE_RATE, SAMPLE_WIDTH, SAMPLES_PER_FRAME

FRAME_BYTES = SAMPLES_PER_FRAME * SAMPLE_WIDTH
TEXTS = [
    "The kitchen lights are now off.",
    "It is twenty one degrees in the living room. Do you want me to open the blinds?",
    "Your timer for ten minutes has started.",
    "Good morning! Today will be sunny, with a high of twenty four degrees.",
]
MIB = 1024 * 1024
DEFAULT_SECONDS = 30.0


@dataclass
class Results:
    served: int = 0
    failed: int = 0
    frames: int = 0
    ttfa: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return self.served + self.failed

    def fail(self, reason: str) -> None:
        self.failed += 1
        self.errors[reason] = self.errors.get(reason, 0) + 1


# -- readings ---------------------------------------------------------------------------------------


@dataclass
class Reading:
    """The server's quantities after `requests` answered requests, `seconds` into the run.

    phase: "start" (before the first request), "warmup" (after the warm-up, idle), "load" (while the
    clients send) or "end" (after the last answer, idle).  values: rss_mib, threads, fds and, per GPU,
    gpu_allocated_mib:cuda:N and gpu_reserved_mib:cuda:N, as far as they could be read; errors: why not.
    """

    phase: str
    requests: int
    seconds: float
    values: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"phase": self.phase, "requests": self.requests, "seconds": round(self.seconds, 2)}
        out.update({name: round(value, 3) for name, value in sorted(self.values.items())})
        if self.errors:
            out["errors"] = self.errors
        return out


def proc_values(pid: int) -> dict[str, float]:
    """RSS (MiB), threads and open file descriptors of a process, from /proc (Linux); OSError if unreadable."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == "VmRSS":
            values["rss_mib"] = int(rest.split()[0]) / 1024
        elif key == "Threads":
            values["threads"] = int(rest.split()[0])
    values["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return values


def metrics_values(text: str) -> dict[str, float]:
    """The soak's quantities from a Prometheus scrape of the server (wyoming_qwen3tts/metrics.py)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "qwen3tts_gpu_memory_bytes" and sample.labels.get("kind") in ("allocated", "reserved"):
                values[f"gpu_{sample.labels['kind']}_mib:{sample.labels.get('device', '?')}"] = sample.value / MIB
            elif sample.name == "process_resident_memory_bytes":
                values["rss_mib"] = sample.value / MIB
            elif sample.name == "process_open_fds":
                values["fds"] = sample.value
            elif sample.name == "qwen3tts_process_threads":
                values["threads"] = sample.value
    return values


def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


async def take_reading(phase: str, requests: int, seconds: float, pid: int | None, metrics_url: str | None) -> Reading:
    """One reading: /proc of `pid` for RSS, threads and fds when given; the metrics for GPU memory (and the rest
    where /proc gave nothing)."""
    reading = Reading(phase, requests, seconds)
    if metrics_url is not None:
        try:
            reading.values.update(metrics_values(await asyncio.to_thread(scrape, metrics_url)))
        except (OSError, ValueError) as err:
            reading.errors.append(f"metrics: {type(err).__name__}: {err}"[:200])
    if pid is not None:
        try:
            reading.values.update(proc_values(pid))  # the same machine's /proc is exact: it wins
        except (OSError, ValueError) as err:
            reading.errors.append(f"/proc/{pid}: {type(err).__name__}: {err}"[:200])
    return reading


# -- growth and verdict -----------------------------------------------------------------------------


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None for fewer than two distinct x."""
    if len(points) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx


def summarize(readings: Sequence[Reading]) -> dict[str, dict[str, float | None]]:
    """Per quantity: warm-up and end values (idle), max after the warm-up, growth, slope per 1,000 requests (load)."""
    baseline = next((r for r in readings if r.phase == "warmup"), None) or next(
        (r for r in readings if r.phase == "start"), None
    )
    end = next((r for r in reversed(readings) if r.phase == "end"), None)
    after = [r for r in readings if r.phase in ("warmup", "load", "end")]
    load = [r for r in readings if r.phase == "load"]
    names = sorted({name for r in readings for name in r.values})
    summary: dict[str, dict[str, float | None]] = {}
    for name in names:
        first = baseline.values.get(name) if baseline else None
        last = end.values.get(name) if end else None
        seen = [r.values[name] for r in after if name in r.values]
        per_request = slope([(r.requests, r.values[name]) for r in load if name in r.values])
        summary[name] = {
            "warmup": _round(first),
            "end": _round(last),
            "max": _round(max(seen)) if seen else None,
            "growth": _round(last - first) if first is not None and last is not None else None,
            "slope_per_1000": _round(per_request * 1000) if per_request is not None else None,
        }
    return summary


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


@dataclass(frozen=True)
class Limits:
    """How much each quantity may grow from the warm-up reading to the end reading."""

    rss_mib: float = 64.0
    fds: float = 2
    threads: float = 2
    gpu_mib: float = 64.0

    def of(self, name: str) -> float:
        if name.startswith("gpu_"):
            return self.gpu_mib
        return float(getattr(self, name))


def verdict(
    summary: dict[str, dict[str, float | None]], limits: Limits, readings: Sequence[Reading], watched: bool
) -> list[str]:
    """Why the soak failed on growth ([] when it passed): a quantity grew past its limit, or it could not be read."""
    failures = []
    for name, row in summary.items():
        growth = row["growth"]
        if growth is None:
            failures.append(f"{name}: no warm-up or end reading")
        elif growth > limits.of(name):
            failures.append(
                f"{name} grew by {growth:g} (limit {limits.of(name):g}): {row['warmup']:g} -> {row['end']:g}"
            )
    if watched:
        for reading in readings:
            if reading.phase in ("start", "warmup", "end") and reading.errors:
                failures.append(f"{reading.phase} reading: {'; '.join(reading.errors)}")
        if not summary:
            failures.append("nothing could be read from the server")
    return failures


# -- requests ---------------------------------------------------------------------------------------


async def one_request(
    host: str,
    port: int,
    text: str,
    voice: str,
    streaming: bool,
    timeout: float,
    arrivals: list[tuple[float, int]] | None = None,
) -> tuple[float, int]:
    """One request on its own connection; returns (time to first audio chunk, frames). `arrivals`, when given, gets
    each audio chunk's (monotonic arrival time, bytes)."""
    async with AsyncTcpClient(host, port) as client:
        t0 = time.monotonic()
        synth_voice = SynthesizeVoice(name=voice) if voice else None
        if streaming:
            await client.write_event(SynthesizeStart(voice=synth_voice).event())
            for i in range(0, len(text), 7):  # cut anywhere, as an LLM stream is
                await client.write_event(SynthesizeChunk(text[i : i + 7]).event())
            await client.write_event(Synthesize(text, voice=synth_voice).event())  # Home Assistant's back-compat copy
            await client.write_event(SynthesizeStop().event())
        else:
            await client.write_event(Synthesize(text, voice=synth_voice).event())
        last = "synthesize-stopped" if streaming else "audio-stop"
        types: list[str] = []
        size = 0
        first: float | None = None
        deadline = t0 + timeout
        while True:
            event: Event | None = await asyncio.wait_for(client.read_event(), max(deadline - time.monotonic(), 0.001))
            if event is None:
                raise RuntimeError(f"closed after {types[-3:]}")
            if event.type == "error":
                raise RuntimeError(f"error {event.data.get('code')}: {event.data.get('text')}")
            types.append(event.type)
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                if (chunk.rate, chunk.width, chunk.channels) != (SAMPLE_RATE, SAMPLE_WIDTH, CHANNELS):
                    raise RuntimeError(f"bad audio format {chunk.rate}/{chunk.width}/{chunk.channels}")
                size += len(chunk.audio)
                if arrivals is not None:
                    arrivals.append((time.monotonic(), len(chunk.audio)))
                if first is None:
                    first = time.monotonic() - t0
            if event.type == last:
                break
    tail = ["audio-stop", "synthesize-stopped"] if streaming else ["audio-stop"]
    middle = types[1 : len(types) - len(tail)]
    if types[:1] != ["audio-start"] or types[-len(tail) :] != tail or any(t != "audio-chunk" for t in middle):
        raise RuntimeError(f"bad event order {types[:3]}...{types[-3:]}")
    if size % FRAME_BYTES:
        raise RuntimeError(f"{size} bytes of audio is not whole frames")
    return (first if first is not None else time.monotonic() - t0), size // FRAME_BYTES


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Soak:
    """The clients, the request count they share, and the readings taken as it passes each --every."""

    def __init__(self, args: argparse.Namespace, host: str, port: int) -> None:
        self.args = args
        self.host = host
        self.port = port
        self.results = Results()
        self.readings: list[Reading] = []
        self.sent = 0
        self.t0 = time.monotonic()
        self.until = self.t0 + args.seconds if args.seconds is not None else float("inf")
        self.next_reading: float = float("inf")  # completed requests at which the next load reading is taken
        self._tasks: set[asyncio.Task[None]] = set()

    async def read(self, phase: str, requests: int | None = None) -> None:
        """Take a reading, counted at `requests` answered (default: as many as now)."""
        done = self.results.done if requests is None else requests
        seconds = time.monotonic() - self.t0
        reading = await take_reading(phase, done, seconds, self.args.server_pid, self.args.metrics)
        self.readings.append(reading)
        # One line per reading on stderr as it is taken: a soak cut off before its report still leaves them.
        print("reading " + json.dumps(reading.as_dict()), file=sys.stderr, flush=True)

    async def phase(self, stop_at: int) -> None:
        """Send requests from all clients until `stop_at` have been sent in all, or the time is up."""
        await asyncio.gather(*(self._client(stop_at) for _ in range(self.args.clients)))
        await asyncio.gather(*self._tasks)  # readings still being taken

    async def _client(self, stop_at: int) -> None:
        args = self.args
        while self.sent < stop_at and time.monotonic() < self.until:
            text = TEXTS[self.sent % len(TEXTS)]
            self.sent += 1
            try:
                ttfa, frames = await one_request(self.host, self.port, text, args.voice, args.streaming, args.timeout)
            except (TimeoutError, OSError, RuntimeError) as err:
                self.results.fail(type(err).__name__ + ": " + str(err)[:120])
                await asyncio.sleep(0.1)
            else:
                self.results.served += 1
                self.results.frames += frames
                self.results.ttfa.append(ttfa)
            if self.results.done >= self.next_reading:
                self.next_reading += args.every
                if self.sent >= stop_at or time.monotonic() >= self.until:
                    continue  # the last requests are being answered: fewer in flight, not the same load
                task = asyncio.create_task(self.read("load", self.results.done))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        args = self.args
        await self.read("start")
        if args.warmup > 0:
            await self.phase(args.warmup)
            await asyncio.sleep(args.settle)
            await self.read("warmup")
        self.next_reading = self.results.done + args.every
        await self.phase(args.requests if args.requests is not None else sys.maxsize)
        await asyncio.sleep(args.settle)  # let the server free what the last requests held
        await self.read("end")


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    uri = urlparse(args.uri)
    if uri.scheme != "tcp" or uri.hostname is None or uri.port is None:
        raise SystemExit("--uri must be tcp://HOST:PORT")
    run = Soak(args, uri.hostname, uri.port)
    await run.run()
    elapsed = time.monotonic() - run.t0
    results = run.results
    readings = sorted(run.readings, key=lambda r: (r.seconds, r.requests))
    summary = summarize(readings)
    watched = args.server_pid is not None or args.metrics is not None
    growth_failures = verdict(summary, args.limits, readings, watched) if watched else []
    p50, p95 = percentile(results.ttfa, 0.5), percentile(results.ttfa, 0.95)
    passed = results.failed == 0 and results.served > 0 and not growth_failures
    return {
        "uri": args.uri,
        "clients": args.clients,
        "streaming": args.streaming,
        "seconds": round(elapsed, 1),
        "sent": run.sent,
        "served": results.served,
        "failed": results.failed,
        "errors": results.errors,
        "requests_per_s": round(results.done / elapsed, 2) if elapsed > 0 else None,
        "audio_seconds": round(results.frames * 0.08, 1),
        "ttfa_p50_s": round(p50, 3) if p50 is not None else None,
        "ttfa_p95_s": round(p95, 3) if p95 is not None else None,
        "ttfa_mean_s": round(statistics.fmean(results.ttfa), 3) if results.ttfa else None,
        "warmup_requests": args.warmup,
        "every": args.every,
        "settle_s": args.settle,
        "limits": dataclasses.asdict(args.limits),
        "growth": summary,
        "growth_failures": growth_failures,
        "passed": passed,
        "readings": [r.as_dict() for r in readings],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m wyoming_qwen3tts.tools.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", required=True, help="tcp://HOST:PORT of the server")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--requests", type=int, help="stop after this many requests in all")
    parser.add_argument(
        "--seconds", type=float, help=f"stop sending after this long (default: {DEFAULT_SECONDS:g} without --requests)"
    )
    parser.add_argument("--streaming", action="store_true", help="stream the text as Home Assistant does")
    parser.add_argument("--server-pid", type=int, help="process id of the server (same machine): RSS, threads, fds")
    parser.add_argument("--metrics", help="the server's Prometheus URL (http://HOST:PORT/metrics): GPU memory")
    parser.add_argument("--every", type=int, default=500, help="a reading every this many requests (default 500)")
    parser.add_argument(
        "--warmup", type=int, help="requests before the baseline reading (default 5 %% of --requests, 200..half)"
    )
    parser.add_argument("--voice", default="", help="voice name (default: the server's default voice)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one request may take (default 120)")
    parser.add_argument("--settle", type=float, default=2.0, help="idle seconds before the warm-up and end readings")
    parser.add_argument("--max-rss-growth", type=float, default=Limits.rss_mib, help="MiB (default %(default)g)")
    parser.add_argument("--max-fd-growth", type=float, default=Limits.fds, help="open fds (default %(default)g)")
    parser.add_argument("--max-thread-growth", type=float, default=Limits.threads, help="default %(default)g")
    parser.add_argument("--max-gpu-growth", type=float, default=Limits.gpu_mib, help="MiB per device and kind")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.every < 1:
        parser.error("--clients and --every must be >= 1")
    if args.requests is not None and args.requests < 1:
        parser.error("--requests must be >= 1")
    if args.seconds is not None and args.seconds <= 0:
        parser.error("--seconds must be > 0")
    if args.requests is None and args.seconds is None:
        args.seconds = DEFAULT_SECONDS
    if args.warmup is None:
        args.warmup = 200 if args.requests is None else min(max(200, args.requests // 20), args.requests // 2)
    if args.warmup < 0 or (args.requests is not None and args.warmup >= args.requests):
        parser.error("--warmup must be >= 0 and fewer than --requests")
    args.limits = Limits(args.max_rss_growth, args.max_fd_growth, args.max_thread_growth, args.max_gpu_growth)
    return args


def print_text(report: dict[str, Any]) -> None:
    print(
        f"{report['clients']} clients, {report['seconds']} s, {'streaming' if report['streaming'] else 'one-shot'}, "
        f"{report['requests_per_s']} requests/s"
    )
    print(f"requests served: {report['served']}, failed: {report['failed']}, audio: {report['audio_seconds']} s")
    print(f"time to first audio: p50 {report['ttfa_p50_s']} s, p95 {report['ttfa_p95_s']} s")
    if report["growth"]:
        print(f"server, warm-up ({report['warmup_requests']} requests) -> end; slope per 1,000 requests under load:")
        for name, row in report["growth"].items():
            print(
                f"  {name:28} warm-up {row['warmup']}, end {row['end']}, max {row['max']}, "
                f"growth {row['growth']}, slope {row['slope_per_1000']}"
            )
    for reason, count in report["errors"].items():
        print(f"  {count} x {reason}")
    for failure in report["growth_failures"]:
        print(f"GROWTH: {failure}")
    print("PASS" if report["passed"] else "FAIL")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(soak(args))
    if args.json:
        print(json.dumps(report))
    else:
        print_text(report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
