"""A fixed set of requests against a running server, over Wyoming, HTTP or both, and their latencies.

    python -m wyoming_qwen3tts.tools.load --wyoming tcp://127.0.0.1:10200 [--http http://127.0.0.1:8000]
        [--api-key KEY] [--clients 8] [--protocol wyoming|http|both] [--arrivals simultaneous|poisson]
        [--rate 4] [--seed 0] [--rounds 1] [--streaming] [--voice ryan] [--timeout 120] [--json]
        [--http-client aiohttp|openai] [--warmup 0] [--processes 1] [--metrics http://127.0.0.1:8000/metrics]

Sends --clients requests (--rounds times over; each round starts when the previous one ended), all
at once or as a Poisson process of --rate requests per second.  Wyoming requests go one connection
each, as Home Assistant sends them (--streaming: synthesize-start/chunk/stop); HTTP requests are
POST /v1/audio/speech with response_format "pcm" and stream_format "audio", the body read chunk by
chunk (--http-client openai: the same request through the official `openai` package's AsyncOpenAI,
audio.speech.with_streaming_response, as an OpenAI-speaking client sends it; install `openai`); with --protocol both the requests alternate, half on each.  Every answer is checked
(Wyoming: audio-start, audio-chunk..., audio-stop[, synthesize-stopped], 24 kHz 16-bit mono; HTTP:
status 200; both: more than no audio, whole 80 ms frames) and timed from the request's send to
its first audio bytes (TTFA) and to its end (completion; for Wyoming this includes the
connect).  Reported per protocol and overall: requests, failures (with reasons), TTFA and
completion p50/p95/max in ms, seconds of audio and audio frames per second of wall time, and whether
the streamed audio kept ahead of playback (the requests whose chunks fell behind a player started at
their first chunk, and by how much: p95 and worst ms); when both protocols ran, HTTP's TTFA p50/p95
minus Wyoming's.  Every request sent is counted as served or failed.  --warmup N sends N requests per
protocol one after another through the same clients before the timed rounds, untimed: a long-lived
client (an app's AsyncOpenAI) is warm when a burst comes, and the openai package's first request
costs it ~80 ms of its own imports and setup; warm-up requests are
reported apart and a failed one fails the run.  --processes P spreads the clients over P processes
(each its own event loop and clients, their rounds started together): one process's client CPU, the
openai package's above all, otherwise delays its other requests (16 at once through one warm
AsyncOpenAI: first bytes at p50 23 ms from a server that answers at once, 8 ms through aiohttp, on 2
cores).  --metrics URL scrapes the server's Prometheus endpoint before and after the load (its warm-up
included) and reports what the decode pipeline did meanwhile (decode_counters.py): decode and codec frames per
second, stream frames per step, admissions, and the share of the time the scheduler and the codec worker waited
for the GPU.  Exit status 0 when every request succeeded, 1 otherwise.  Point it only at servers you run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .soak import FRAME_BYTES, TEXTS, one_request, percentile, scrape

FRAME_SECONDS = 0.08
PROTOCOLS = ("wyoming", "http")


@dataclass
class Record:
    """One request: which protocol, when it was sent (s after the run's start), and how it went."""

    protocol: str
    index: int  # 0 .. clients-1 within its round
    round: int
    sent_at: float = 0.0
    ok: bool = False
    reason: str = ""  # why it failed ("" when it succeeded)
    ttfa_s: float | None = None  # send -> first audio bytes
    total_s: float | None = None  # send -> end of the answer
    frames: int = 0
    stall_s: float = 0.0  # how far its audio fell behind a player started at the first chunk (playback_deficit_s)


def playback_deficit_s(arrivals: Sequence[tuple[float, int]]) -> float:
    """How long a player that starts with the first chunk and never pauses would have run out of audio, at worst:
    the largest (arrival of chunk k - arrival of the first) - (audio before chunk k), or 0 when the audio always
    came ahead of playback. `arrivals`: (time s, bytes of 24 kHz s16le) in the order received."""
    if not arrivals:
        return 0.0
    start, received, worst = arrivals[0][0], 0, 0.0
    for at, size in arrivals:
        worst = max(worst, (at - start) - received / FRAME_BYTES * FRAME_SECONDS)
        received += size
    return worst


def _ms(value: float | None) -> float | None:
    return round(value * 1000, 1) if value is not None else None


def _stats(records: list[Record], wall_s: float) -> dict[str, Any]:
    served = [r for r in records if r.ok]
    ttfa = [r.ttfa_s for r in served if r.ttfa_s is not None]
    total = [r.total_s for r in served if r.total_s is not None]
    frames = sum(r.frames for r in served)
    stalls = [r.stall_s for r in served]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.reason] = errors.get(r.reason, 0) + 1
    return {
        "count": len(records),
        "served": len(served),
        "failed": len(records) - len(served),
        "errors": errors,
        "ttfa_p50_ms": _ms(percentile(ttfa, 0.5)),
        "ttfa_p95_ms": _ms(percentile(ttfa, 0.95)),
        "ttfa_max_ms": _ms(max(ttfa)) if ttfa else None,
        "completion_p50_ms": _ms(percentile(total, 0.5)),
        "completion_p95_ms": _ms(percentile(total, 0.95)),
        "completion_max_ms": _ms(max(total)) if total else None,
        "audio_frames": frames,
        "audio_seconds": round(frames * FRAME_SECONDS, 2),
        "frames_per_s": round(frames / wall_s, 2) if wall_s > 0 else None,
        # Streaming kept ahead of playback? The requests whose audio fell behind a player started at their first
        # chunk, and by how much (p95 and worst, ms).
        "stalled": sum(1 for x in stalls if x > 0),
        "stall_p95_ms": _ms(percentile(stalls, 0.95)),
        "stall_max_ms": _ms(max(stalls)) if stalls else None,
    }


def summarize(records: Sequence[Record], wall_s: float) -> dict[str, Any]:
    """The report of a run from its per-request records and its wall time (pure: no I/O).

    Keys: sent, served, failed, wall_s, overall (the stats of every record), protocols (the stats
    per protocol that had requests) and, when both protocols had served requests,
    http_minus_wyoming_ttfa_ms {p50, p95}.
    """
    records = list(records)
    report: dict[str, Any] = {
        "sent": len(records),
        "served": sum(r.ok for r in records),
        "failed": sum(not r.ok for r in records),
        "wall_s": round(wall_s, 3),
        "overall": _stats(records, wall_s),
        "protocols": {
            p: _stats([r for r in records if r.protocol == p], wall_s)
            for p in PROTOCOLS
            if any(r.protocol == p for r in records)
        },
    }
    http, wyoming = report["protocols"].get("http"), report["protocols"].get("wyoming")
    if http and wyoming and http["served"] and wyoming["served"]:
        report["http_minus_wyoming_ttfa_ms"] = {
            q: round(http[f"ttfa_{q}_ms"] - wyoming[f"ttfa_{q}_ms"], 1) for q in ("p50", "p95")
        }
    return report


# -- requests ---------------------------------------------------------------------------------------


async def wyoming_request(record: Record, host: str, port: int, text: str, args: argparse.Namespace) -> None:
    """One Wyoming request on its own connection (soak.one_request checks the answer)."""
    t0 = time.monotonic()
    arrivals: list[tuple[float, int]] = []
    async with asyncio.timeout(args.timeout):  # the connect too
        ttfa, frames = await one_request(host, port, text, args.voice, args.streaming, args.timeout, arrivals)
    record.total_s = time.monotonic() - t0
    record.stall_s = playback_deficit_s(arrivals)
    record.ttfa_s = min(ttfa, record.total_s)  # one_request starts its clock after the connect
    if frames <= 0:
        raise RuntimeError("no audio")
    record.frames = frames


async def http_request(
    record: Record, session: aiohttp.ClientSession, url: str, text: str, args: argparse.Namespace
) -> None:
    """One POST /v1/audio/speech, raw 24 kHz s16le mono streamed as it is decoded."""
    body: dict[str, str] = {"model": "qwen3-tts", "input": text, "response_format": "pcm", "stream_format": "audio"}
    if args.voice:
        body["voice"] = args.voice
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    t0 = time.monotonic()
    async with asyncio.timeout(args.timeout):
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                detail = (await response.text(errors="replace"))[:200]
                try:
                    detail = json.loads(detail)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    pass
                raise RuntimeError(f"HTTP {response.status}: {detail}")
            size = await _read_audio(record, response.content.iter_any(), t0)
    _finish_http(record, size, t0)


async def _read_audio(record: Record, chunks: AsyncIterator[bytes], t0: float) -> int:
    """Bytes of audio in all, the first chunk's arrival recorded as the request's TTFA and every chunk's in its stall
    (playback_deficit_s: the body's chunks as the HTTP stack hands them over)."""
    size = 0
    arrivals: list[tuple[float, int]] = []
    async for data in chunks:
        if not data:
            continue
        if record.ttfa_s is None:
            record.ttfa_s = time.monotonic() - t0
        arrivals.append((time.monotonic(), len(data)))
        size += len(data)
    record.stall_s = playback_deficit_s(arrivals)
    return size


def _finish_http(record: Record, size: int, t0: float) -> None:
    """The request's completion and frames; RuntimeError for no audio or a partial frame."""
    record.total_s = time.monotonic() - t0
    if size == 0:
        raise RuntimeError("no audio")
    if size % FRAME_BYTES:
        raise RuntimeError(f"{size} bytes of audio is not whole frames")
    record.frames = size // FRAME_BYTES


async def openai_request(record: Record, client: Any, text: str, args: argparse.Namespace) -> None:
    """http_request through the `openai` package: the same body, streamed by its own HTTP stack."""
    t0 = time.monotonic()
    async with asyncio.timeout(args.timeout):
        async with client.audio.speech.with_streaming_response.create(
            model="qwen3-tts",
            voice=args.voice or "",
            input=text,
            response_format="pcm",
            # No --voice: null, the server's default voice (the package insists on a value of its own).
            extra_body={"stream_format": "audio", **({} if args.voice else {"voice": None})},
        ) as response:
            size = await _read_audio(record, response.iter_bytes(), t0)
    _finish_http(record, size, t0)


def openai_client(args: argparse.Namespace) -> Any:
    """An AsyncOpenAI client of the server's HTTP API (SystemExit when the `openai` package is missing)."""
    try:
        from openai import AsyncOpenAI
    except ImportError as err:
        raise SystemExit("--http-client openai needs the openai package (pip install openai)") from err
    base = args.speech_url.removesuffix("/audio/speech")
    return AsyncOpenAI(base_url=base, api_key=args.api_key or "unused", max_retries=0, timeout=args.timeout)


async def _one(record: Record, delay: float, t_run: float, session: Any, args: argparse.Namespace) -> None:
    if delay > 0:
        await asyncio.sleep(delay)
    record.sent_at = time.monotonic() - t_run
    text = TEXTS[(record.index + record.round) % len(TEXTS)]
    try:
        if record.protocol == "wyoming":
            await wyoming_request(record, args.wyoming_host, args.wyoming_port, text, args)
        else:
            if args.http_client == "openai":
                await openai_request(record, session, text, args)
            else:
                assert session is not None
                await http_request(record, session, args.speech_url, text, args)
        record.ok = True
    except Exception as err:  # every failure is counted, with its reason; none is lost
        record.ok = False
        name = "TimeoutError" if isinstance(err, TimeoutError) else type(err).__name__
        record.reason = f"{record.protocol}: {name}: {str(err)[:160]}".rstrip(": ")


def protocol_of(i: int, protocol: str) -> str:
    """Request i's protocol: both alternates, Wyoming first (half on each; Wyoming has the odd one)."""
    return PROTOCOLS[i % 2] if protocol == "both" else protocol


def arrival_offsets(n: int, arrivals: str, rate: float, rng: random.Random) -> list[float]:
    """Seconds after the round's start at which each request goes out."""
    if arrivals == "simultaneous":
        return [0.0] * n
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


# The decode pipeline's counters on /metrics (wyoming_qwen3tts/metrics.py, decode_counters.py) by their samples' names.
PIPELINE_COUNTERS = {
    "qwen3tts_decode_steps_total": "steps",
    "qwen3tts_decode_frames_total": "decode_frames",
    "qwen3tts_decode_admissions_total": "admissions",
    "qwen3tts_decode_admitted_streams_total": "admitted",
    "qwen3tts_decode_gpu_wait_seconds_total": "scheduler_wait_s",
    "qwen3tts_codec_calls_total": "codec_calls",
    "qwen3tts_codec_frames_total": "codec_frames",
    "qwen3tts_codec_gpu_wait_seconds_total": "codec_wait_s",
}


def pipeline_counters(text: str) -> dict[str, float]:
    """The decode pipeline's counters from a Prometheus scrape (absent ones are left out)."""
    return {
        PIPELINE_COUNTERS[sample.name]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in PIPELINE_COUNTERS
    }


def pipeline_report(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """What the pipeline did between two scrapes `seconds` apart: rates, stream frames a step, wait shares."""
    d = {k: after[k] - before[k] for k in PIPELINE_COUNTERS.values() if k in after and k in before}
    per_s = lambda k: round(d[k] / seconds, 1) if k in d and seconds > 0 else None  # noqa: E731
    share = lambda k: round(d[k] / seconds, 3) if k in d and seconds > 0 else None  # noqa: E731
    return {
        "seconds": round(seconds, 3),
        "decode_frames_per_s": per_s("decode_frames"),
        "codec_frames_per_s": per_s("codec_frames"),
        "steps_per_s": per_s("steps"),
        "frames_per_step": round(d["decode_frames"] / d["steps"], 2) if d.get("steps") else None,
        "admissions": d.get("admissions"),
        "admitted": d.get("admitted"),
        "codec_calls": d.get("codec_calls"),
        "scheduler_gpu_wait_share": share("scheduler_wait_s"),
        "codec_gpu_wait_share": share("codec_wait_s"),
    }


async def _scrape_pipeline(url: str) -> dict[str, float]:
    return pipeline_counters(await asyncio.to_thread(scrape, url))


async def run_load(args: argparse.Namespace) -> tuple[dict[str, Any], list[Record]]:
    """Runs the whole load; returns the report (summarize's, plus the settings) and the records."""
    _resolve(args)
    before: dict[str, float] | None = None
    if args.metrics:
        before = await _scrape_pipeline(args.metrics)
    scraped_at = time.monotonic()
    if args.processes == 1:
        runs = [await _drive(args, 0, None)]
    else:
        runs = await asyncio.get_running_loop().run_in_executor(None, _drive_in_processes, args)
    records = sorted((r for run in runs for r in run.records), key=lambda r: (r.round, r.index))
    warmup = [r for run in runs for r in run.warmup]
    wall = max(run.ended for run in runs) - min(run.started for run in runs)
    report = summarize(records, wall)
    assert report["served"] + report["failed"] == report["sent"] == args.clients * args.rounds
    settings = {
        "wyoming": args.wyoming,
        "http": args.http,
        "http_client": args.http_client if args.protocol != "wyoming" else None,
        "protocol": args.protocol,
        "clients": args.clients,
        "rounds": args.rounds,
        "arrivals": args.arrivals,
        "rate": args.rate if args.arrivals == "poisson" else None,
        "seed": args.seed,
        "streaming": args.streaming,
        "voice": args.voice or None,
        "warmup": args.warmup,
        "processes": args.processes,
        "metrics": args.metrics,
    }
    if warmup:
        stats = _stats(warmup, 0.0)
        report["warmup"] = {"sent": len(warmup), **{k: stats[k] for k in ("served", "failed", "errors")}}
    if before is not None:
        after = await _scrape_pipeline(args.metrics)
        report["pipeline"] = pipeline_report(before, after, time.monotonic() - scraped_at)
    return {"settings": settings, **report}, records


@dataclass
class _Run:
    """What one process of the load did: its timed records, its warm-up's, and its first round's start and its end
    (time.monotonic: one clock for every process of the machine)."""

    records: list[Record]
    warmup: list[Record]
    started: float
    ended: float


async def _drive(args: argparse.Namespace, shard: int, barrier: Any) -> _Run:
    """The requests of the load that are this process's (index % processes == shard), with its own clients: warmed
    up, then round by round, every process starting each round together at `barrier` (None: one process)."""
    rng = random.Random(args.seed)  # the same arrivals in every process; each sends its share of them
    records: list[Record] = []
    session: Any = None  # the HTTP client: an aiohttp session, or an AsyncOpenAI client
    if args.protocol != "wyoming":
        if args.http_client == "openai":
            session = openai_client(args)
        else:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
            )
    try:
        warmup = await _warm_up(session, args)
        started = 0.0
        for k in range(args.rounds):
            offsets = arrival_offsets(args.clients, args.arrivals, args.rate, rng)
            mine = range(shard, args.clients, args.processes)
            batch = [Record(protocol_of(i, args.protocol), i, k) for i in mine]
            records.extend(batch)
            if barrier is not None:
                await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
            t_round = time.monotonic()
            started = started or t_round
            await asyncio.gather(
                *(_one(r, t_round + offsets[r.index] - time.monotonic(), started, session, args) for r in batch)
            )
        return _Run(records, warmup, started, time.monotonic())
    finally:
        if session is not None:
            await session.close()  # both clients close with an awaited close()


def _drive_in_processes(args: argparse.Namespace) -> list[_Run]:
    """_drive in args.processes fresh processes (each its own interpreter, event loop and clients, as that many
    separate apps would be), their rounds started together."""
    # By the module's own name, also when this runs as __main__ (python -m), so that the workers import it.
    drive = importlib.import_module("wyoming_qwen3tts.tools.load")._drive_process
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(args.processes, mp_context=context) as pool:
        barrier = manager.Barrier(args.processes)
        return list(pool.map(drive, [(args, shard, barrier) for shard in range(args.processes)]))


def _drive_process(job: tuple[argparse.Namespace, int, Any]) -> _Run:
    return asyncio.run(_drive(*job))


async def _warm_up(session: Any, args: argparse.Namespace) -> list[Record]:
    """args.warmup untimed requests per protocol of the load, one at a time, through the load's own clients."""
    records = []
    for protocol in PROTOCOLS if args.protocol == "both" else (args.protocol,):
        for i in range(args.warmup):
            record = Record(protocol, i, -1)
            await _one(record, 0.0, time.monotonic(), session, args)
            records.append(record)
    return records


def _resolve(args: argparse.Namespace) -> None:
    """Host, port and URL from --wyoming and --http (SystemExit when one is wrong or missing)."""
    if args.protocol != "http":
        if not args.wyoming:
            raise SystemExit("--wyoming tcp://HOST:PORT is needed for --protocol wyoming or both")
        uri = urlparse(args.wyoming)
        if uri.scheme != "tcp" or uri.hostname is None or uri.port is None:
            raise SystemExit("--wyoming must be tcp://HOST:PORT")
        args.wyoming_host, args.wyoming_port = uri.hostname, uri.port
    if args.protocol != "wyoming":
        if not args.http:
            raise SystemExit("--http http://HOST:PORT is needed for --protocol http or both")
        uri = urlparse(args.http)
        if uri.scheme not in ("http", "https", "tcp") or uri.hostname is None:
            raise SystemExit("--http must be http://HOST:PORT")
        scheme = "http" if uri.scheme == "tcp" else uri.scheme
        args.speech_url = f"{scheme}://{uri.netloc}{uri.path.rstrip('/')}/v1/audio/speech"


# -- command line ------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m wyoming_qwen3tts.tools.load", description=__doc__.split("\n\n")[0])
    p.add_argument("--wyoming", help="tcp://HOST:PORT of the server's Wyoming side")
    p.add_argument("--http", help="http://HOST:PORT of the server's HTTP API (needed for --protocol http/both)")
    p.add_argument("--api-key", help="the HTTP API's key, if it has one")
    p.add_argument("--clients", type=int, default=8, help="requests per round (default 8)")
    p.add_argument(
        "--protocol",
        choices=("wyoming", "http", "both"),
        default=None,
        help="where the requests go (default: both with --http, else wyoming)",
    )
    p.add_argument(
        "--arrivals",
        choices=("simultaneous", "poisson"),
        default="simultaneous",
        help="all at once, or a Poisson process",
    )
    p.add_argument("--rate", type=float, default=2.0, help="requests per second for --arrivals poisson (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals (default 0)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole set this many times (default 1)")
    p.add_argument("--voice", default="", help="voice name (default: the server's default voice)")
    p.add_argument("--streaming", action="store_true", help="Wyoming: stream the text as Home Assistant does")
    p.add_argument("--timeout", type=float, default=120, help="seconds one request may take (default 120)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument(
        "--http-client",
        choices=("aiohttp", "openai"),
        default="aiohttp",
        help="HTTP requests through aiohttp (default) or the official openai package (AsyncOpenAI)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="untimed requests per protocol and process before the timed rounds (default 0)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="spread the clients over this many processes, each with its own clients and event loop (default 1)",
    )
    p.add_argument(
        "--metrics",
        help="the server's /metrics URL: report what its decode pipeline did during the load (rates, waits)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.protocol is None:
        args.protocol = "both" if args.http else "wyoming"
    if args.clients < 1 or args.rounds < 1 or args.timeout <= 0 or args.warmup < 0 or args.processes < 1:
        p.error("--clients, --rounds and --processes must be >= 1, --warmup >= 0 and --timeout > 0")
    args.processes = min(args.processes, args.clients)
    if args.arrivals == "poisson" and args.rate <= 0:
        p.error("--rate must be > 0")
    return args


def format_table(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"{s['clients']} requests x {s['rounds']} round(s), {s['protocol']}, {s['arrivals']}"
        + (f" at {s['rate']}/s" if s["rate"] else "")
        + (", streaming" if s["streaming"] else "")
        + f"; wall {report['wall_s']} s",
        f"sent {report['sent']}, served {report['served']}, failed {report['failed']}"
        + (f"; warm-up {report['warmup']['sent']}, failed {report['warmup']['failed']}" if "warmup" in report else ""),
        "",
    ]
    cols = [
        "count",
        "failed",
        "ttfa_p50_ms",
        "ttfa_p95_ms",
        "ttfa_max_ms",
        "completion_p50_ms",
        "completion_p95_ms",
        "completion_max_ms",
        "audio_seconds",
        "frames_per_s",
    ]
    heads = ["n", "failed", "TTFA p50", "p95", "max", "done p50", "p95", "max", "audio s", "frames/s"]
    rows = [(name, report["protocols"][name]) for name in PROTOCOLS if name in report["protocols"]] + [
        ("overall", report["overall"])
    ]
    lines.append(f"{'':9}" + "".join(f"{h:>10}" for h in heads))
    for name, st in rows:
        lines.append(f"{name:9}" + "".join(f"{'-' if st[c] is None else st[c]:>10}" for c in cols))
    lines.append("(times in ms)")
    o = report["overall"]
    if o["served"]:
        lines.append(
            f"behind playback (a player started at the first chunk): {o['stalled']} of {o['served']} requests, "
            f"p95 {o['stall_p95_ms']} ms, worst {o['stall_max_ms']} ms"
        )
    diff = report.get("http_minus_wyoming_ttfa_ms")
    if diff:
        lines.append(f"HTTP - Wyoming TTFA: p50 {diff['p50']:+} ms, p95 {diff['p95']:+} ms")
    for reason, count in report["overall"]["errors"].items():
        lines.append(f"  {count} x {reason}")
    pipe = report.get("pipeline")
    if pipe:
        lines.append(
            f"pipeline over {pipe['seconds']} s: decode {pipe['decode_frames_per_s']} frames/s "
            f"({pipe['frames_per_step']} a step, {pipe['steps_per_s']} steps/s), codec {pipe['codec_frames_per_s']} "
            f"frames/s in {pipe['codec_calls']} calls, {pipe['admitted']} streams in {pipe['admissions']} admissions; "
            f"waiting for the GPU: scheduler {pipe['scheduler_gpu_wait_share']}, codec {pipe['codec_gpu_wait_share']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report, _ = asyncio.run(run_load(args))
    print(json.dumps(report) if args.json else format_table(report))
    warm_ok = report.get("warmup", {}).get("failed", 0) == 0
    return 0 if report["failed"] == 0 and report["served"] > 0 and warm_ok else 1


if __name__ == "__main__":
    sys.exit(main())
