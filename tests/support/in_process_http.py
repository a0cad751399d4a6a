"""The HTTP app in process: the real aiohttp app (build_app) on a free port of 127.0.0.1 over a TtsService
whose loader returns an engine given (the fake one by default), with an aiohttp client session to call it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from fake_engine import FakeEngine
from prometheus_text import metric_value

from wyoming_qwen3tts.errors import Qwen3TTSError
from wyoming_qwen3tts.http.app import HttpConfig, HttpServer, build_app
from wyoming_qwen3tts.http.openai_speech import SpeechConfig
from wyoming_qwen3tts.metrics import Metrics
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.voices import VoicePreset

PRESET = VoicePreset(name="ryan-calm", speaker="ryan", language="en", instruct="Speak slowly and calmly.")


@dataclass
class Api:
    url: str
    service: TtsService
    engine: FakeEngine
    metrics: Metrics
    http: aiohttp.ClientSession

    async def speak(self, headers: dict[str, str] | None = None, **body: object) -> aiohttp.ClientResponse:
        return await self.http.post(f"{self.url}/v1/audio/speech", json={"model": "tts-1", **body}, headers=headers)

    async def metric(self, name: str, **labels: str) -> float:
        text = await (await self.http.get(f"{self.url}/metrics")).text()
        return metric_value(text, name, **labels)


@contextlib.asynccontextmanager
async def serve(
    engine: FakeEngine | None = None,
    *,
    load_delay: float = 0.0,
    load_error: bool = False,
    max_connections: int = 64,
    api_key: str | None = None,
    presets: list[VoicePreset] | None = None,
    **speech: object,
) -> AsyncIterator[Api]:
    engine = engine or FakeEngine()

    def load() -> FakeEngine:
        time.sleep(load_delay)
        if load_error:
            raise Qwen3TTSError("no such model")
        return engine

    service = TtsService(load, [PRESET] if presets is None else presets, max_connections=max_connections)  # type: ignore[arg-type]
    loaded = service.start_loading()
    metrics = Metrics()
    metrics.watch(service)
    config = HttpConfig(uri="tcp://127.0.0.1:0", api_key=api_key, speech=SpeechConfig(model_id="tiny", **speech))  # type: ignore[arg-type]
    server = HttpServer(build_app(service, config, metrics), config)
    await server.start()
    if not load_delay and not load_error:
        await loaded
    try:
        async with aiohttp.ClientSession() as http:
            yield Api(server.url, service, engine, metrics, http)
    finally:
        await server.close()
        service.shutdown()
        with contextlib.suppress(BaseException):
            await loaded
