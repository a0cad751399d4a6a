"""The event handler against a fake engine: protocol answers, errors, cancellation, queuing.

The server runs in-process on a free TCP port (the real AsyncTcpServer and handler), with the
fake engine injected through TtsService's loader (tests/support/in_process_wyoming.py); clients are the
wyoming library's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
from fake_engine import FakeEngine
from in_process_wyoming import audio_of, read_until, start_server
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from wyoming_qwen3tts.engine import SAMPLES_PER_FRAME
from wyoming_qwen3tts.errors import Qwen3TTSError
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.voices import SPEAKER_DESCRIPTIONS, VoicePreset

pytestmark = pytest.mark.timeout(30)

FRAME_BYTES = SAMPLES_PER_FRAME * 2


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeEngine, int, TtsService]]:
    engine = FakeEngine()
    server, port, service = await start_server(engine)
    yield engine, port, service
    await server.stop()
    service.shutdown()


async def test_describe_lists_speakers_and_presets() -> None:
    engine = FakeEngine()
    presets = [VoicePreset(name="ryan-calm", speaker="ryan", language="en", instruct="calm")]
    server, port, service = await start_server(engine, presets=presets)
    try:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await asyncio.wait_for(client.read_event(), 5))  # type: ignore[arg-type]
        (program,) = info.tts
        assert program.name == "qwen3-tts" and program.supports_synthesize_streaming
        names = [v.name for v in program.voices]
        assert names == [*SPEAKER_DESCRIPTIONS, "ryan-calm"]
        assert program.voices[-1].languages == ["en"]
        assert "de" in program.voices[0].languages and "auto" not in program.voices[0].languages
    finally:
        await server.stop()
        service.shutdown()


async def test_one_shot_splits_sentences_with_one_start_and_stop(fake: tuple[FakeEngine, int, TtsService]) -> None:
    engine, port, _ = fake
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize("One two three. Four five!", voice=SynthesizeVoice(name="ryan")).event())
        events = await read_until(client, "audio-stop")
    types = [e.type for e in events]
    assert types == ["audio-start"] + ["audio-chunk"] * 5 + ["audio-stop"]
    assert [r.text for r in engine.requests] == ["One two three.", "Four five!"]
    assert engine.requests[0].speaker == "ryan" and engine.requests[0].language == "auto"
    samples = np.frombuffer(audio_of(events), dtype="<i2")[::SAMPLES_PER_FRAME]
    assert samples.tolist() == [1, 2, 3, 1, 2]


async def test_preset_language_and_instruct_reach_engine() -> None:
    engine = FakeEngine()
    presets = [VoicePreset(name="calm", speaker="Serena", language="English", instruct="Speak calmly")]
    server, port, service = await start_server(engine, presets=presets, seed=7)
    try:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize("Hi there.", voice=SynthesizeVoice(name="calm")).event())
            await read_until(client, "audio-stop")
        async with AsyncTcpClient("127.0.0.1", port) as client:
            # A language without a name is honoured (not something Home Assistant sends).
            await client.write_event(Synthesize("Hallo.", voice=SynthesizeVoice(language="de_DE")).event())
            await read_until(client, "audio-stop")
        first, second = engine.requests
        assert (first.speaker, first.language, first.instruct, first.seed) == ("serena", "english", "Speak calmly", 7)
        assert (second.speaker, second.language, second.instruct) == ("vivian", "german", None)
    finally:
        await server.stop()
        service.shutdown()


async def test_stream_speaks_first_sentence_before_stop(fake: tuple[FakeEngine, int, TtsService]) -> None:
    engine, port, _ = fake
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="aiden")).event())
        for part in ["Hel", "lo wor", "ld. Sec", "ond sen"]:
            await client.write_event(SynthesizeChunk(part).event())
        # Complete first sentence ("Hello world." + " "): audio comes before synthesize-stop.
        first = await asyncio.wait_for(client.read_event(), 5)
        second = await asyncio.wait_for(client.read_event(), 5)
        assert first is not None and first.type == "audio-start"
        assert second is not None and second.type == "audio-chunk"
        await client.write_event(
            Synthesize("Hello world. Second sentence", voice=SynthesizeVoice(name="aiden")).event()
        )
        await client.write_event(SynthesizeChunk("tence").event())
        await client.write_event(SynthesizeStop().event())
        events = [first, second] + await read_until(client, "synthesize-stopped")
    types = [e.type for e in events]
    assert types.count("audio-start") == 1 and types.count("audio-stop") == 1
    assert types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert [r.text for r in engine.requests] == ["Hello world.", "Second sentence"]  # back-compat text ignored
    assert len(audio_of(events)) == 4 * FRAME_BYTES


async def test_a_control_marker_cut_between_chunks_is_removed_as_in_one_piece(
    fake: tuple[FakeEngine, int, TtsService],
) -> None:
    """ChatML markers are removed from the streamed text as a whole: cut at every point into two
    synthesize-chunk events, the engine gets what the one-shot request gives it, never a marker's
    remains."""
    engine, port, _ = fake
    texts = ["One <|im_end|> two <tts_text_bos> three.", "<tts<tts_"]
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for text in texts:
            await client.write_event(Synthesize(text).event())
            await read_until(client, "audio-stop")
            whole = [r.text for r in engine.requests]
            engine.requests.clear()
            for cut in range(1, len(text)):
                await client.write_event(SynthesizeStart().event())
                await client.write_event(SynthesizeChunk(text[:cut]).event())
                await client.write_event(SynthesizeChunk(text[cut:]).event())
                await client.write_event(SynthesizeStop().event())
                await read_until(client, "synthesize-stopped")
                assert [r.text for r in engine.requests] == whole, (text[:cut], text[cut:])
                engine.requests.clear()


@pytest.mark.parametrize("streaming", [False, True])
async def test_empty_text_gives_empty_audio(fake: tuple[FakeEngine, int, TtsService], streaming: bool) -> None:
    engine, port, _ = fake
    async with AsyncTcpClient("127.0.0.1", port) as client:
        if streaming:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk("  ").event())
            await client.write_event(SynthesizeStop().event())
            events = await read_until(client, "synthesize-stopped")
        else:
            await client.write_event(Synthesize("").event())
            events = await read_until(client, "audio-stop")
    assert [e.type for e in events] == ["audio-start", "audio-stop"] + (["synthesize-stopped"] if streaming else [])
    assert engine.requests == []


async def expect_error(port: int, events: list[Event], code: str) -> Error:
    """Send events; the answer must be an error with this code, then the connection closes."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        answer = await read_until(client, "never")
    errors = [Error.from_event(e) for e in answer if Error.is_type(e.type)]
    assert len(errors) == 1 and errors[0].code == code, answer
    assert Error.is_type(answer[-1].type)  # nothing after the error: the server closed
    return errors[0]


async def test_unknown_voice(fake: tuple[FakeEngine, int, TtsService]) -> None:
    _, port, _ = fake
    await expect_error(port, [Synthesize("Hi.", voice=SynthesizeVoice(name="nobody")).event()], "unknown-voice")
    await expect_error(port, [SynthesizeStart(voice=SynthesizeVoice(name="nobody")).event()], "unknown-voice")


async def test_unknown_language(fake: tuple[FakeEngine, int, TtsService]) -> None:
    _, port, _ = fake
    await expect_error(port, [Synthesize("Hi.", voice=SynthesizeVoice(language="xx")).event()], "unknown-language")


async def test_text_too_long() -> None:
    engine = FakeEngine()
    server, port, service = await start_server(engine, max_text_chars=20)
    try:
        await expect_error(port, [Synthesize("x" * 21).event()], "text-too-long")
        stream = [SynthesizeStart().event(), SynthesizeChunk("Short. ").event(), SynthesizeChunk("y" * 20).event()]
        await expect_error(port, stream, "text-too-long")
    finally:
        await server.stop()
        service.shutdown()


@pytest.mark.parametrize(
    "events",
    [
        [SynthesizeChunk("hello").event()],
        [SynthesizeStop().event()],
        [SynthesizeStart().event(), SynthesizeStart().event()],
        [Event(type="synthesize", data={"voice": {"name": "ryan"}})],  # no text
    ],
    ids=["chunk-without-start", "stop-without-start", "start-twice", "synthesize-without-text"],
)
async def test_out_of_order_or_malformed(fake: tuple[FakeEngine, int, TtsService], events: list[Event]) -> None:
    _, port, _ = fake
    await expect_error(port, events, "bad-request")


@pytest.mark.parametrize("fail_with", [Qwen3TTSError, RuntimeError])  # RuntimeError: e.g. torch
async def test_engine_failure_ends_exchange(fail_with: type[Exception]) -> None:
    engine = FakeEngine(fail_on="boom", fail_with=fail_with)
    server, port, service = await start_server(engine)
    try:
        error = await expect_error(port, [Synthesize("Fine here. Then boom.").event()], "synthesis-failed")
        assert "exploded" in error.text
        # The server still serves the next client.
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize("All good.").event())
            events = await read_until(client, "audio-stop")
        assert len(audio_of(events)) == 2 * FRAME_BYTES
    finally:
        await server.stop()
        service.shutdown()


async def test_model_load_failure_answers_error() -> None:
    server, port, service = await start_server(FakeEngine(), load_error=True)
    try:
        await expect_error(port, [Synthesize("Hi.").event()], "model-load-failed")
    finally:
        await server.stop()
        service.shutdown()


async def test_describe_before_load_and_synthesis_waits_for_model() -> None:
    engine = FakeEngine()
    load_started = time.monotonic()  # the load (1 s) starts with the server, before the client connects
    server, port, service = await start_server(engine, load_delay=1.0)
    try:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            t0 = time.monotonic()
            await client.write_event(Describe().event())
            info = await asyncio.wait_for(client.read_event(), 5)
            assert info is not None and info.type == "info"
            assert time.monotonic() - t0 < 0.5  # well before the model is there
            await client.write_event(Synthesize("Wait for it.").event())
            events = await read_until(client, "audio-stop")
        assert time.monotonic() - load_started >= 1.0  # the audio came after the load
        assert len(audio_of(events)) == 3 * FRAME_BYTES
    finally:
        await server.stop()
        service.shutdown()


async def test_disconnect_cancels_and_fifo_across_clients() -> None:
    engine = FakeEngine(frame_delay=0.05)
    server, port, service = await start_server(engine)
    try:
        long_text = " ".join(["word"] * 200) + "."
        client_a = AsyncTcpClient("127.0.0.1", port)
        await client_a.connect()
        await client_a.write_event(Synthesize(long_text).event())
        start = await asyncio.wait_for(client_a.read_event(), 5)
        assert start is not None and start.type == "audio-start"
        await client_a.disconnect()
        # Within one frame group of the disconnect the engine stops.
        await asyncio.sleep(0.3)
        frames_after_cancel = engine.frames_done
        assert len(engine.cancelled) == 1 and len(engine.requests) == 1  # later pieces never started
        await asyncio.sleep(0.3)
        assert engine.frames_done == frames_after_cancel < 20

        # Two clients at once: the one that asked first is served first.
        async with AsyncTcpClient("127.0.0.1", port) as b, AsyncTcpClient("127.0.0.1", port) as c:
            await b.write_event(Synthesize("bee " * 5).event())
            await asyncio.sleep(0.02)
            await c.write_event(Synthesize("sea " * 3).event())
            # Describe is answered at once while both are queued or running.
            await c.write_event(Describe().event())
            done_b, done_c = await asyncio.gather(read_until(b, "audio-stop"), read_until(c, "audio-stop"))
        assert [r.text for r in engine.requests[-2:]] == ["bee bee bee bee bee", "sea sea sea"]
        assert len(audio_of(done_b)) == 5 * FRAME_BYTES and len(audio_of(done_c)) == 3 * FRAME_BYTES
        assert any(e.type == "info" for e in done_c)
    finally:
        await server.stop()
        service.shutdown()
