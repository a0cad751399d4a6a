"""The live voices folder (wyoming_qwen3tts/voices/watch.py): a clip and its transcript copied into the folder of a
running server are offered on both protocols within seconds, a broken clip is logged and skipped, temporary and
hidden files are no voices, a clip replaced under the same name is cloned again (and its sentences are no longer
replayed from the announcement cache), and a voice whose files are removed is withdrawn; on the real server process
with a tiny Base checkpoint on the CPU."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from http_server import HttpServer
from prometheus_text import metric_value
from reliability_support import Raw
from tiny_server import start_tiny
from voice_clip import write_clip
from wyoming.event import Event
from wyoming.info import Describe, Info

from wyoming_qwen3tts.voices.watch import is_voice_file

pytestmark = pytest.mark.timeout(300)

PICKED_UP_WITHIN = 15.0  # seconds: the watcher's debounce (0.4 s) and a clone on the tiny model, on a busy machine


@pytest.mark.parametrize(
    ("name", "voice"),
    [
        ("anna.wav", True),
        ("anna.txt", True),
        ("anna.toml", True),
        ("ANNA.FLAC", True),
        ("anna.mp3", True),
        (".anna.wav", False),
        ("anna.wav.tmp", False),
        ("anna.wav.part", False),
        (".prompts", False),
        ("notes.md", False),
        ("anna.TMP", False),
    ],
)
def test_which_files_make_voices(name: str, voice: bool) -> None:
    assert is_voice_file(Path("/data/voices") / name) is voice


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    voices = tmp_path_factory.mktemp("watched") / "voices"
    voices.mkdir()
    write_clip(voices / "anna.wav")
    (voices / "anna.txt").write_text("Hello, I am Anna.")
    return voices


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_base_checkpoint: Path, folder: Path) -> Iterator[HttpServer]:
    args = ["--max-frames", "4", "--voices-dir", str(folder), "--seed", "1", "--announcement-cache"]
    http = start_tiny(tmp_path_factory.mktemp("watch"), tiny_base_checkpoint, *args, name="watch", http=True)
    yield http
    assert http.server.stop() == 0
    assert "Traceback" not in http.server.log_text()


async def _describe(port: int) -> set[str]:
    client = await Raw.connect(port)
    try:
        await client.event(Describe().event())
        event = await client.read(10)
        assert event is not None
        (program,) = Info.from_event(event).tts
        return {voice.name for voice in program.voices}
    finally:
        await client.close()


def offered(server: HttpServer) -> tuple[set[str], set[str]]:
    """The voice names of describe (Wyoming) and of GET /v1/audio/voices (HTTP)."""
    import json

    status, body = server.get("/v1/audio/voices")
    assert status == 200, body
    return asyncio.run(_describe(server.server.port)), {v["id"] for v in json.loads(body)["data"]}


def wait_until(check: Callable[[], bool], what: str) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < PICKED_UP_WITHIN, f"not within {PICKED_UP_WITHIN} s: {what}"
        time.sleep(0.1)
    return time.monotonic() - started


async def _speak(port: int, voice: str) -> bytes:
    client = await Raw.connect(port)
    try:
        await client.event(Event(type="synthesize", data={"text": "Hello there.", "voice": {"name": voice}}))
        events = await client.read_until("audio-stop", 120)
        return b"".join(e.payload or b"" for e in events if e.type == "audio-chunk")
    finally:
        await client.close()


def test_voices_come_and_go_while_serving(server: HttpServer, folder: Path, tmp_path: Path) -> None:
    assert all("anna" in names and "bob" not in names for names in offered(server))

    # Written the way careful tools write: under a temporary name, then renamed; the temporary file wakes nothing.
    clip = write_clip(tmp_path / "bob.wav", seconds=2.5, seed=1)
    shutil.copy(clip, folder / "bob.wav.part")
    (folder / "bob.txt").write_text("Hi, this is Bob.")
    (folder / "bob.wav.part").rename(folder / "bob.wav")
    took = wait_until(lambda: all("bob" in names for names in offered(server)), "bob offered on both protocols")
    print(f"bob offered {took:.1f} s after its files were written")
    spoken = asyncio.run(_speak(server.server.port, "bob"))
    assert spoken and asyncio.run(_speak(server.server.port, "bob")) == spoken  # the second time replayed
    hits = metric_value(server.metrics(), "qwen3tts_announcement_cache_total", result="hit")

    # Another clip under the same name: cloned again, and the sentence is spoken anew in the new voice, not replayed.
    shutil.copy(write_clip(tmp_path / "other.wav", seconds=2.5, seed=7), folder / "bob.wav.tmp")
    (folder / "bob.wav.tmp").replace(folder / "bob.wav")
    wait_until(lambda: "Voice 'bob' cloned again" in server.server.log_text(), "bob cloned again")
    assert asyncio.run(_speak(server.server.port, "bob")) != spoken
    assert metric_value(server.metrics(), "qwen3tts_announcement_cache_total", result="hit") == hits

    # A clip that is not audio: logged with the reason, not offered; the server serves on.
    (folder / "broken.txt").write_text("Nothing to hear.")
    (folder / "broken.wav").write_bytes(b"not a wave file at all" * 100)
    wait_until(lambda: "'broken'" in server.server.log_text(), "the broken clip logged")
    assert all("broken" not in names for names in offered(server))
    (folder / ".hidden.wav").write_bytes(clip.read_bytes())

    for name in ("bob.wav", "bob.txt", "anna.wav", "anna.txt", "broken.wav", "broken.txt"):
        (folder / name).unlink()
    wait_until(lambda: all(not {"anna", "bob"} & names for names in offered(server)), "anna and bob withdrawn")
    assert all(".hidden" not in names for names in offered(server))
    server.server.check_alive()
