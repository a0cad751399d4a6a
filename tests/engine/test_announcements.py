"""The announcement cache (wyoming_qwen3tts/announcements.py): keys, LRU bounds in memory and on disk, what is
stored (complete takes only, none the runaway guard cut short), and through the real server: a repeated sentence is replayed at once on both
protocols, the same take (sampled voice), after a restart too (from disk)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import openai
import pytest
import torch
from fake_engine import FakeEngine
from http_server import HttpServer
from prometheus_text import metric_value
from reliability_support import Raw
from tiny_server import start_tiny
from wyoming.event import Event

from wyoming_qwen3tts.announcements import SUFFIX, AnnouncementCache, checkpoint_identity
from wyoming_qwen3tts.engine_set import EngineSet
from wyoming_qwen3tts.errors import Qwen3TTSError
from wyoming_qwen3tts.model.prompt import ClonePrompt
from wyoming_qwen3tts.request import SAMPLES_PER_FRAME, AudioChunk, SamplingParams, SynthesisRequest
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.settings import Settings, build_parser, load_settings

pytestmark = pytest.mark.timeout(300)

REQUEST = SynthesisRequest(text="The washing machine is done.", speaker="ryan", language="english")


def take(frames: int, value: int = 1) -> list[AudioChunk]:
    """`frames` one-frame chunks whose samples are `value`, `value + 1`, ..."""
    return [
        AudioChunk(
            pcm=np.full(SAMPLES_PER_FRAME, value + i, "<i2").tobytes(), codes=np.full((1, 16), value + i, np.int64)
        )
        for i in range(frames)
    ]


FRAME_BYTES = SAMPLES_PER_FRAME * 2 + 16 * 8  # one chunk in memory: its PCM and its codes


async def record(cache: AnnouncementCache, request: SynthesisRequest, engine: object, chunks: list[AudioChunk]) -> None:
    found = await cache.lookup(request, engine)
    assert not found.hit
    for chunk in chunks:
        found.record(chunk)
    found.complete()


def pcm(chunks: list[AudioChunk] | None) -> bytes:
    assert chunks is not None
    return b"".join(c.pcm for c in chunks)


# -- keys --------------------------------------------------------------------------------------------


def test_key_covers_everything_that_shapes_the_audio() -> None:
    cache = AnnouncementCache()
    engine = FakeEngine()
    key = cache.key(REQUEST, engine)
    assert cache.key(replace(REQUEST), engine) == key  # the same request, another object
    others = [
        replace(REQUEST, text="The washing machine is done!"),
        replace(REQUEST, speaker="aiden"),
        replace(REQUEST, language="german"),
        replace(REQUEST, instruct="Whisper."),
        replace(REQUEST, seed=3),
        replace(REQUEST, sampling=SamplingParams.greedy()),
        replace(REQUEST, max_frames=20),
    ]
    assert len({cache.key(r, engine) for r in others} | {key}) == len(others) + 1
    assert cache.key(REQUEST, FakeEngine(frame_delay=0)) == key  # another engine object, the same model
    other_model = FakeEngine()
    other_model.identity = "another model"
    assert cache.key(REQUEST, other_model) != key


def test_key_of_a_cloned_voice_is_its_prompt() -> None:
    cache = AnnouncementCache()
    engine = FakeEngine()
    voice = ClonePrompt(speaker_embedding=torch.ones(8))
    same = ClonePrompt(speaker_embedding=torch.ones(8))
    other = ClonePrompt(speaker_embedding=torch.ones(8) * 1.001)  # the voice re-added with another clip
    in_context = ClonePrompt(torch.ones(8), ref_codes=torch.zeros(3, 16, dtype=torch.int64), ref_text_ids=[1, 2])
    keys = [cache.key(replace(REQUEST, speaker="", clone=c), engine) for c in (voice, same, other, in_context)]
    assert keys[0] == keys[1] and len(set(keys)) == 3


def test_checkpoint_identity_follows_the_weight_files_and_the_settings(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"1234")
    before = checkpoint_identity("Engine", tmp_path, "config", [1, 2])
    assert checkpoint_identity("Engine", tmp_path, "config", [1, 2]) == before
    assert checkpoint_identity("Engine", tmp_path, "config", [1, 3]) != before
    weights.write_bytes(b"12345")  # retrained or replaced: another size (and mtime)
    assert checkpoint_identity("Engine", tmp_path, "config", [1, 2]) != before


def test_several_models_are_identified_by_each_one() -> None:
    custom, base = FakeEngine(), FakeEngine()
    custom.model_type, base.model_type = "custom_voice", "base"  # type: ignore[attr-defined]
    base.identity = "fake base"
    both = EngineSet([custom, base]).announcement_identity()  # type: ignore[list-item]
    assert both not in (custom.announcement_identity(), base.announcement_identity())
    assert EngineSet([custom, base]).announcement_identity() == both  # type: ignore[list-item]
    base.identity = "another base"
    assert EngineSet([custom, base]).announcement_identity() != both  # type: ignore[list-item]


# -- memory and disk ---------------------------------------------------------------------------------


async def test_memory_lru_is_bounded_by_bytes() -> None:
    cache = AnnouncementCache(memory_mb=3 * FRAME_BYTES / 2**20)  # room for three frames
    engine = FakeEngine()
    first, second, third = (replace(REQUEST, text=t) for t in ("One.", "Two.", "Three."))
    await record(cache, first, engine, take(1, 10))
    await record(cache, second, engine, take(2, 20))
    assert (await cache.lookup(first, engine)).hit  # first is now the most recently used
    await record(cache, third, engine, take(1, 30))  # over the limit: second (least recently used) goes
    assert cache.memory_bytes <= cache.memory_limit
    assert pcm((await cache.lookup(first, engine)).chunks) == pcm(take(1, 10))
    assert (await cache.lookup(third, engine)).hit and not (await cache.lookup(second, engine)).hit
    await record(cache, replace(REQUEST, text="Long."), engine, take(4))  # larger than the whole tier: not kept
    assert not (await cache.lookup(replace(REQUEST, text="Long."), engine)).hit


async def test_disk_tier_survives_a_restart_and_is_bounded(tmp_path: Path) -> None:
    engine = FakeEngine()
    folder = tmp_path / "announcements"
    cache = AnnouncementCache(folder=folder, disk_mb=2.5 * (SAMPLES_PER_FRAME * 2 * 2) / 2**20)  # two 2-frame takes
    requests = [replace(REQUEST, text=f"Sentence {i}.") for i in range(3)]
    for i, request in enumerate(requests):
        await record(cache, request, engine, take(2, 10 * i))
    cache.close()
    assert len(list(folder.glob("*" + SUFFIX))) == 2 and not list(
        folder.glob(".*")
    )  # the oldest removed, no temp files
    restarted = AnnouncementCache(folder=folder, disk_mb=cache.disk_limit / 2**20)
    before = restarted.hits
    assert not (await restarted.lookup(requests[0], engine)).hit
    for i in (1, 2):
        found = await restarted.lookup(requests[i], engine)
        assert pcm(found.chunks) == pcm(take(2, 10 * i))
        assert [c.num_frames for c in found.chunks or []] == [1, 1]  # the chunks as they were spoken
        assert np.array_equal(found.chunks[1].codes, take(2, 10 * i)[1].codes)  # type: ignore[index]
    assert restarted.hits == before + 2 and restarted.misses == 1
    restarted.close()


async def test_a_damaged_file_is_dropped_not_served(tmp_path: Path) -> None:
    engine = FakeEngine()
    cache = AnnouncementCache(folder=tmp_path, memory_mb=0)
    await record(cache, REQUEST, engine, take(2))
    cache.close()
    (file,) = tmp_path.glob("*" + SUFFIX)  # noqa: ASYNC240 - a test's small folder
    file.write_bytes(file.read_bytes()[:-10])
    restarted = AnnouncementCache(folder=tmp_path, memory_mb=0)
    assert not (await restarted.lookup(REQUEST, engine)).hit
    restarted.close()
    assert not file.exists()


async def test_off_means_never_a_hit() -> None:
    cache = AnnouncementCache(enabled=False)
    engine = FakeEngine()
    found = await cache.lookup(REQUEST, engine)
    for chunk in take(2):
        found.record(chunk)
    found.complete()
    assert not (await cache.lookup(REQUEST, engine)).hit and cache.memory_bytes == 0


# -- the service: what is stored ---------------------------------------------------------------------


async def speak(
    service: TtsService, request: SynthesisRequest, cancel: threading.Event | None = None, stop_after: int | None = None
) -> bytes:
    out = []
    async for chunk in service.synthesize(request, cancel or threading.Event()):
        out.append(chunk.pcm)
        if stop_after is not None and len(out) == stop_after:
            break
    return b"".join(out)


class GuardedEngine(FakeEngine):
    """The fake engine, whose runaway guard ends the sentence when `babbles` is set (its last chunk says so)."""

    babbles = False

    def synthesize(self, request: SynthesisRequest, cancel: threading.Event | None = None) -> Iterator[AudioChunk]:
        chunks = list(super().synthesize(request, cancel))
        if self.babbles and chunks:
            chunks[-1] = replace(chunks[-1], stopped="loop")
        return iter(chunks)


async def test_service_replays_complete_takes_only() -> None:
    engine = GuardedEngine(fail_on="explode")
    service = TtsService(lambda: engine, [], announcements=AnnouncementCache())  # type: ignore[arg-type, return-value]
    await service.start_loading()
    try:
        sentence = replace(REQUEST, text="one two three")
        first = await speak(service, sentence)
        assert await speak(service, sentence) == first and len(engine.requests) == 1  # replayed, not synthesized

        cut = replace(REQUEST, text="four five six")
        await speak(service, cut, stop_after=1)  # the client went away after the first chunk
        assert len(await speak(service, cut)) == 3 * SAMPLES_PER_FRAME * 2 and len(engine.requests) == 3

        cancel = threading.Event()
        cancel.set()
        with pytest.raises(Qwen3TTSError):
            await speak(service, replace(REQUEST, text="seven eight"), cancel)
        failing = replace(REQUEST, text="explode now")
        for _ in range(2):
            with pytest.raises(Qwen3TTSError):
                await speak(service, failing)
        assert [r.text for r in engine.requests].count("explode now") == 2  # an error is never stored

        runaway = replace(REQUEST, text="babble on")
        engine.babbles = True  # the guard stops this one
        await speak(service, runaway)
        engine.babbles = False
        await speak(service, runaway)
        assert [r.text for r in engine.requests].count("babble on") == 2  # the cut take was not kept
        await speak(service, runaway)
        assert [r.text for r in engine.requests].count("babble on") == 2  # the good one was
    finally:
        service.shutdown()


# -- the real server -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("announcements-data")


def server_args(data: Path) -> list[str]:
    # Sampled (no --greedy, no --seed): every synthesis of a sentence differs, so equal audio means a replay.
    frames = ["--max-frames", "6", "--first-chunk-frames", "1", "--chunk-frames", "2"]
    return [*frames, "--data-dir", str(data), "--announcement-cache"]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, data_dir: Path) -> Iterator[HttpServer]:
    http = start_tiny(
        tmp_path_factory.mktemp("announce"), tiny_checkpoint, *server_args(data_dir), name="announce", http=True
    )
    yield http
    assert http.server.stop() == 0
    assert "Traceback" not in http.server.log_text()


async def wyoming_say(port: int, text: str) -> tuple[float, bytes]:
    """Seconds from sending the request to its first audio chunk, and all its audio."""
    client = await Raw.connect(port)
    try:
        sent = time.monotonic()
        await client.event(Event(type="synthesize", data={"text": text, "voice": {"name": "ryan"}}))
        first_audio = None
        audio = b""
        while (event := await client.read(60)) is not None and event.type != "audio-stop":
            assert event.type != "error", event.data
            if event.type == "audio-chunk":
                first_audio = first_audio or time.monotonic()
                audio += event.payload or b""
        assert first_audio is not None
        return first_audio - sent, audio
    finally:
        await client.close()


def http_say(client: openai.OpenAI, text: str) -> tuple[float, bytes]:
    """Seconds from sending the request to its first bytes of audio (pcm, streamed), and all its audio."""
    sent = time.monotonic()
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="ryan", input=text, response_format="pcm"
    ) as response:
        chunks = response.iter_bytes()
        first = next(chunks)
        waited = time.monotonic() - sent
        return waited, first + b"".join(chunks)


def cache_count(server: HttpServer, result: str) -> float:
    return metric_value(server.metrics(), "qwen3tts_announcement_cache_total", result=result)


# Each protocol's first audio of a hit, measured at the client over loopback (the issue asks for 5 ms). The
# bound leaves room for a busy CI machine; a synthesis on the tiny CPU model takes far longer.
HIT_SECONDS = 0.1


def test_a_repeated_sentence_is_replayed_on_both_protocols(real: HttpServer) -> None:
    text = "The washing machine is done."
    port = real.server.port
    hits0, misses0 = cache_count(real, "hit"), cache_count(real, "miss")
    _, first = asyncio.run(wyoming_say(port, text))
    assert cache_count(real, "miss") == misses0 + 1
    waits = []
    for _ in range(3):
        waited, again = asyncio.run(wyoming_say(port, text))
        assert again == first  # the same take, though the voice is sampled
        waits.append(waited)
    assert cache_count(real, "hit") == hits0 + 3
    http_waits = []
    client = real.client()  # one connection, kept alive, as a client making several requests has
    for _ in range(3):
        waited, audio = http_say(client, text)
        assert audio == first  # the same sentence through the same front end: the same key on both protocols
        http_waits.append(waited)
    assert cache_count(real, "hit") == hits0 + 6
    print(f"first audio of a hit: wyoming {min(waits) * 1000:.1f} ms, http {min(http_waits) * 1000:.1f} ms")
    assert min(waits) < HIT_SECONDS and min(http_waits) < HIT_SECONDS
    _, other = asyncio.run(wyoming_say(port, "The dryer is done."))  # another sentence: synthesized
    assert other != first and cache_count(real, "miss") == misses0 + 2


def test_takes_outlive_a_restart(real: HttpServer, tiny_checkpoint: Path, data_dir: Path, tmp_path: Path) -> None:
    text = "Dinner is ready."
    _, first = asyncio.run(wyoming_say(real.server.port, text))
    deadline = time.monotonic() + 10  # written on the cache's own thread
    while len(list((data_dir / "announcements").glob("*" + SUFFIX))) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    second = start_tiny(tmp_path, tiny_checkpoint, *server_args(data_dir), name="restarted")
    try:
        _, again = asyncio.run(wyoming_say(second.port, text))
        assert again == first
    finally:
        assert second.stop() == 0


def test_help_shows_the_settings() -> None:
    settings = load_settings(["--announcement-cache-mb", "8", "--no-announcement-cache"])
    assert settings.announcement_cache_mb == 8 and not settings.announcements().enabled
    assert Settings.model_fields["announcement_cache"].default is True  # on by default (the tests' environment: off)
    assert "--announcement-cache-mb" in build_parser().format_help()
