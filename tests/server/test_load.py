"""Load on the real engine (tiny random checkpoint, CPU): 32 clients at once each get complete,
well-ordered audio and none is lost; the soak tool runs briefly, stops at --requests and reads the
server's growth from /proc and /metrics (its logic on made-up readings: tests/server/test_soak.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from reliability_support import Raw, Server, check_answer, wait_quiet
from tiny_server import start_tiny
from wyoming.event import Event

pytestmark = pytest.mark.timeout(420)

CLIENTS = 32
MAX_FRAMES = 2


@pytest.fixture(scope="module")
def http_port() -> int:
    """The real server's HTTP side: /metrics, for the soak tool."""
    return free_port()


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, http_port: int) -> Iterator[Server]:
    # 32 requests wait for the one slot here: the queue limit (4 by default) would refuse most of them.
    queue = ["--max-queued-streams", str(CLIENTS)]
    frames = ["--max-frames", str(MAX_FRAMES), "--first-chunk-frames", "1", "--chunk-frames", "1", "--greedy"]
    http = ["--backend", "torch", "--http", f"tcp://127.0.0.1:{http_port}"]
    server = start_tiny(tmp_path_factory.mktemp("load"), tiny_checkpoint, *queue, *frames, *http, name="load")
    yield server
    assert server.stop() == 0


async def one_client(port: int, n: int) -> tuple[int, float, bool]:
    streaming = n % 2 == 1
    voice = {"name": ["ryan", "vivian", "sohee", "aiden"][n % 4]}
    text = f"Client number {n} says hello."
    client = await Raw.connect(port)
    try:
        t0 = time.monotonic()
        if streaming:
            await client.event(Event(type="synthesize-start", data={"voice": voice}))
            for i in range(0, len(text), 5):
                await client.event(Event(type="synthesize-chunk", data={"text": text[i : i + 5]}))
            await client.event(Event(type="synthesize", data={"text": text, "voice": voice}))
            await client.event(Event(type="synthesize-stop"))
        else:
            await client.event(Event(type="synthesize", data={"text": text, "voice": voice}))
        events = await client.read_until("synthesize-stopped" if streaming else "audio-stop", timeout=300)
        ttfa = time.monotonic() - t0
        frames = check_answer(events, streaming)
        try:  # nothing after the answer: the server now waits for the next request
            extra = await client.read(0.2)
        except TimeoutError:
            extra = None
        assert extra is None, extra
    finally:
        await client.close()
    return frames, ttfa, streaming


async def test_32_clients_at_once_all_answered(real: Server) -> None:
    base = await wait_quiet(real.port)
    t0 = time.monotonic()
    results = await asyncio.wait_for(asyncio.gather(*(one_client(real.port, n) for n in range(CLIENTS))), 360)
    elapsed = time.monotonic() - t0
    assert len(results) == CLIENTS
    for frames, _, _ in results:
        assert 1 <= frames <= MAX_FRAMES, frames  # one sentence each; whole frames (checked above)
    after = await wait_quiet(real.port)
    assert after["exchanges"] == 0 and after["connections"] == 1, after
    assert after["os_threads"] == base["os_threads"], (base, after)
    log = real.log_text()
    assert log.count("Spoke voice=") >= CLIENTS and "Traceback" not in log
    print(f"\n{CLIENTS} clients: all answered in {elapsed:.1f} s; RSS {base['rss_kb']} -> {after['rss_kb']} kB")


def test_soak_tool_reports_numbers(real: Server, http_port: int) -> None:
    """--requests 12 from 3 clients, a reading every 3 after a warm-up of 3: exactly 12 answered, RSS, threads
    and fds from /proc and the same from /metrics, nothing grown, exit status 0."""
    cmd = [
        sys.executable,
        "-m",
        "wyoming_qwen3tts.tools.soak",
        "--uri",
        f"tcp://127.0.0.1:{real.port}",
        "--clients",
        "3",
        "--requests",
        "12",
        "--warmup",
        "3",
        "--every",
        "3",
        "--settle",
        "0.5",
        "--streaming",
        "--server-pid",
        str(real.pid),
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert (report["sent"], report["served"], report["failed"]) == (12, 12, 0), report
    assert 0 < report["ttfa_p50_s"] <= report["ttfa_p95_s"], report
    phases = [(r["phase"], r["requests"]) for r in report["readings"]]
    assert phases[:2] == [("start", 0), ("warmup", 3)] and phases[-1] == ("end", 12), phases
    assert {p for p, _ in phases[2:-1]} <= {"load"}, phases
    growth = report["growth"]
    assert set(growth) == {"rss_mib", "threads", "fds"}, growth
    assert growth["rss_mib"]["warmup"] > 10 and growth["rss_mib"]["growth"] < 64, growth
    assert growth["threads"]["growth"] <= 2 and growth["fds"]["growth"] <= 2, growth
    assert report["growth_failures"] == [] and report["passed"], report
    # The server's /metrics alone (a server in a container): the same quantities, read by the server itself.
    metrics = cmd[:-3] + ["--metrics", f"http://127.0.0.1:{http_port}/metrics", "--requests", "6"]
    text = subprocess.run(metrics, capture_output=True, text=True, timeout=200)
    assert text.returncode == 0 and "requests served: 6, failed: 0" in text.stdout, text.stdout + text.stderr
    for name in ("rss_mib", "threads", "fds"):
        assert f"  {name} " in text.stdout, text.stdout
    assert text.stdout.rstrip().endswith("PASS"), text.stdout
    print("\n" + json.dumps({k: v for k, v in report.items() if k != "readings"}))


def test_soak_tool_counts_failures() -> None:
    """Against a port where nobody listens every request fails and the exit status says so."""
    cmd = [
        sys.executable,
        "-m",
        "wyoming_qwen3tts.tools.soak",
        "--uri",
        f"tcp://127.0.0.1:{free_port()}",
        "--clients",
        "2",
        "--seconds",
        "1",
        "--json",
        "--settle",
        "0",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["served"] == 0 and report["failed"] >= 2 and report["readings"][0]["phase"] == "start"
    assert not report["passed"] and report["growth"] == {}  # nothing to read without --server-pid or --metrics
