"""The voices folder, the served voice list (Wyoming describe and GET /v1/audio/voices) and the engine's clone
prompts agree after every add and remove over HTTP, whether it succeeded, failed, was cancelled by its client, ran
beside others, or was cut by a crash (issue 40): seeded random sequences of those, with restarts, on the HTTP app
in-process and a fake Base engine that checks each clip as the real one does. And a stored clip clones exactly as
the original file does (issue 37)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import time
import tracemalloc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import aiohttp
import numpy as np
import pytest
import soundfile
from voice_clip import write_clip

from wyoming_qwen3tts.__main__ import all_voices
from wyoming_qwen3tts.errors import Qwen3TTSError, ReferenceAudioError, VoiceError
from wyoming_qwen3tts.http.app import HttpConfig, HttpServer, build_app
from wyoming_qwen3tts.model.reference_audio import read_reference_audio
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.settings import Settings
from wyoming_qwen3tts.voices import VoicePreset, check_voice_name, scan_voice_folder
from wyoming_qwen3tts.voices.folder import (
    remove_steps,
    repair_voice_folder,
    store_steps,
    voice_preset,
)

pytestmark = pytest.mark.timeout(300)

NAMES = ["anna", "bob", "dora", "ed"]
CONFIGURED = "carl"  # a [[voices]] entry whose clip lies in the voices folder


class FakeBaseEngine:
    """A Base engine without a model: a clip is read and checked as Engine.clone_voice does, and its prompt is a
    marker of what it was cloned from. `slow` makes cloning take time (for cancellations); `broken` names fail."""

    model_type = "base"
    model_types: ClassVar[set[str]] = {"base"}
    max_streams = 1
    speakers: ClassVar[list[str]] = []
    languages: ClassVar[list[str]] = ["auto", "english", "german"]
    supports_instruct = False

    def announcement_identity(self) -> str:
        return "fake base"

    def warm_up(self) -> float:
        return 0.0

    def warm_thread(self) -> None:
        pass

    def __init__(self) -> None:
        self.clone_prompts: dict[str, object] = {}
        self.slow = 0.0
        self.broken: set[str] = set()

    def clone_voices(self, presets: list[VoicePreset]) -> dict[str, str]:
        failed: dict[str, str] = {}
        for preset in presets:
            time.sleep(self.slow)
            try:
                audio = read_reference_audio(preset.reference_audio)  # type: ignore[arg-type]
                if preset.name in self.broken:
                    raise VoiceError("the encoder failed")
                self.clone_prompts[preset.name] = (audio.sha256, preset.reference_text)
            except Qwen3TTSError as err:
                failed[preset.name] = str(err)
        return failed


@dataclass
class Running:
    folder: Path
    service: TtsService
    engine: FakeBaseEngine
    server: HttpServer
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.server.url


def _settings(folder: Path, more: list[VoicePreset]) -> Settings:
    configured = VoicePreset(name=CONFIGURED, reference_audio=folder / f"{CONFIGURED}.wav", x_vector_only=True)
    return Settings(model="fake", voices_dir=folder, voices=[configured, *more])


@contextlib.asynccontextmanager
async def boot(folder: Path, more: list[VoicePreset] | None = None) -> AsyncIterator[Running]:
    """The server as __main__ starts it, on the fake engine: the folder repaired and scanned, every voice cloned;
    configured voices: CONFIGURED and `more`."""
    settings = _settings(folder, more or [])
    voices = all_voices(settings)
    engine = FakeBaseEngine()

    def load() -> FakeBaseEngine:
        engine.clone_voices([v for v in voices if v.kind == "base"])
        return engine

    service = TtsService(load, voices)  # type: ignore[arg-type]
    await service.start_loading()
    config = HttpConfig.from_settings(settings)
    config = HttpConfig(
        uri="tcp://127.0.0.1:0",
        voices_dir=folder,
        configured_voices=config.configured_voices,
        max_uploads=8,
        upload_timeout=10,
    )
    server = HttpServer(build_app(service, config), config)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield Running(folder, service, engine, server, http)
    finally:
        await server.close()
        service.shutdown()


def _wav(samples: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV")
    return out.getvalue()


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("clips")
    return {
        "good": write_clip(tmp / "good.wav", seconds=1.5).read_bytes(),
        "other": write_clip(tmp / "other.wav", seconds=1.2, seed=1).read_bytes(),
        "junk": b"RIFF not really a wav file",
        "silent": _wav(np.zeros(24000, dtype=np.float32), 24000),
    }


def new_folder(tmp_path: Path, clips: dict[str, bytes]) -> Path:
    """A voices folder holding the configured voice's clip."""
    folder = tmp_path / "voices"
    folder.mkdir()
    (folder / f"{CONFIGURED}.wav").write_bytes(clips["good"])
    return folder


async def post(run: Running, fields: dict[str, str], audio: bytes | None) -> int:
    form = aiohttp.FormData(default_to_multipart=True)
    for key, value in fields.items():
        form.add_field(key, value)
    if audio is not None:
        form.add_field("audio", audio, filename="clip.wav", content_type="audio/wav")
    async with run.http.post(f"{run.url}/v1/audio/voices", data=form) as response:
        await response.read()
        return response.status


async def delete(run: Running, name: str) -> int:
    async with run.http.delete(f"{run.url}/v1/audio/voices/{name}") as response:
        await response.read()
        return response.status


async def settle(run: Running) -> None:
    """Wait until no change of the folder runs (a cancelled request's change runs on to its end)."""
    for _ in range(500):
        if not run.service.jobs_running and not _uploads(run)._changes and not _uploads(run)._lock.locked():
            return
        await asyncio.sleep(0.02)
    pytest.fail("a change of the voices folder did not end")


def _uploads(run: Running):  # type: ignore[no-untyped-def]
    for route in run.server._runner.app.router.routes():
        handler = route.handler
        if getattr(handler, "__name__", "") == "add":
            return handler.__self__  # type: ignore[attr-defined]
    raise AssertionError("no upload route")


async def check_state(run: Running) -> set[str]:
    """The invariant: folder, catalog, describe, the HTTP list and the engine's prompts name the same folder
    voices; nothing half-written is left. Returns those voices."""
    await settle(run)
    found, problems = scan_voice_folder(run.folder)
    assert problems == []
    in_folder = {v.name for v in found} - {CONFIGURED}
    catalog = run.service.catalog
    cloned = {name for name, preset in catalog.presets.items() if preset.kind == "base"} - {CONFIGURED}
    described = {v.name for v in run.service.info().tts[0].voices} - {CONFIGURED}
    async with run.http.get(f"{run.url}/v1/audio/voices") as response:
        listed = {v["id"] for v in (await response.json())["data"]} - {CONFIGURED}
    prompts = set(run.engine.clone_prompts) - {CONFIGURED}
    assert in_folder == cloned == described == listed == prompts, (in_folder, cloned, described, listed, prompts)
    assert set(catalog.clones) - {CONFIGURED} == in_folder
    leftovers = [p.name for p in run.folder.iterdir() if p.is_file() and p.name.startswith(".")]
    assert leftovers == []
    assert CONFIGURED in catalog.presets and (run.folder / f"{CONFIGURED}.wav").is_file()
    return in_folder


async def _add(run: Running, rng: random.Random, clips: dict[str, bytes], name: str) -> tuple[int, bool]:
    """One add of a random kind; returns its status and whether its upload is a good one."""
    kind = rng.choice(["good", "good", "good", "junk", "silent", "language", "no-text", "broken"])
    fields = {"name": name, "text": "Hello there."}
    audio = clips["good"] if kind in ("language", "no-text", "broken") else clips[kind]
    good = kind == "good"
    if kind == "language":
        fields["language"] = rng.choice(["xx", "klingon", "de"])
        good = fields["language"] == "de"
    if kind == "no-text":
        fields = {"name": name}
    if kind == "broken":
        run.engine.broken.add(name)
    try:
        return await post(run, fields, audio), good
    finally:
        run.engine.broken.discard(name)


async def _cancelled_add(run: Running, rng: random.Random, clips: dict[str, bytes], name: str) -> None:
    """An add whose client goes away after a random moment: before, during or after the clone."""
    run.engine.slow = 0.15
    try:
        task = asyncio.ensure_future(post(run, {"name": name, "text": "Hi."}, clips["good"]))
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await settle(run)
    finally:
        run.engine.slow = 0.0


def _crash(folder: Path, rng: random.Random, clips_dir: Path, name: str) -> int:
    """What a process killed in the middle of an add or a remove leaves: its first k durable steps."""
    if (folder / f"{name}.wav").exists() and rng.random() < 0.5:
        steps = remove_steps(folder, name, [])
    else:
        (folder / f"{name}.wav").unlink(missing_ok=True)
        mono, rate = soundfile.read(str(clips_dir / "good.wav"), dtype="float32", always_2d=True)
        preset = voice_preset(folder, name, rng.choice([None, "Hello."]), x_vector_only=True, language="de")
        steps = store_steps(preset, mono.mean(axis=1), rate)
    k = rng.randrange(0, 8)
    done = 0
    for _ in steps:
        done += 1
        if done >= k:
            break
    return done


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_random_adds_removes_cancels_crashes_and_restarts_keep_one_state(
    seed: int, tmp_path: Path, clips: dict[str, bytes]
) -> None:
    rng = random.Random(seed)
    folder = new_folder(tmp_path, clips)
    clips_dir = tmp_path / "clips"
    clips_dir.mkdir()
    (clips_dir / "good.wav").write_bytes(clips["good"])
    tried: dict[str, int] = {}
    run_context = boot(folder)
    run = await run_context.__aenter__()
    try:
        for _ in range(30):
            op = rng.choice(["add", "add", "add", "remove", "remove", "cancel", "concurrent", "restart", "crash"])
            tried[op] = tried.get(op, 0) + 1
            name = rng.choice(NAMES)
            before = await check_state(run)
            if op == "add":
                status, good = await _add(run, rng, clips, name)
                after = await check_state(run)
                assert (status == 201) == (good and name not in before), (name, good, status)
                assert after == (before | {name} if status == 201 else before), status
                assert status in (201, 400, 409)
            elif op == "remove":
                target = rng.choice([*NAMES, CONFIGURED, "nobody"])
                status = await delete(run, target)
                after = await check_state(run)
                assert (status == 200) == (target in before), (target, status)
                assert after == before - {target}
            elif op == "cancel":
                await _cancelled_add(run, rng, clips, name)
                after = await check_state(run)
                assert after - before <= {name} and before <= after
            elif op == "concurrent":
                results = await asyncio.gather(
                    post(run, {"name": name, "text": "One."}, clips["good"]),
                    post(run, {"name": name, "x_vector_only": "true"}, clips["other"]),
                    delete(run, name),
                )
                after = await check_state(run)
                assert sum(status == 201 for status in results[:2]) <= 1 + (results[2] == 200), results
            elif op in ("restart", "crash"):
                await run_context.__aexit__(None, None, None)
                if op == "crash":
                    _crash(folder, rng, clips_dir, name)
                run_context = boot(folder)
                run = await run_context.__aenter__()
                after = await check_state(run)
                if op == "restart":
                    assert after == before  # nothing lost, nothing gained
                else:  # an add cut anywhere is undone; a remove cut anywhere is finished
                    assert after == before - {name}
    finally:
        await run_context.__aexit__(None, None, None)
    assert set(tried) >= {"add", "remove", "restart"}, tried


async def test_a_configured_voice_with_its_clip_in_the_folder_is_never_removed(
    tmp_path: Path, clips: dict[str, bytes]
) -> None:
    folder = new_folder(tmp_path, clips)
    async with boot(folder) as run:
        async with run.http.get(f"{run.url}/v1/audio/voices") as response:
            (carl,) = [v for v in (await response.json())["data"] if v["id"] == CONFIGURED]
        assert carl["removable"] is False
        assert await delete(run, CONFIGURED) == 404
        assert (folder / f"{CONFIGURED}.wav").is_file() and CONFIGURED in run.service.catalog.presets


async def test_a_clip_that_a_configured_voice_uses_is_not_removed(tmp_path: Path, clips: dict[str, bytes]) -> None:
    folder = new_folder(tmp_path, clips)
    (folder / "anna.wav").write_bytes(clips["good"])
    also = VoicePreset(name="anna-too", reference_audio=folder / "anna.wav", x_vector_only=True)
    async with boot(folder, [also]) as run:
        async with run.http.delete(f"{run.url}/v1/audio/voices/anna") as response:
            assert response.status == 409 and (await response.json())["error"]["code"] == "voice-in-use"
        assert (folder / "anna.wav").is_file() and {"anna", "anna-too"} <= set(run.service.catalog.presets)


async def test_an_unknown_language_breaks_nothing(tmp_path: Path, clips: dict[str, bytes]) -> None:
    """Defect 1: the language was checked only after the voice was stored and registered."""
    folder = new_folder(tmp_path, clips)
    async with boot(folder) as run:
        for language in ("xx", "klingon"):
            assert await post(run, {"name": "anna", "text": "Hi.", "language": language}, clips["good"]) == 400
        assert await check_state(run) == set()
        assert await post(run, {"name": "anna", "text": "Hi.", "language": "de"}, clips["good"]) == 201
        assert await post(run, {"name": "bob", "x_vector_only": "true"}, clips["good"]) == 201
        assert await delete(run, "anna") == 200
        assert await check_state(run) == {"bob"}


async def test_the_service_takes_a_voice_whole_or_not_at_all(tmp_path: Path, clips: dict[str, bytes]) -> None:
    """TtsService.add_voice on its own: a language the model does not speak, or a clone that fails, leaves no preset
    and no prompt; later adds work."""
    folder = new_folder(tmp_path, clips)
    (folder / "x.wav").write_bytes(clips["good"])
    async with boot(folder) as run:
        service, engine = run.service, run.engine
        bad_language = VoicePreset(name="y", reference_audio=folder / "x.wav", x_vector_only=True, language="xx")
        with pytest.raises(Qwen3TTSError):
            await service.add_voice(bad_language)
        engine.broken.add("z")
        with pytest.raises(VoiceError):
            await service.add_voice(VoicePreset(name="z", reference_audio=folder / "x.wav", x_vector_only=True))
        assert {"y", "z"}.isdisjoint(service.catalog.presets) and {"y", "z"}.isdisjoint(engine.clone_prompts)
        await service.add_voice(
            VoicePreset(name="w", reference_audio=folder / "x.wav", x_vector_only=True, language="de")
        )
        assert "w" in service.catalog.presets and "w" in engine.clone_prompts
        service.remove_voice("w")
        assert "w" not in service.catalog.presets and "w" not in engine.clone_prompts


def test_startup_repair_undoes_every_cut_add_and_finishes_every_cut_remove(tmp_path: Path) -> None:
    folder = tmp_path / "voices"
    clip = write_clip(tmp_path / "clip.wav", seconds=1.5)
    mono, rate = soundfile.read(str(clip), dtype="float32", always_2d=True)
    preset = voice_preset(folder, "anna", "Hello.", language="de", description="Anna")
    total = sum(1 for _ in store_steps(preset, mono.mean(axis=1), rate))
    for file in folder.iterdir():
        file.unlink()
    for cut in range(total + 1):
        steps = store_steps(preset, mono.mean(axis=1), rate)
        for _ in range(cut):
            next(steps)
        steps.close()
        repair_voice_folder(folder)
        assert list(folder.iterdir()) == [], cut  # an add is done only once committed
    # A committed voice, then removes cut at every step: finished once begun.
    for cut in range(8):
        for _ in store_steps(preset, mono.mean(axis=1), rate):
            pass
        (folder / ".anna.adding").unlink()
        steps = remove_steps(folder, "anna", [])
        for _ in range(cut):
            next(steps, None)
        steps.close()
        repair_voice_folder(folder)
        left = sorted(p.name for p in folder.iterdir())
        assert left == (["anna.toml", "anna.txt", "anna.wav"] if cut == 0 else []), cut  # begun: finished
    # Files of the user's own that look like nothing of ours stay.
    (folder / ".hidden").write_text("x")
    (folder / "notes.txt").write_text("x")
    assert repair_voice_folder(folder) == []
    assert sorted(p.name for p in folder.iterdir()) == [".hidden", "notes.txt"]


def test_a_voice_name_is_the_whole_name() -> None:
    """Defect 9: re.match with "$" let a trailing newline through."""
    for bad in ("a\n", "a\r", "a\n\n", "\na", "a/b", "", "a" * 65, ".a"):
        with pytest.raises(ValueError):
            check_voice_name(bad)
    assert check_voice_name("Anna 2.0-b_c") == "Anna 2.0-b_c"


# -- the stored clip is the original's sound (issue 37) ------------------------------------------------------


def test_a_16khz_clip_clones_from_the_folder_as_from_its_file(tiny_base_checkpoint: Path, tmp_path: Path) -> None:
    """Before: stored as 24 kHz 16-bit, the speaker embedding differed from the original's by 5e-3 relative."""
    import torch

    from wyoming_qwen3tts.engine import Engine, EngineOptions
    from wyoming_qwen3tts.model.reference_audio import read_mono
    from wyoming_qwen3tts.voices.folder import commit_voice, store_voice

    original = write_clip(tmp_path / "anna-16k.wav", seconds=2.0)  # 16 kHz stereo float
    assert soundfile.info(str(original)).samplerate == 16000
    mono, rate, _ = read_mono(original)
    folder = tmp_path / "voices"
    preset = store_voice(folder, "anna", mono, rate, "Hello, I am Anna.")
    commit_voice(folder, "anna")
    assert preset.reference_audio is not None
    assert read_reference_audio(preset.reference_audio).sha256 == read_reference_audio(original).sha256
    engine = Engine.from_pretrained(
        str(tiny_base_checkpoint), EngineOptions(device="cpu", dtype="float32", max_streams=1)
    )
    from_file = engine.clone_voice(original, "Hello, I am Anna.")
    from_folder = engine.clone_voice(preset.reference_audio, "Hello, I am Anna.")
    assert torch.equal(from_file.speaker_embedding, from_folder.speaker_embedding)
    assert from_file.ref_codes is not None and from_folder.ref_codes is not None
    assert torch.equal(from_file.ref_codes, from_folder.ref_codes)


# -- decoding a clip is bounded whatever the file claims -----------------------------------------------------


def _flac(path: Path, channels: int, rate: int, seconds: float) -> Path:
    """A FLAC of DC on every channel (it compresses to almost nothing), written in blocks."""
    with soundfile.SoundFile(str(path), "w", samplerate=rate, channels=channels, format="FLAC", subtype="PCM_16") as f:
        block = np.full((rate, channels), 0.25, dtype=np.float32)
        for _ in range(int(seconds)):
            f.write(block)
    return path


def test_decoding_a_clip_is_bounded(tmp_path: Path) -> None:
    """Defect 5: 10 KB of FLAC (8 channels, 655 kHz, 29 s) cost 740 MB; now refused from its header, and the worst
    clip accepted (8 channels at 192 kHz, 29 s) is mixed down block by block."""
    too_fast = _flac(tmp_path / "fast.flac", 2, 655_000, 2)
    with pytest.raises(ReferenceAudioError, match="655000 Hz"):
        read_reference_audio(too_fast)
    too_many = tmp_path / "channels.wav"
    soundfile.write(str(too_many), np.full((24000, 9), 0.25, dtype=np.float32), 24000)
    with pytest.raises(ReferenceAudioError, match="9 channels"):
        read_reference_audio(too_many)
    worst = _flac(tmp_path / "worst.flac", 8, 192_000, 29)
    assert worst.stat().st_size < 2_000_000
    tracemalloc.start()
    try:
        audio = read_reference_audio(worst)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert abs(audio.seconds - 29) < 0.01
    # Mono at 192 kHz (22 MB) + one block (4 MB) + the 24 kHz result: 31 MB measured; decoding all
    # channels at once held 178 MB.
    assert peak < 40e6, peak
