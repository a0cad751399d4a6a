"""The load tool (wyoming_qwen3tts/tools/load.py): its summary on made-up records, and a short run of it against the
real server (tiny random checkpoint, CPU) with HTTP on, both protocols, all at once and Poisson."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from reliability_support import Server
from tiny_server import start_tiny

from wyoming_qwen3tts.tools.load import (
    Record,
    format_table,
    parse_args,
    pipeline_counters,
    pipeline_report,
    playback_deficit_s,
    run_load,
    summarize,
)

pytestmark = pytest.mark.timeout(240)

STATS_KEYS = {
    "count",
    "served",
    "failed",
    "errors",
    "ttfa_p50_ms",
    "ttfa_p95_ms",
    "ttfa_max_ms",
    "completion_p50_ms",
    "completion_p95_ms",
    "completion_max_ms",
    "audio_frames",
    "audio_seconds",
    "frames_per_s",
    "stalled",
    "stall_p95_ms",
    "stall_max_ms",
}
STALL_KEYS = {"stalled", "stall_p95_ms", "stall_max_ms"}  # 0 where the audio kept ahead


def made_up(protocol: str, ttfa_ms: list[float], frames: int = 5) -> list[Record]:
    return [
        Record(protocol, i, 0, ok=True, ttfa_s=t / 1000, total_s=t / 1000 + 0.5, frames=frames)
        for i, t in enumerate(ttfa_ms)
    ]


def test_summary_of_made_up_records() -> None:
    wyoming = made_up("wyoming", [10, 20, 30, 40, 50])
    http = made_up("http", [15, 35, 45, 55, 75], frames=3)
    failed = Record("http", 5, 0, ok=False, reason="http: RuntimeError: HTTP 400: Unknown voice")
    report = summarize(wyoming + http + [failed], wall_s=2.0)
    assert (report["sent"], report["served"], report["failed"]) == (11, 10, 1)
    w, h, o = report["protocols"]["wyoming"], report["protocols"]["http"], report["overall"]
    assert set(w) == set(h) == set(o) == STATS_KEYS
    assert (w["ttfa_p50_ms"], w["ttfa_p95_ms"], w["ttfa_max_ms"]) == (30, 50, 50)
    assert (w["completion_p50_ms"], w["completion_max_ms"]) == (530, 550)
    assert (h["count"], h["served"], h["failed"]) == (6, 5, 1)
    assert h["errors"] == {"http: RuntimeError: HTTP 400: Unknown voice": 1} == o["errors"]
    assert (h["ttfa_p50_ms"], h["ttfa_p95_ms"]) == (45, 75)
    assert report["http_minus_wyoming_ttfa_ms"] == {"p50": 15, "p95": 25}
    assert (w["audio_frames"], h["audio_frames"], o["audio_frames"]) == (25, 15, 40)
    assert o["audio_seconds"] == pytest.approx(3.2) and o["frames_per_s"] == 20 and w["frames_per_s"] == 12.5
    assert o["ttfa_p50_ms"] == 35 and o["ttfa_max_ms"] == 75  # soak.percentile: index round(0.5 * 9) = 4 of the ten
    assert (o["stalled"], o["stall_max_ms"]) == (0, 0)
    wyoming[2].stall_s, http[0].stall_s = 0.04, 0.12
    stalls = summarize(wyoming + http, wall_s=2.0)
    assert (stalls["overall"]["stalled"], stalls["overall"]["stall_max_ms"]) == (2, 120)
    assert (stalls["protocols"]["wyoming"]["stalled"], stalls["protocols"]["wyoming"]["stall_p95_ms"]) == (1, 40)
    # One protocol only: no difference; nothing served: no times.
    assert "http_minus_wyoming_ttfa_ms" not in summarize(wyoming, 1.0)
    empty = summarize([failed], 1.0)
    assert empty["overall"]["ttfa_p50_ms"] is None and empty["served"] == 0 and list(empty["protocols"]) == ["http"]


def test_playback_deficit_of_chunk_arrivals() -> None:
    """80 ms chunks (3,840 bytes): the third came 200 ms after the first, with 160 ms of audio before it, so a
    player started at the first had run dry for 40 ms; chunks that keep ahead give 0, and so does no audio."""
    chunk = 3840
    assert playback_deficit_s([(10.0, chunk), (10.05, chunk), (10.2, chunk)]) == pytest.approx(0.04)
    assert playback_deficit_s([(10.0, 2 * chunk), (10.1, chunk), (10.2, chunk)]) == 0
    assert playback_deficit_s([]) == 0 and playback_deficit_s([(3.0, 10)]) == 0
    # The worst moment counts, not the last: behind by 50 ms at the second chunk, ahead again later.
    assert playback_deficit_s([(0.0, chunk), (0.13, 10 * chunk), (0.3, chunk)]) == pytest.approx(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Iterator[tuple[Server, int]]:
    http_port = free_port()
    args = ["--max-frames", "2", "--first-chunk-frames", "1", "--chunk-frames", "1", "--greedy"]
    http = ["--http", f"tcp://127.0.0.1:{http_port}"]
    srv = start_tiny(tmp_path_factory.mktemp("load-tool"), tiny_checkpoint, *args, *http, name="load-tool")
    yield srv, http_port
    assert srv.stop() == 0
    assert "Traceback" not in srv.log_text()


def check_run(report: dict, records: list[Record], n: int) -> None:  # type: ignore[type-arg]
    assert (report["sent"], report["served"], report["failed"]) == (n, n, 0), report
    assert report["protocols"]["wyoming"]["served"] == report["protocols"]["http"]["served"] == n // 2
    assert len(records) == n and all(r.ok and r.frames >= 1 for r in records)
    for r in records:
        assert r.ttfa_s is not None and r.total_s is not None and 0 < r.ttfa_s <= r.total_s, r
    for stats in [report["overall"], *report["protocols"].values()]:
        for key in STATS_KEYS - {"errors", "failed"} - STALL_KEYS:
            assert stats[key] > 0, (key, stats)
        assert 0 <= stats["stalled"] <= stats["served"] and stats["stall_max_ms"] >= stats["stall_p95_ms"] >= 0
        assert stats["ttfa_p50_ms"] <= stats["ttfa_p95_ms"] <= stats["ttfa_max_ms"] <= stats["completion_max_ms"]
    assert set(report["http_minus_wyoming_ttfa_ms"]) == {"p50", "p95"}
    assert report["wall_s"] > 0


@pytest.mark.parametrize("arrivals", ["simultaneous", "poisson"])
async def test_both_protocols_all_served(server: tuple[Server, int], arrivals: str) -> None:
    srv, http_port = server
    args = parse_args(
        [
            "--wyoming",
            f"tcp://127.0.0.1:{srv.port}",
            "--http",
            f"http://127.0.0.1:{http_port}",
            "--clients",
            "8",
            "--protocol",
            "both",
            "--arrivals",
            arrivals,
            "--rate",
            "20",
            "--seed",
            "3",
            "--streaming",
            "--timeout",
            "60",
        ]
    )
    report, records = await run_load(args)
    check_run(report, records, 8)
    if arrivals == "poisson":  # spread out, in the order of the seeded arrivals
        sent = [r.sent_at for r in records]
        assert sent == sorted(sent) and sent[-1] > 0.01, sent
    json.dumps(report)  # what --json prints


async def test_clients_spread_over_processes(server: tuple[Server, int]) -> None:
    """--processes: the clients split over fresh processes (each its own clients, warmed up), every request of
    every round sent once and served, the records merged in round and client order, the settings saying so."""
    srv, http_port = server
    args = parse_args(
        [
            *("--wyoming", f"tcp://127.0.0.1:{srv.port}", "--http", f"http://127.0.0.1:{http_port}"),
            *("--clients", "5", "--rounds", "2", "--processes", "2", "--warmup", "1", "--timeout", "60"),
        ]
    )
    report, records = await run_load(args)
    assert (report["sent"], report["served"], report["failed"]) == (10, 10, 0), report
    assert [(r.round, r.index) for r in records] == [(k, i) for k in range(2) for i in range(5)]
    assert [r.protocol for r in records[:5]] == ["wyoming", "http", "wyoming", "http", "wyoming"]
    assert all(r.ok and r.frames >= 1 and r.ttfa_s is not None for r in records)
    assert report["warmup"] == {"sent": 4, "served": 4, "failed": 0, "errors": {}}  # 2 processes x 2 protocols
    assert report["settings"]["processes"] == 2 and report["wall_s"] > 0
    assert parse_args(["--wyoming", "tcp://h:1", "--clients", "3", "--processes", "8"]).processes == 3


async def test_http_through_the_openai_package(server: tuple[Server, int]) -> None:
    """--http-client openai: the same HTTP requests sent by the official openai package (AsyncOpenAI, streamed),
    every one served with whole frames and timed; an unknown voice fails each request with the server's reason.
    --warmup: its untimed requests go through the same client first, reported apart, a failed one counted."""
    srv, http_port = server
    base = ["--http", f"http://127.0.0.1:{http_port}", "--protocol", "http", "--http-client", "openai"]
    report, records = await run_load(parse_args([*base, "--clients", "4", "--timeout", "60", "--warmup", "2"]))
    assert (report["sent"], report["served"], report["failed"]) == (4, 4, 0), report
    assert report["warmup"] == {"sent": 2, "served": 2, "failed": 0, "errors": {}}, report["warmup"]
    assert report["settings"]["http_client"] == "openai" and report["settings"]["warmup"] == 2
    assert len(records) == 4 and all(r.round == 0 for r in records)  # the warm-up's records are not timed ones
    assert all(r.ok and r.frames >= 1 and r.ttfa_s is not None and r.ttfa_s <= (r.total_s or 0) for r in records)
    args = [*base, "--clients", "2", "--voice", "no-such-voice", "--timeout", "60", "--warmup", "1"]
    report, _ = await run_load(parse_args(args))
    assert (report["served"], report["failed"]) == (0, 2), report
    assert all("400" in reason for reason in report["overall"]["errors"]), report["overall"]["errors"]
    assert (report["warmup"]["sent"], report["warmup"]["failed"]) == (1, 1), report["warmup"]
    assert all("400" in reason for reason in report["warmup"]["errors"]), report["warmup"]


def test_cli_json_and_failures(server: tuple[Server, int]) -> None:
    srv, http_port = server
    base = [
        sys.executable,
        "-m",
        "wyoming_qwen3tts.tools.load",
        "--wyoming",
        f"tcp://127.0.0.1:{srv.port}",
        "--http",
        f"http://127.0.0.1:{http_port}",
        "--clients",
        "2",
        "--timeout",
        "60",
    ]
    out = subprocess.run([*base, "--rounds", "2", "--json"], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert (report["sent"], report["served"], report["settings"]["protocol"]) == (4, 4, "both"), report
    # An unknown voice: every request fails, with its reason, and the exit status says so.
    out = subprocess.run(
        [*base, "--voice", "no-such-voice", "--json"], check=False, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert (report["sent"], report["served"], report["failed"]) == (2, 0, 2), report
    reasons = report["overall"]["errors"]
    assert sum(reasons.values()) == 2 and any(r.startswith("http: RuntimeError: HTTP 400") for r in reasons), reasons
    assert any(r.startswith("wyoming: RuntimeError: error") for r in reasons), reasons
    # The table says the same.
    text = subprocess.run(base, check=False, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "HTTP - Wyoming TTFA" in text.stdout and "overall" in text.stdout, text.stdout


SCRAPE = """# HELP qwen3tts_decode_steps Batched decode steps launched
# TYPE qwen3tts_decode_steps counter
qwen3tts_decode_steps_total {steps}
# TYPE qwen3tts_decode_frames counter
qwen3tts_decode_frames_total {frames}
# TYPE qwen3tts_decode_admissions counter
qwen3tts_decode_admissions_total 2.0
# TYPE qwen3tts_decode_admitted_streams counter
qwen3tts_decode_admitted_streams_total {admitted}
# TYPE qwen3tts_decode_gpu_wait_seconds counter
qwen3tts_decode_gpu_wait_seconds_total {wait}
# TYPE qwen3tts_codec_calls counter
qwen3tts_codec_calls_total 10.0
# TYPE qwen3tts_codec_frames counter
qwen3tts_codec_frames_total {codec}
# TYPE qwen3tts_codec_gpu_wait_seconds counter
qwen3tts_codec_gpu_wait_seconds_total 0.5
# TYPE qwen3tts_active_streams gauge
qwen3tts_active_streams{{protocol="wyoming"}} 3.0
"""


def test_pipeline_report_from_two_scrapes() -> None:
    """--metrics: the decode pipeline's counters parsed from the Prometheus text, and their differences over the
    load as rates, stream frames a step and the scheduler's share of the time spent waiting for the GPU."""
    before = pipeline_counters(SCRAPE.format(steps=100, frames=1000, admitted=4, wait=1.0, codec=900))
    after = pipeline_counters(SCRAPE.format(steps=300, frames=9000, admitted=68, wait=2.5, codec=8500))
    assert before["steps"] == 100 and before["codec_wait_s"] == 0.5 and "active" not in str(before)
    report = pipeline_report(before, after, 2.0)
    assert report["decode_frames_per_s"] == 4000 and report["codec_frames_per_s"] == 3800
    assert report["steps_per_s"] == 100 and report["frames_per_step"] == 40
    assert report["admitted"] == 64 and report["admissions"] == 0 and report["codec_calls"] == 0
    assert report["scheduler_gpu_wait_share"] == 0.75 and report["codec_gpu_wait_share"] == 0
    # A server without the counters (an older one): nothing to report, no error.
    assert pipeline_report({}, {}, 2.0)["decode_frames_per_s"] is None


async def test_metrics_of_the_real_server_during_a_load(server: tuple[Server, int]) -> None:
    """--metrics against the real (CPU, one-stream) server: the pipeline report comes with the load, its scrapes
    the time of the load apart; the one-stream backend runs no batching scheduler, so it decoded no batched steps."""
    srv, http_port = server
    args = parse_args(
        [
            "--wyoming",
            f"tcp://127.0.0.1:{srv.port}",
            "--clients",
            "2",
            "--metrics",
            f"http://127.0.0.1:{http_port}/metrics",
        ]
    )
    report, _ = await run_load(args)
    pipe = report["pipeline"]
    assert report["served"] == 2 and report["settings"]["metrics"].endswith("/metrics")
    assert pipe["seconds"] >= report["wall_s"] > 0
    assert pipe["steps_per_s"] == 0 and pipe["frames_per_step"] is None
    assert "pipeline over" in format_table(report)
