"""Cloned and designed voices in the server (server side): presets and the voices folder become
Wyoming voices of a Base or VoiceDesign model, spoken one-shot and streamed; bad clips are skipped with an
error in the log and the server keeps serving. Tiny random checkpoints on the CPU; the real __main__ load path
(all_voices, load_engine) behind the real TtsService and handler, talked to with the wyoming client.
"""

from __future__ import annotations

import asyncio
import logging
import os
from functools import partial
from pathlib import Path

import pytest
from in_process_wyoming import audio_of, read_until
from pydantic import ValidationError
from voice_clip import write_clip
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.server import AsyncServer, AsyncTcpServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from wyoming_qwen3tts.__main__ import all_voices, load_engine
from wyoming_qwen3tts.engine import SAMPLES_PER_FRAME
from wyoming_qwen3tts.handler import HandlerConfig, Qwen3TTSEventHandler
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.settings import Settings
from wyoming_qwen3tts.voices import VoiceCatalog, VoicePreset, scan_voice_folder

pytestmark = pytest.mark.timeout(300)

FRAME_BYTES = SAMPLES_PER_FRAME * 2


def test_a_preset_is_one_kind_of_voice(tmp_path: Path) -> None:
    assert VoicePreset(name="a", speaker="ryan").kind == "custom_voice"
    assert VoicePreset(name="b", reference_audio=tmp_path / "b.wav", x_vector_only=True).kind == "base"
    assert VoicePreset(name="c", design="A warm voice").kind == "voice_design"
    for bad in (
        dict(name="d"),
        dict(name="e", speaker="ryan", design="x"),
        dict(name="f", speaker="ryan", x_vector_only=True),
        dict(name="g", design="x", instruct="calm"),
        dict(name="../h", speaker="ryan"),
        dict(name="i" * 65, speaker="ryan"),
    ):
        with pytest.raises(ValidationError):
            VoicePreset(**bad)


def test_voice_folder_scan(tmp_path: Path) -> None:
    folder = tmp_path / "voices"
    folder.mkdir()
    write_clip(folder / "anna.wav")
    (folder / "anna.txt").write_text("Hello, this is Anna speaking.\n")
    write_clip(folder / "bob.flac")
    (folder / "bob.toml").write_text('x_vector_only = true\nlanguage = "de"\ndescription = "Bob"\n')
    write_clip(folder / "carl.wav")
    (folder / "carl.toml").write_text("pitch = 3\n")  # not a setting of a voice
    (folder / "notes.md").write_text("not a voice")
    outside = write_clip(tmp_path / "outside.wav")
    (folder / "linked.wav").symlink_to(outside)  # a link out of the folder is no voice
    voices, problems = scan_voice_folder(folder)
    by_name = {v.name: v for v in voices}
    assert sorted(by_name) == ["anna", "bob"]
    assert by_name["anna"].reference_text == "Hello, this is Anna speaking." and not by_name["anna"].x_vector_only
    assert by_name["bob"].x_vector_only and by_name["bob"].language == "de" and by_name["bob"].reference_text is None
    assert len(problems) == 2 and any("carl.toml" in p and "pitch" in p for p in problems)
    assert any("linked.wav" in p for p in problems)
    assert scan_voice_folder(tmp_path / "missing") == ([], [])


def test_catalog_offers_the_voices_of_the_loaded_kind(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    presets = [
        VoicePreset(name="ryan-calm", speaker="ryan", instruct="calm"),
        VoicePreset(name="anna", reference_audio=tmp_path / "anna.wav", reference_text="Hi."),
        VoicePreset(name="junk", reference_audio=tmp_path / "junk.wav", x_vector_only=True),
        VoicePreset(name="narrator", design="A calm narrator"),
    ]
    loading = VoiceCatalog(["ryan"], ["auto", "english"], presets, model_type=None)
    assert sorted(loading.presets) == ["anna", "junk", "narrator", "ryan-calm"]  # all listed while loading
    with caplog.at_level(logging.ERROR):
        base = VoiceCatalog([], ["auto", "english"], presets, model_type="base", clones={"anna": object()})
    assert list(base.presets) == ["anna"] and base.default_voice == "anna"
    assert "could not be cloned" in base.skipped["junk"] and "CustomVoice" in base.skipped["ryan-calm"]
    assert "Voice 'narrator' is not offered" in caplog.text
    choice = base.resolve(SynthesizeVoice(name="anna"))
    assert choice.clone is base.clones["anna"] and choice.speaker == ""
    design = VoiceCatalog([], ["auto", "english"], presets, model_type="voice_design")
    assert list(design.presets) == ["narrator"]
    assert design.resolve(None).instruct == "A calm narrator"


# -- end to end -------------------------------------------------------------------------------------


def _tiny_settings(checkpoint: Path, **settings: object) -> Settings:
    """A tiny random checkpoint's settings on the CPU in float32, six frames a sentence in groups of two."""
    return Settings(
        model=str(checkpoint),
        device="cpu",
        dtype="float32",
        max_frames=6,
        first_chunk_frames=1,
        chunk_frames=2,
        **settings,
    )


async def _serve(settings: Settings) -> tuple[AsyncServer, int, TtsService]:
    voices = all_voices(settings)
    service = TtsService(partial(load_engine, settings, voices), voices, default_voice=settings.voice)
    service.start_loading()
    server = AsyncServer.from_uri("tcp://127.0.0.1:0")
    assert isinstance(server, AsyncTcpServer)
    await server.start(partial(Qwen3TTSEventHandler, service, HandlerConfig(seed=1)))
    await asyncio.wait_for(asyncio.shield(service.loaded), 240)  # type: ignore[arg-type]
    return server, server._server.sockets[0].getsockname()[1], service  # type: ignore[union-attr]


async def _describe(port: int) -> Info:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        return Info.from_event(await asyncio.wait_for(client.read_event(), 10))  # type: ignore[arg-type]


async def _speak(port: int, voice: str, text: str, *, streaming: bool) -> int:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        if streaming:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=voice)).event())
            for i in range(0, len(text), 5):
                await client.write_event(SynthesizeChunk(text=text[i : i + 5]).event())
            await client.write_event(SynthesizeStop().event())
            events = await read_until(client, "synthesize-stopped", timeout=120)
        else:
            await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
            events = await read_until(client, "audio-stop", timeout=120)
    assert not [e for e in events if e.type == "error"], events
    audio = audio_of(events)
    assert len(audio) % FRAME_BYTES == 0
    return len(audio) // FRAME_BYTES


@pytest.mark.slow
async def test_cloned_voices_listed_and_spoken(
    tiny_base_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Base model: a folder voice cloned in context (clip + transcript), a configured x-vector voice, and
    three bad ones (not audio, too short, no transcript) that are skipped with their reasons; describe lists
    the two good ones only; each is spoken one-shot and streamed; the prompts are cached on disk."""
    data = tmp_path / "data"
    folder = data / "voices"
    folder.mkdir(parents=True)
    write_clip(folder / "anna.wav")
    (folder / "anna.txt").write_text("Hello there, this is Anna.")
    (folder / "junk.wav").write_text("this is not audio")
    write_clip(folder / "short.wav", seconds=0.5)
    (folder / "short.txt").write_text("Hi.")
    write_clip(folder / "mute.wav")  # no transcript, in-context by default: refused
    xvec = VoicePreset(name="bob", reference_audio=write_clip(tmp_path / "bob.wav", seed=3), x_vector_only=True)
    settings = _tiny_settings(tiny_base_checkpoint, data_dir=data, voices=[xvec])
    with caplog.at_level(logging.INFO):
        server, port, service = await _serve(settings)
    try:
        assert service.load_error is None
        (program,) = (await _describe(port)).tts
        assert sorted(v.name for v in program.voices) == ["anna", "bob"]
        assert "Base" in (program.description or "")
        for name in ("junk", "short", "mute"):
            assert f"Voice {name!r} could not be cloned" in caplog.text, name
        assert "not an audio file" in caplog.text and "at least 1 s" in caplog.text and "transcript" in caplog.text
        for voice in ("anna", "bob"):
            for streaming in (False, True):
                frames = await _speak(port, voice, "Good morning, how are you today?", streaming=streaming)
                assert 1 <= frames <= 6, (voice, streaming, frames)
        assert len(list((folder / ".prompts").glob("*.safetensors"))) == 2
        # An unknown voice still gets a clear error, and the server keeps serving.
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="junk")).event())
            event = await asyncio.wait_for(client.read_event(), 30)
        assert event is not None and event.type == "error" and "junk" in event.data["text"]
        assert await _speak(port, "anna", "Still here.", streaming=False) >= 1
    finally:
        await server.stop()
        service.shutdown()

    # A restart reads the cached prompts (a miss would compute and write them again) and clones nothing anew.
    before = {p: os.stat(p).st_mtime_ns for p in (folder / ".prompts").glob("*.safetensors")}
    engine = load_engine(settings, all_voices(settings))
    assert sorted(engine.clone_prompts) == ["anna", "bob"]
    assert {p: os.stat(p).st_mtime_ns for p in (folder / ".prompts").glob("*.safetensors")} == before
    assert engine.cloner is not None and engine.cloner.cache is not None
    engine.cloner.compute = None  # type: ignore[assignment]  # running the encoders now would fail
    assert engine.clone_voice(folder / "anna.wav", "Hello there, this is Anna.").ref_codes is not None


@pytest.mark.slow
async def test_designed_voice_listed_and_spoken(tiny_voice_design_checkpoint: Path) -> None:
    """A VoiceDesign model: the design preset is its voice (speaker presets skipped), spoken one-shot and streamed."""
    voices = [
        VoicePreset(name="narrator", design="A calm, deep narrator."),
        VoicePreset(name="ryan-calm", speaker="ryan"),
    ]
    settings = _tiny_settings(tiny_voice_design_checkpoint, voices=voices)
    server, port, service = await _serve(settings)
    try:
        (program,) = (await _describe(port)).tts
        assert [v.name for v in program.voices] == ["narrator"]
        for streaming in (False, True):
            assert 1 <= await _speak(port, "narrator", "Once upon a time.", streaming=streaming) <= 6
    finally:
        await server.stop()
        service.shutdown()


@pytest.mark.slow
async def test_one_server_several_models(
    tiny_checkpoint: Path, tiny_base_checkpoint: Path, tiny_voice_design_checkpoint: Path, tmp_path: Path
) -> None:
    """CustomVoice + Base + VoiceDesign in one server (extra_models): describe lists the speakers, a preset, a
    cloned and a designed voice, and each is spoken by its own model; a second model of a type is refused."""
    voices = [
        VoicePreset(name="ryan-calm", speaker="ryan", instruct="Calm."),
        VoicePreset(name="anna", reference_audio=write_clip(tmp_path / "anna.wav"), reference_text="Hello there."),
        VoicePreset(name="narrator", design="A calm, deep narrator."),
    ]
    extra_models = [str(tiny_base_checkpoint), str(tiny_voice_design_checkpoint)]
    settings = _tiny_settings(tiny_checkpoint, extra_models=extra_models, voices=voices)
    server, port, service = await _serve(settings)
    try:
        assert service.load_error is None
        (program,) = (await _describe(port)).tts
        names = [v.name for v in program.voices]
        assert {"ryan", "vivian", "ryan-calm", "anna", "narrator"} <= set(names)
        assert all(kind in (program.description or "") for kind in ("CustomVoice", "Base", "VoiceDesign"))
        engines = service._engine.by_kind  # type: ignore[union-attr]
        asked: dict[str, int] = {}
        for kind, engine in engines.items():
            original = engine.synthesize

            def counting(request, cancel=None, kind=kind, original=original):  # type: ignore[no-untyped-def]
                asked[kind] = asked.get(kind, 0) + 1
                return original(request, cancel)

            engine.synthesize = counting  # type: ignore[method-assign]
        for voice, kind in (
            ("ryan", "custom_voice"),
            ("ryan-calm", "custom_voice"),
            ("anna", "base"),
            ("narrator", "voice_design"),
        ):
            before = asked.get(kind, 0)
            assert 1 <= await _speak(port, voice, "Good evening.", streaming=voice == "anna") <= 6
            assert asked.get(kind, 0) == before + 1, (voice, asked)
    finally:
        await server.stop()
        service.shutdown()

    from wyoming_qwen3tts.engine_set import EngineSet
    from wyoming_qwen3tts.errors import VoiceError

    with pytest.raises(VoiceError, match="two CustomVoice models"):
        EngineSet(list(engines.values())[:1] * 2)


def test_a_cloned_voice_reads_streamed_text_by_default(tiny_base_checkpoint: Path, tmp_path: Path) -> None:
    """non_streaming_text unset: a cloned voice's prompt is built as the reference's generate_voice_clone does
    (text streamed), the same prompt as asking for it; asking for the other mode gives another prompt."""
    from wyoming_qwen3tts.engine import Engine, EngineOptions
    from wyoming_qwen3tts.request import SynthesisRequest

    engine = Engine.from_pretrained(str(tiny_base_checkpoint), EngineOptions(device="cpu", dtype="float32"))
    clone = engine.clone_voice(write_clip(tmp_path / "a.wav"), "Hello there.")
    text = "Good evening, everyone."

    def length(**kw: object) -> int:
        return engine.prepare(SynthesisRequest(text=text, speaker="", clone=clone, **kw)).length  # type: ignore[arg-type]

    assert length() == length(non_streaming_text=False) != length(non_streaming_text=True)
