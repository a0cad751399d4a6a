"""The Wyoming server in process: the real AsyncTcpServer and event handler on a free TCP port of 127.0.0.1, with
an engine given (the fake one) loaded through TtsService's loader; and what a wyoming client reads back."""

from __future__ import annotations

import asyncio
import time
from functools import partial

from fake_engine import FakeEngine
from wyoming.audio import AudioChunk as WyAudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.server import AsyncServer, AsyncTcpServer

from wyoming_qwen3tts.errors import Qwen3TTSError
from wyoming_qwen3tts.handler import HandlerConfig, Qwen3TTSEventHandler
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.voices import VoicePreset


async def start_server(
    engine: FakeEngine,
    *,
    load_delay: float = 0.0,
    load_error: bool = False,
    presets: list[VoicePreset] | None = None,
    **config: object,
) -> tuple[AsyncServer, int, TtsService]:
    def load() -> FakeEngine:
        time.sleep(load_delay)
        if load_error:
            raise Qwen3TTSError("no such model")
        return engine

    service = TtsService(load, presets or [])  # type: ignore[arg-type]
    service.start_loading()
    server = AsyncServer.from_uri("tcp://127.0.0.1:0")
    assert isinstance(server, AsyncTcpServer)
    await server.start(partial(Qwen3TTSEventHandler, service, HandlerConfig(**config)))  # type: ignore[arg-type]
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return server, port, service


async def read_until(client: AsyncTcpClient, last: str, timeout: float = 10) -> list[Event]:
    events = []
    while True:
        event = await asyncio.wait_for(client.read_event(), timeout)
        if event is None:
            return events
        events.append(event)
        if event.type == last:
            return events


def audio_of(events: list[Event]) -> bytes:
    return b"".join(WyAudioChunk.from_event(e).audio for e in events if WyAudioChunk.is_type(e.type))
