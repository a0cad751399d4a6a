"""Faults against the real server process: clients vanishing mid-stream (no stuck tasks, threads
or growing memory), engine exceptions, GPU out-of-memory (forced on any device; real on a GPU),
and SIGTERM draining requests in progress."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_support import FRAME_BYTES, Raw, Server, check_answer, start, synthesize, wait_quiet
from tiny_server import start_tiny
from wyoming.event import Event

pytestmark = pytest.mark.timeout(300)

DISCONNECTS = 200
RSS_BOUND_KB = 25_000  # allowed RSS growth over 200 abandoned requests (allocator noise)


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start(tmp_path_factory.mktemp("faults"), [], fake=True, frame_delay=0.005)
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Iterator[Server]:
    args = ["--max-frames", "2", "--first-chunk-frames", "1", "--chunk-frames", "1", "--greedy"]
    server = start_tiny(tmp_path_factory.mktemp("faults-real"), tiny_checkpoint, *args, name="real")
    yield server
    assert server.stop() == 0


async def abandon(port: int, how: str, rng: random.Random) -> None:
    """Start a request and vanish at some point of it."""
    client = await Raw.connect(port)
    try:
        streaming = rng.random() < 0.7
        if streaming:
            await client.event(
                Event(type="synthesize-start", data={"voice": {"name": rng.choice(["ryan", "vivian", "sohee"])}})
            )
            await client.event(
                Event(
                    type="synthesize-chunk",
                    data={"text": "First sentence is here. Second one is coming along. And a thi"},
                )
            )
        else:
            await client.event(
                Event(type="synthesize", data={"text": "One two three four five six. Seven eight nine ten."})
            )
        if how in ("after-start", "after-chunk"):
            want = "audio-start" if how == "after-start" else "audio-chunk"
            while (event := await client.read(30)) is not None and event.type != want:
                pass
        elif how == "mid-event":
            client.writer.write(b'{"type": "synthesize-chunk", "data_length": 400}\n{"text": "hal')
    finally:
        if rng.random() < 0.5:
            client.reset()
        else:
            await client.close()


async def test_clients_vanishing_mid_stream_leave_nothing_behind(fake: Server) -> None:
    for _ in range(20):  # warm up allocator and caches: the baseline is the steady state
        await synthesize(fake.port, "Warm up now. Two sentences.", streaming=True)
    base = await wait_quiet(fake.port)
    rng = random.Random(7)
    ways = ["immediately", "after-start", "after-chunk", "mid-event"]
    t0 = time.monotonic()
    for wave in range(DISCONNECTS // 20):
        await asyncio.gather(*(abandon(fake.port, ways[(wave * 20 + i) % 4], rng) for i in range(20)))
    elapsed = time.monotonic() - t0
    after = await wait_quiet(fake.port, timeout=30)
    assert after["exchanges"] == 0 and after["jobs"] == 0 and after["connections"] == 1, after
    assert after["tasks"] == base["tasks"], (base["tasks"], after["tasks"])
    assert after["threads"] == base["threads"] and after["os_threads"] == base["os_threads"], (base, after)
    grown = after["rss_kb"] - base["rss_kb"]
    assert grown < RSS_BOUND_KB, f"RSS grew by {grown} kB over {DISCONNECTS} abandoned requests"
    assert await synthesize(fake.port, "Still serving after all that.") == 5
    log = fake.log_text()
    assert "Traceback" not in log and "never retrieved" not in log, log[-3000:]
    print(
        f"\n{DISCONNECTS} abandoned requests in {elapsed:.1f} s; RSS {base['rss_kb']} -> {after['rss_kb']} kB "
        f"({grown:+d}); threads {base['os_threads']} -> {after['os_threads']}; tasks {base['tasks']} -> {after['tasks']}"
    )


@pytest.mark.parametrize("streaming", [False, True])
async def test_engine_exception_ends_exchange_next_works(real: Server, streaming: bool) -> None:
    """The engine raises after the first audio chunk: the client gets the audio so far, an error
    event and the close; the server logs it and answers the next request normally."""
    client = await Raw.connect(real.port)
    try:
        if streaming:
            await client.event(Event(type="synthesize-start"))
            await client.event(Event(type="synthesize-chunk", data={"text": "Please raiseengineerror now."}))
            await client.event(Event(type="synthesize-stop"))
        else:
            await client.event(Event(type="synthesize", data={"text": "Please raiseengineerror now."}))
        events = await client.read_all(60)
    finally:
        await client.close()
    types = [e.type for e in events]
    assert types[:2] == ["audio-start", "audio-chunk"] and types[-1] == "error", types
    assert events[-1].data["code"] == "synthesis-failed" and "injected engine failure" in events[-1].data["text"]
    assert "Synthesis failed" in real.log_text()
    assert 1 <= await synthesize(real.port, "Next one.", streaming=streaming) <= 2
    quiet = await wait_quiet(real.port)
    assert quiet["exchanges"] == 0 and quiet["jobs"] == 0


async def test_forced_out_of_memory_is_reported_and_next_works(real: Server) -> None:
    """torch.cuda.OutOfMemoryError inside synthesis (forced; on the CPU the same code path):
    error event "out-of-memory", closed connection, a clear log line, the next request works."""
    client = await Raw.connect(real.port)
    try:
        await client.event(Event(type="synthesize", data={"text": "Say forcegpuoom please."}))
        events = await client.read_all(60)
    finally:
        await client.close()
    assert [e.type for e in events] == ["error"], events
    assert events[0].data["code"] == "out-of-memory" and "ran out of memory" in events[0].data["text"]
    assert "GPU out of memory while speaking" in real.log_text()
    assert 1 <= await synthesize(real.port, "Memory is back.") <= 2


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Iterator[Server]:
    args = ["--model", str(tiny_checkpoint), "--device", "cuda", "--max-frames", "8", "--greedy"]
    server = start(tmp_path_factory.mktemp("faults-gpu"), args, fake=False, name="gpu")
    yield server
    assert server.stop() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("marker", ["forcegpuoom", "realgpuoom"])
async def test_gpu_out_of_memory_releases_memory(gpu_server: Server, marker: str) -> None:
    """On a GPU: forced and real (allocating twice the device) out-of-memory; the cached memory
    is handed back (reserved memory no higher than before) and the next request works."""
    assert 1 <= await synthesize(gpu_server.port, "Warm up first.") <= 8
    before = await wait_quiet(gpu_server.port)
    client = await Raw.connect(gpu_server.port)
    try:
        await client.event(Event(type="synthesize", data={"text": f"Now {marker} please."}))
        events = await client.read_all(60)
    finally:
        await client.close()
    assert events and events[-1].type == "error" and events[-1].data["code"] == "out-of-memory", events
    assert "GPU out of memory while speaking" in gpu_server.log_text()
    after = await wait_quiet(gpu_server.port)
    assert after["cuda_reserved"] <= before["cuda_reserved"] + (64 << 20), (before, after)
    assert after["cuda_allocated"] <= before["cuda_allocated"] + (16 << 20), (before, after)
    assert 1 <= await synthesize(gpu_server.port, "Memory is back.") <= 8


# -- SIGTERM -----------------------------------------------------------------------------------------


async def test_sigterm_drains_requests_in_progress(tmp_path: Path) -> None:
    """SIGTERM with three requests speaking, one stream still open and one idle connection:
    the listener closes at once, the idle connection is closed, every request in progress is
    answered in full (the open stream too, when its text ends), and the process exits 0."""
    server = start(tmp_path, ["--drain-seconds", "20"], fake=True, frame_delay=0.02)
    try:
        words = 60  # 60 frames x 20 ms: over a second each, three queued one after the other
        busy = [await Raw.connect(server.port) for _ in range(3)]
        for client in busy:
            await client.event(Event(type="synthesize", data={"text": " ".join(["word"] * words) + "."}))
        stream = await Raw.connect(server.port)
        await stream.event(Event(type="synthesize-start"))
        await stream.event(Event(type="synthesize-chunk", data={"text": "Open stream, first part. "}))
        idle = await Raw.connect(server.port)
        await idle.event(Event(type="describe"))
        assert (await idle.read(10)).type == "info"  # type: ignore[union-attr]
        assert (await busy[0].read(10)).type == "audio-start"  # type: ignore[union-attr]

        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        with pytest.raises(OSError):  # not accepting any more
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        assert await idle.read_all(5) == []  # idle: closed without a word
        await stream.event(Event(type="synthesize-chunk", data={"text": "And the end."}))
        await stream.event(Event(type="synthesize-stop"))

        answers = await asyncio.gather(*(c.read_all(60) for c in busy[1:]), stream.read_all(60))
        first = [Event(type="audio-start", data={"rate": 24000, "width": 2, "channels": 1})] + await busy[0].read_all(
            60
        )
        for events in [first, *answers[:2]]:
            assert check_answer(events, streaming=False) == words + 0  # every frame, then EOF
        assert check_answer(answers[2], streaming=True) == 7
        code = server.proc.wait(30)
        assert code == 0, server.log_text()[-3000:]
        log = server.log_text()
        assert "Stopping (SIGTERM)" in log and "Stopped" in log and "Traceback" not in log
    finally:
        server.stop()


async def test_sigterm_drain_timeout_cancels_with_error(tmp_path: Path) -> None:
    """A request that cannot finish within drain_seconds gets an error event; exit is still 0."""
    server = start(tmp_path, ["--drain-seconds", "1"], fake=True, frame_delay=0.05)
    try:
        client = await Raw.connect(server.port)
        await client.event(Event(type="synthesize", data={"text": " ".join(["word"] * 400) + "."}))
        assert (await client.read(10)).type == "audio-start"  # type: ignore[union-attr]
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        events = await client.read_all(30)
        assert events and events[-1].type == "error" and events[-1].data["code"] == "shutting-down", events[-3:]
        assert len(events) - 1 < 400  # cut short
        assert server.proc.wait(30) == 0
        assert time.monotonic() - t0 < 6
    finally:
        server.stop()


async def test_audio_is_whole_frames_after_faults(fake: Server) -> None:
    """After every fault above the fake server still answers both request kinds exactly."""
    assert await synthesize(fake.port, "Three more words.", streaming=False) == 3
    assert await synthesize(fake.port, "And four more words.", streaming=True) == 4
    assert FRAME_BYTES == 3840
