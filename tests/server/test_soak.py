"""The soak tool (wyoming_qwen3tts/tools/soak.py) without a model: its growth summary and verdict on made-up
readings (a leak is caught, flat passes), its reading of the server's /metrics, its options, and --requests
counted exactly against an in-process Wyoming server that answers every request with one frame of silence.
tests/server/test_load.py runs it briefly against the real server (tiny random checkpoint, CPU)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

import pytest
from prometheus_client import generate_latest
from wyoming.event import Event, async_read_event, async_write_event

from wyoming_qwen3tts.metrics import Metrics
from wyoming_qwen3tts.tools.soak import (
    FRAME_BYTES,
    Limits,
    Reading,
    metrics_values,
    parse_args,
    proc_values,
    slope,
    soak,
    summarize,
    verdict,
)

pytestmark = pytest.mark.timeout(60)


def run_of(
    rss: list[float], fds: list[float] | None = None, threads: list[float] | None = None, every: int = 500
) -> list[Reading]:
    """A start reading, then a warm-up reading, load readings every `every` requests and an end reading, with
    the given values in that order (rss[0] is the start, rss[1] the warm-up, rss[-1] the end)."""
    n = len(rss)
    fds = fds or [20.0] * n
    threads = threads or [4.0] * n
    phases = ["start", "warmup", *["load"] * (n - 3), "end"]
    requests = [0, 500, *[500 + every * (i + 1) for i in range(n - 3)], 500 + every * (n - 3)]
    return [
        Reading(phase, count, float(i), {"rss_mib": rss[i], "fds": fds[i], "threads": threads[i]})
        for i, (phase, count) in enumerate(zip(phases, requests, strict=True))
    ]


def test_slope() -> None:
    assert slope([(0, 1.0), (1000, 3.0), (2000, 5.0)]) == pytest.approx(0.002)
    assert slope([(0, 7.0), (500, 7.0), (1000, 7.0)]) == 0
    assert slope([(500, 1.0)]) is None and slope([(500, 1.0), (500, 2.0)]) is None


def test_flat_passes() -> None:
    """Noise around a level, and a start far below it (the warm-up fills caches): the baseline is the warm-up."""
    readings = run_of([300.0, 420.0, 421.5, 419.8, 421.0, 420.4, 420.9, 420.6], fds=[10, 10, 74, 73, 75, 74, 74, 11])
    summary = summarize(readings)
    rss = summary["rss_mib"]
    assert (rss["warmup"], rss["end"], rss["max"]) == (420.0, 420.6, 421.5)
    assert rss["growth"] == pytest.approx(0.6) and abs(rss["slope_per_1000"] or 0) < 1
    assert summary["fds"]["growth"] == 1 and summary["fds"]["max"] == 75  # the load's connections, closed at the end
    assert summary["threads"] == {"warmup": 4, "end": 4, "max": 4, "growth": 0, "slope_per_1000": 0}
    assert verdict(summary, Limits(), readings, watched=True) == []


def test_leaks_are_caught() -> None:
    steps = range(22)  # start, warm-up, 19 load readings (every 500 requests up to 10,000), end
    leak = [400.0 + 5 * i for i in steps]  # 5 MiB per 500 requests
    readings = run_of(leak)
    summary = summarize(readings)
    assert summary["rss_mib"]["slope_per_1000"] == pytest.approx(10)
    assert summary["rss_mib"]["growth"] == pytest.approx(100)
    failures = verdict(summary, Limits(), readings, watched=True)
    assert len(failures) == 1 and failures[0].startswith("rss_mib grew by 100"), failures
    assert verdict(summary, Limits(rss_mib=128), readings, watched=True) == []  # within a looser limit
    # One fd or thread more per 500 requests: over their small tolerance by the end.
    readings = run_of([400.0] * 22, fds=[10.0 + i for i in steps], threads=[4.0 + (i > 10) * 3 for i in steps])
    failures = verdict(summarize(readings), Limits(), readings, watched=True)
    assert [f.split(" ")[0] for f in failures] == ["fds", "threads"], failures
    # GPU memory, per device and kind.
    for r, extra in zip(readings, steps, strict=True):
        r.values |= {"gpu_allocated_mib:cuda:0": 1000.0, "gpu_reserved_mib:cuda:0": 2000.0 + 10 * extra}
    failures = verdict(summarize(readings), Limits(fds=100, threads=10), readings, watched=True)
    assert len(failures) == 1 and failures[0].startswith("gpu_reserved_mib:cuda:0 grew by 200"), failures


def test_unreadable_server_fails() -> None:
    readings = run_of([400.0, 400.0, 400.0, 400.0])
    readings[-1] = Reading("end", 1000, 9.0, {}, ["/proc/4242: FileNotFoundError: gone"])
    failures = verdict(summarize(readings), Limits(), readings, watched=True)
    assert any("no warm-up or end reading" in f for f in failures) and any("gone" in f for f in failures)
    nothing = [Reading("start", 0, 0.0, {}, ["metrics: URLError"]), Reading("end", 9, 1.0, {}, ["metrics: URLError"])]
    assert "nothing could be read from the server" in verdict(summarize(nothing), Limits(), nothing, watched=True)


def test_readings_from_the_servers_metrics() -> None:
    """The server's own /metrics carries RSS, fds and threads (prometheus_client's process collector and
    qwen3tts_process_threads); GPU memory per device comes from qwen3tts_gpu_memory_bytes where torch.cuda runs."""
    values = metrics_values(generate_latest(Metrics().registry).decode())
    mine = proc_values(os.getpid())
    assert set(values) == {"rss_mib", "fds", "threads"} == set(mine)
    assert values["threads"] >= 1 and values["fds"] >= 3 and abs(values["rss_mib"] - mine["rss_mib"]) < 64
    gpu = (
        'qwen3tts_gpu_memory_bytes{device="cuda:0",kind="allocated"} 1048576.0\n'
        'qwen3tts_gpu_memory_bytes{device="cuda:0",kind="reserved"} 4194304.0\n'
        'qwen3tts_gpu_memory_bytes{device="cuda:0",kind="total"} 1.5e+11\n'
        'qwen3tts_gpu_memory_bytes{device="cuda:1",kind="allocated"} 0.0\n'
    )
    assert metrics_values(gpu) == {
        "gpu_allocated_mib:cuda:0": 1.0,
        "gpu_reserved_mib:cuda:0": 4.0,
        "gpu_allocated_mib:cuda:1": 0.0,
    }


def test_options() -> None:
    uri = ["--uri", "tcp://127.0.0.1:1"]
    assert parse_args(uri).seconds == 30 and parse_args(uri).warmup == 200  # no --requests: 30 s, as before
    assert parse_args([*uri, "--requests", "10000"]).warmup == 500  # 5 %
    assert parse_args([*uri, "--requests", "1000"]).warmup == 200  # at least 200
    assert parse_args([*uri, "--requests", "100"]).warmup == 50  # at most half
    assert parse_args([*uri, "--requests", "100"]).seconds is None  # --requests alone: no time limit
    limits = parse_args([*uri, "--max-rss-growth", "16", "--max-fd-growth", "0", "--max-gpu-growth", "8"]).limits
    assert limits == Limits(rss_mib=16, fds=0, threads=2, gpu_mib=8)
    for bad in (["--requests", "0"], ["--requests", "10", "--warmup", "10"], ["--every", "0"], ["--clients", "0"]):
        with pytest.raises(SystemExit):
            parse_args([*uri, *bad])


class SilentServer:
    """A Wyoming server that answers each `synthesize` with one frame of silence, counting the requests."""

    def __init__(self) -> None:
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (event := await async_read_event(reader)) is not None:
                if event.type == "synthesize":
                    self.requests += 1
                    audio = {"rate": 24000, "width": 2, "channels": 1}
                    await asyncio.sleep(0.002)
                    await async_write_event(Event("audio-start", audio), writer)
                    await async_write_event(Event("audio-chunk", audio, payload=bytes(FRAME_BYTES)), writer)
                    await async_write_event(Event("audio-stop"), writer)
        finally:
            writer.close()

    async def __aenter__(self) -> SilentServer:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def silent() -> AsyncIterator[SilentServer]:
    async with SilentServer() as server:
        yield server


async def test_requests_stop_at_n(silent: SilentServer, capsys: pytest.CaptureFixture[str]) -> None:
    """--requests 23 from 5 clients: exactly 23 sent and answered; the warm-up reading after 4, load readings
    every 5 while all clients send (9 and 14; by 19 the last requests are out), the end reading after 23; each
    reading also goes to stderr as it is taken."""
    args = parse_args(
        [
            "--uri",
            f"tcp://127.0.0.1:{silent.port}",
            "--clients",
            "5",
            "--requests",
            "23",
            "--warmup",
            "4",
            "--every",
            "5",
            "--settle",
            "0",
            "--server-pid",
            str(os.getpid()),  # the silent server runs in this process
        ]
    )
    report = await soak(args)
    assert (report["sent"], report["served"], report["failed"], silent.requests) == (23, 23, 0, 23), report
    assert [(r["phase"], r["requests"]) for r in report["readings"]] == [
        ("start", 0),
        ("warmup", 4),
        ("load", 9),
        ("load", 14),
        ("end", 23),
    ]
    assert all({"rss_mib", "fds", "threads"} <= set(r) for r in report["readings"])
    assert set(report["growth"]) == {"rss_mib", "fds", "threads"} and report["passed"], report
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("reading ")]
    assert [json.loads(line.removeprefix("reading ")) for line in lines] == report["readings"]
    # --seconds still bounds a run: it ends long before 10,000 one-frame requests are answered.
    args = parse_args(
        ["--uri", f"tcp://127.0.0.1:{silent.port}", "--requests", "10000", "--seconds", "0.5", "--settle", "0"]
    )
    report = await soak(args)
    assert 0 < report["sent"] < 10_000 and report["sent"] == report["served"] and report["passed"], report
