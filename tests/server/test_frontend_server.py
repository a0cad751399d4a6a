"""The text front end through the real server: between the client and the engine, and the
runaway guard on a real (tiny, random-weight) model.

- LLM replies in six languages (Markdown, emoji, links, numbers, dates, units), sent one-shot and
  streamed in random fragment sizes, reach the engine as the same spoken sentences, which are the
  front end's (the fake engine, tests/support/fake_engine.py, records each sentence it is asked to say).
- With text_frontend off, the text reaches the engine as written.
- On the real engine (tiny random checkpoint, CPU; random weights never emit end of speech) a
  three-word sentence stops at its frame budget, seconds not minutes, and the next sentence still plays.
"""

from __future__ import annotations

import asyncio
import random
from functools import partial

import pytest
from fake_engine import FakeEngine
from in_process_wyoming import audio_of, read_until, start_server
from llm_replies import REPLIES
from wyoming.audio import AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.server import AsyncServer, AsyncTcpServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from wyoming_qwen3tts.engine import SAMPLES_PER_FRAME, Engine, EngineOptions
from wyoming_qwen3tts.handler import HandlerConfig, Qwen3TTSEventHandler
from wyoming_qwen3tts.runaway import frame_budget
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.text.stream import spoken_sentences
from wyoming_qwen3tts.voices import LANGUAGE_CODES

pytestmark = pytest.mark.timeout(120)

FRAME_BYTES = SAMPLES_PER_FRAME * 2


async def _one_shot(port: int, text: str, voice: SynthesizeVoice) -> list[Event]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text=text, voice=voice).event())
        return await read_until(client, AudioStop().event().type, timeout=60)


async def _streamed(port: int, text: str, voice: SynthesizeVoice, rng: random.Random) -> list[Event]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart(voice=voice).event())
        i = 0
        while i < len(text):
            n = rng.randint(1, 12)
            await client.write_event(SynthesizeChunk(text=text[i : i + n]).event())
            i += n
        await client.write_event(SynthesizeStop().event())
        return await read_until(client, SynthesizeStopped().event().type, timeout=60)


@pytest.mark.parametrize("language", ["english", "german", "french", "spanish", "chinese", "japanese"])
async def test_streamed_reply_speaks_the_one_shot_sentences(language: str) -> None:
    engine = FakeEngine()
    server, port, service = await start_server(engine)
    try:
        text = REPLIES[language]
        voice = SynthesizeVoice(language=LANGUAGE_CODES[language])
        want = [s.spoken for s in spoken_sentences(text, language)]
        assert len(want) >= 3 and not any(mark in " ".join(want) for mark in ("**", "##", "```", "|")), want

        events = await _one_shot(port, text, voice)
        one_shot = [r.text for r in engine.requests]
        assert one_shot == want
        assert AudioStart.is_type(events[0].type) and len(audio_of(events)) == FRAME_BYTES * sum(
            len(s.split()) for s in want
        )

        rng = random.Random(language)
        for _ in range(3):
            engine.requests.clear()
            events = await _streamed(port, text, voice, rng)
            assert [r.text for r in engine.requests] == want
            assert [e.type for e in events].count("audio-start") == 1
    finally:
        await server.stop()
        service.shutdown()


async def test_front_end_off_speaks_the_text_as_written() -> None:
    engine = FakeEngine()
    server, port, service = await start_server(engine, text_frontend=False)
    try:
        await _one_shot(port, "It costs **$3.50** today. Call me at 5 p.m.", SynthesizeVoice(language="en"))
        assert [r.text for r in engine.requests] == ["It costs $3.50 today.", "Call me at 5 p.m."]
    finally:
        await server.stop()
        service.shutdown()


@pytest.mark.slow
async def test_random_weights_stop_each_sentence_at_its_budget(tiny_checkpoint_06b) -> None:
    """A three-word sentence of random weights (no end of speech) ends at its budget, ~10 s, not at
    max_frames (2,048 frames, 164 s here), and the sentence after it is still spoken."""
    options = EngineOptions(device="cpu", dtype="float32", chunk_frames=12)
    service = TtsService(partial(Engine.from_pretrained, str(tiny_checkpoint_06b), options), [])
    service.start_loading()
    server = AsyncServer.from_uri("tcp://127.0.0.1:0")
    assert isinstance(server, AsyncTcpServer)
    await server.start(partial(Qwen3TTSEventHandler, service, HandlerConfig(seed=1)))
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        first, second = "Turn it off.", "Good night."
        events = await asyncio.wait_for(_one_shot(port, f"{first} {second}", SynthesizeVoice(name="ryan")), 100)
        frames = len(audio_of(events)) // FRAME_BYTES
        budgets = [frame_budget(s, "auto", None) for s in (first, second)]
        assert max(budgets) < 12.5 * 15  # seconds, not minutes
        # Each budget is from characters or tokens, whichever is longer; the token count gives at most a
        # few frames more on these short sentences.
        assert sum(budgets) <= frames <= sum(budgets) + 10, (frames, budgets)
        assert AudioStop.is_type(events[-1].type)
    finally:
        await server.stop()
        service.shutdown()
