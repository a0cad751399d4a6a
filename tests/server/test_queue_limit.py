"""The service-wide queue limit (max_queued_streams): past it a new request is refused at once with
`queue-full`, on Wyoming (error event, then the connection closed) and on HTTP (429 in OpenAI's
shape), and nothing else is lost: the requests queued and being spoken are answered whole, the
later sentences of a request being spoken are never refused, and new requests are served once
the queue drains.

First the service itself in-process (the counting, the default, 0), then the real server command
line (tests/support/reliability_plugin.py's fake engine: one frame per word at a fixed pace, so what runs
and what waits is known) driven by the wyoming client and the official openai client.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from fake_engine import FakeEngine
from ports import free_port
from prometheus_text import metric_value
from reliability_support import Server, check_answer, start, stats
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_qwen3tts.errors import QueueFullError
from wyoming_qwen3tts.request import SAMPLES_PER_FRAME, SynthesisRequest
from wyoming_qwen3tts.service import QUEUED_MIN, QUEUED_PER_STREAM, TtsService
from wyoming_qwen3tts.settings import load_settings

pytestmark = pytest.mark.timeout(120)

FRAME_BYTES = SAMPLES_PER_FRAME * 2


# -- the service in-process ----------------------------------------------------------------------


async def _service(workers: int, max_queued_streams: int | None, frame_delay: float = 0.05) -> TtsService:
    service = TtsService(
        lambda: FakeEngine(frame_delay=frame_delay),
        [],
        workers=workers,  # type: ignore[arg-type, return-value]
        max_queued_streams=max_queued_streams,
    )
    await service.start_loading()
    return service


async def _speak(service: TtsService, text: str, continuing: bool = False) -> int:
    frames = 0
    async for chunk in service.synthesize(
        SynthesisRequest(text=text, speaker="ryan"), threading.Event(), continuing=continuing
    ):
        frames += chunk.num_frames
    return frames


async def _until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("workers", [1, 3])
async def test_service_refuses_a_new_request_past_the_waiting_limit(workers: int) -> None:
    """`workers` sentences run, max_queued_streams (2) wait; one more new request is refused at once,
    a continuing sentence is not; all accepted ones finish whole and the count returns to zero."""
    service = await _service(workers, 2)
    try:
        words = "one two three four five six"  # 6 frames x 50 ms
        accepted = [asyncio.create_task(_speak(service, words)) for _ in range(workers + 2)]
        await _until(lambda: service.syntheses == workers + 2)
        started = time.monotonic()
        with pytest.raises(QueueFullError, match=rf"all {workers} decode slot\(s\) are in use and 2 requests wait"):
            await _speak(service, "refused")
        assert time.monotonic() - started < 0.1  # at once, not after a wait
        continuing = asyncio.create_task(_speak(service, "a later sentence", continuing=True))
        assert await asyncio.gather(*accepted, continuing) == [6] * (workers + 2) + [3]
        assert service.syntheses == 0
        assert await _speak(service, "served again") == 2
    finally:
        service.shutdown()


async def test_service_with_no_waiting_allowed_refuses_while_every_slot_is_busy() -> None:
    """max_queued_streams 0: a request is refused exactly while every worker speaks."""
    service = await _service(1, 0)
    try:
        first = asyncio.create_task(_speak(service, "one two three four"))
        await _until(lambda: service.syntheses == 1)
        with pytest.raises(QueueFullError):
            await _speak(service, "refused")
        assert await first == 4
        assert await _speak(service, "now it runs") == 3
    finally:
        service.shutdown()


async def test_clients_that_leave_stop_counting_against_the_limit_at_once() -> None:
    """One request speaks while 8 clients send a request and hang up before it is reached (the limit is 4):
    their sentences stop counting at once, so a live client is queued and answered, not refused
    with queue-full while the engine is still busy with the first."""
    from functools import partial

    from wyoming.server import AsyncServer

    from wyoming_qwen3tts.handler import HandlerConfig, Qwen3TTSEventHandler

    service = await _service(1, 4, frame_delay=0.02)
    server = AsyncServer.from_uri("tcp://127.0.0.1:0")
    await server.start(partial(Qwen3TTSEventHandler, service, HandlerConfig()))  # type: ignore[arg-type]
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        running = AsyncTcpClient("127.0.0.1", port)
        await running.connect()
        await running.write_event(Synthesize(" ".join(["word"] * 150)).event())  # 150 frames x 20 ms
        await _until(lambda: service.syntheses == 1)
        leaving = [AsyncTcpClient("127.0.0.1", port) for _ in range(8)]
        for client in leaving:
            await client.connect()
            await client.write_event(Synthesize("never reached").event())
        # Admitted one by one while fewer than 4 wait; the rest are refused and closed by the server.
        await _until(lambda: service.syntheses == 5)
        for client in leaving:
            await client.disconnect()
        await _until(lambda: len(service.connections) == 1)
        assert service.syntheses == 1, "the abandoned sentences still count"
        async with AsyncTcpClient("127.0.0.1", port) as live:
            await live.write_event(Synthesize("served").event())
            answer = []
            while not answer or answer[-1].type not in ("audio-stop", "error"):
                event = await asyncio.wait_for(live.read_event(), 10)
                assert event is not None
                answer.append(event)
        assert answer[-1].type == "audio-stop", answer[-1]
        await running.disconnect()
    finally:
        await server.stop()
        service.shutdown()


def test_default_is_four_per_stream_and_at_least_sixteen() -> None:
    assert load_settings([]).max_queued_streams is None  # unset: the service's rule
    assert load_settings(["--max-queued-streams", "0"]).max_queued_streams == 0
    assert (QUEUED_PER_STREAM, QUEUED_MIN) == (4, 16)
    for workers, want in ((1, 16), (4, 16), (8, 32), (16, 64)):
        service = TtsService(lambda: None, [], workers=workers)  # type: ignore[arg-type, return-value]
        assert service.max_queued_streams == want
        service.shutdown()


# -- the real server: Wyoming and HTTP -----------------------------------------------------------------


FRAME_DELAY = 0.25  # seconds per word: the first sentence below holds the one slot for 2 s


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    server = start(
        tmp_path, ["--max-queued-streams", "1", "--http", f"tcp://127.0.0.1:{port}"], fake=True, frame_delay=FRAME_DELAY
    )
    server.http_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield server
    assert server.stop() == 0


async def _jobs(port: int, n: int) -> None:
    deadline = time.monotonic() + 10
    while (await stats(port))["jobs"] != n:
        assert time.monotonic() < deadline, "the queue did not fill"
        await asyncio.sleep(0.02)


async def _read_all(client: AsyncTcpClient, timeout: float = 30) -> list[Event]:
    """Events until the server closes the connection."""
    events = []
    while (event := await asyncio.wait_for(client.read_event(), timeout)) is not None:
        events.append(event)
    return events


async def test_full_queue_refuses_at_once_on_both_protocols_and_loses_nothing(server: Server) -> None:
    """One slot, max_queued_streams 1. A speaks its first sentence (8 words), B (HTTP) waits: the
    queue is full. C (Wyoming) gets `error` `queue-full` and the end of its connection at once; D
    (HTTP) a 429 `queue-full` in OpenAI's shape with Retry-After. A's second sentence, submitted
    while B waits, still queues (continuing) and A is answered whole; so is B; then a new request
    is served. Each refusal is counted once, under its protocol."""
    port = server.port
    http = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)  # type: ignore[attr-defined]
    a = AsyncTcpClient("127.0.0.1", port)
    await a.connect()
    await a.write_event(
        Synthesize(
            text="One two three four five six seven eight. Nine ten.", voice=SynthesizeVoice(name="ryan")
        ).event()
    )
    first = await asyncio.wait_for(a.read_event(), 10)
    assert first is not None and first.type == "audio-start"

    b_text = "Bee waits its turn."
    b = asyncio.create_task(
        asyncio.to_thread(
            lambda: http.audio.speech.create(model="tts-1", voice="ryan", input=b_text, response_format="pcm").content
        )
    )
    await _jobs(port, 2)  # A's first sentence runs, B waits

    c = AsyncTcpClient("127.0.0.1", port)
    await c.connect()
    started = time.monotonic()
    await c.write_event(Synthesize(text="Sea is refused.", voice=SynthesizeVoice(name="ryan")).event())
    refused = await _read_all(c, 10)
    assert time.monotonic() - started < 1.0, "refused only after a wait"
    assert [e.type for e in refused] == ["error"], refused
    assert refused[0].data["code"] == "queue-full" and "max_queued_streams" in refused[0].data["text"]
    await c.disconnect()

    with pytest.raises(openai.RateLimitError) as caught:
        http.audio.speech.create(model="tts-1", voice="ryan", input="Dee is refused too.", response_format="pcm")
    error = caught.value
    assert error.status_code == 429 and error.code == "queue-full", error.body
    assert error.body["type"] == "rate_limit_error" and set(error.body) == {"message", "type", "param", "code"}  # type: ignore[index]
    assert error.response.headers["Retry-After"] == "1"

    rest = [first]
    while (event := await asyncio.wait_for(a.read_event(), 30)) is not None:
        rest.append(event)
        if event.type == "audio-stop":
            break
    assert check_answer(rest, streaming=False) == 10  # both sentences, every frame
    await a.disconnect()
    pcm = await b
    assert len(pcm) == 4 * FRAME_BYTES and np.frombuffer(pcm, "<i2")[::SAMPLES_PER_FRAME].tolist() == [1, 2, 3, 4]

    assert (
        len(http.audio.speech.create(model="tts-1", voice="ryan", input="Served again.", response_format="pcm").content)
        == 2 * FRAME_BYTES
    )
    with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=10) as response:  # noqa: ASYNC210 - the test's own client  # type: ignore[attr-defined]
        text = response.read().decode()
    for protocol in ("wyoming", "http"):
        assert metric_value(text, "qwen3tts_speech_requests_total", protocol=protocol, outcome="queue-full") == 1, (
            protocol
        )
    log = server.log_text()
    assert log.count("error queue-full") == 1 and "Traceback" not in log  # Wyoming's refusal, logged as a warning
