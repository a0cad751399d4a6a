"""Bounded load/soak test against a running server.

    python -m wyoming_qwen3tts.tools.soak --uri tcp://127.0.0.1:10200 --clients 8 --seconds 60 \\
        [--streaming] [--server-pid PID] [--voice ryan] [--json]

N clients each send requests back to back for S seconds (one connection per request, as Home
Assistant does), check every answer (audio-start, audio-chunk..., audio-stop[, synthesize-stopped];
24 kHz 16-bit mono; whole 80 ms frames) and report requests served and failed, time to first
audio (p50/p95), and the server's memory and threads (from /proc/PID) at start and end.
Exit status 0 when every request succeeded, 1 otherwise.  Point it only at servers you run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

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


@dataclass
class Results:
    served: int = 0
    failed: int = 0
    frames: int = 0
    ttfa: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        self.failed += 1
        self.errors[reason] = self.errors.get(reason, 0) + 1


def proc_status(pid: int | None) -> dict[str, int] | None:
    """RSS (kB) and thread count of a process, from /proc (Linux)."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "Threads"):
            values[key] = int(rest.split()[0])
    return {"rss_kb": values.get("VmRSS", -1), "threads": values.get("Threads", -1)}


async def one_request(
    host: str, port: int, text: str, voice: str, streaming: bool, timeout: float
) -> tuple[float, int]:
    """One request on its own connection; returns (time to first audio chunk, frames)."""
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


async def client_loop(n: int, args: argparse.Namespace, host: str, port: int, until: float, results: Results) -> None:
    i = n
    while time.monotonic() < until:
        text = TEXTS[i % len(TEXTS)]
        i += 1
        try:
            ttfa, frames = await one_request(host, port, text, args.voice, args.streaming, args.timeout)
        except (TimeoutError, OSError, RuntimeError) as err:
            results.fail(type(err).__name__ + ": " + str(err)[:120])
            await asyncio.sleep(0.1)
            continue
        results.served += 1
        results.frames += frames
        results.ttfa.append(ttfa)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    uri = urlparse(args.uri)
    if uri.scheme != "tcp" or uri.hostname is None or uri.port is None:
        raise SystemExit("--uri must be tcp://HOST:PORT")
    results = Results()
    start_status = proc_status(args.server_pid)
    t0 = time.monotonic()
    until = t0 + args.seconds
    await asyncio.gather(*(client_loop(n, args, uri.hostname, uri.port, until, results) for n in range(args.clients)))
    elapsed = time.monotonic() - t0
    await asyncio.sleep(args.settle)  # let the server free what the last requests held
    end_status = proc_status(args.server_pid)
    p50, p95 = percentile(results.ttfa, 0.5), percentile(results.ttfa, 0.95)
    return {
        "uri": args.uri,
        "clients": args.clients,
        "streaming": args.streaming,
        "seconds": round(elapsed, 1),
        "served": results.served,
        "failed": results.failed,
        "errors": results.errors,
        "audio_seconds": round(results.frames * 0.08, 1),
        "ttfa_p50_s": round(p50, 3) if p50 is not None else None,
        "ttfa_p95_s": round(p95, 3) if p95 is not None else None,
        "ttfa_mean_s": round(statistics.fmean(results.ttfa), 3) if results.ttfa else None,
        "server_start": start_status,
        "server_end": end_status,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wyoming_qwen3tts.tools.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", required=True, help="tcp://HOST:PORT of the server")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--seconds", type=float, default=30, help="how long to send requests (default 30)")
    parser.add_argument("--streaming", action="store_true", help="stream the text as Home Assistant does")
    parser.add_argument("--server-pid", type=int, help="process id of the server, for its RSS and threads")
    parser.add_argument("--voice", default="", help="voice name (default: the server's default voice)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one request may take (default 120)")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds to wait before the final memory reading")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0:
        parser.error("--clients must be >= 1 and --seconds > 0")
    report = asyncio.run(soak(args))
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['clients']} clients, {report['seconds']} s, {'streaming' if args.streaming else 'one-shot'}")
        print(f"requests served: {report['served']}, failed: {report['failed']}, audio: {report['audio_seconds']} s")
        print(f"time to first audio: p50 {report['ttfa_p50_s']} s, p95 {report['ttfa_p95_s']} s")
        if report["server_start"] and report["server_end"]:
            s, e = report["server_start"], report["server_end"]
            print(
                f"server RSS: start {s['rss_kb'] / 1024:.1f} MiB, end {e['rss_kb'] / 1024:.1f} MiB; "
                f"threads: start {s['threads']}, end {e['threads']}"
            )
        for reason, count in report["errors"].items():
            print(f"  {count} x {reason}")
    return 0 if report["failed"] == 0 and report["served"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
