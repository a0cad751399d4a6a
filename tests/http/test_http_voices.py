"""Cloned voices added and removed over HTTP (the voices page's API): the real server process with a
tiny random Base checkpoint on the CPU, driven with aiohttp's client; then the page itself in headless Chromium."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest
import soundfile
from http_server import HttpServer, start_http
from tiny_server import start_tiny
from voice_clip import write_clip

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def base_http(
    tmp_path_factory: pytest.TempPathFactory, tiny_base_checkpoint: Path
) -> Iterator[tuple[HttpServer, Path]]:
    tmp = tmp_path_factory.mktemp("http-voices")
    data = tmp / "data"
    args = ["--max-frames", "6", "--first-chunk-frames", "1", "--chunk-frames", "2", "--seed", "1"]
    http = start_tiny(tmp, tiny_base_checkpoint, *args, "--data-dir", str(data), name="base", http=True)
    yield http, data / "voices"
    assert http.server.stop() == 0
    assert "Traceback" not in http.server.log_text()


def _clip_bytes(tmp: Path, seconds: float = 2.0) -> bytes:
    return write_clip(tmp / f"clip-{seconds}.wav", seconds=seconds).read_bytes()


async def _post(url: str, fields: dict[str, str], audio: bytes | None) -> tuple[int, dict]:  # type: ignore[type-arg]
    form = aiohttp.FormData(default_to_multipart=True)
    for key, value in fields.items():
        form.add_field(key, value)
    if audio is not None:
        form.add_field("audio", audio, filename="../../escape.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/audio/voices", data=form) as response:
        return response.status, await response.json()


async def _delete(url: str, name: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as session, session.delete(f"{url}/v1/audio/voices/{name}") as response:
        return response.status, await response.json()


def _listing(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"{url}/v1/audio/voices", timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
async def test_add_speak_and_remove_a_voice(base_http: tuple[HttpServer, Path], tmp_path: Path) -> None:
    http, folder = base_http
    listing = _listing(http.url)
    assert listing["can_add_voices"] is True and listing["data"] == []
    status, body = await _post(http.url, {"name": "anna", "text": "Hello there, this is Anna."}, _clip_bytes(tmp_path))
    assert status == 201 and body["name"] == "anna" and body["seconds"] == 2.0, body
    (anna,) = _listing(http.url)["data"]
    assert anna["id"] == "anna" and anna["kind"] == "cloned" and anna["removable"] is True
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == ["anna.txt", "anna.wav"]
    assert not (folder.parent / "escape.wav").exists() and not (folder.parent.parent / "escape.wav").exists()
    assert len(list((folder / ".prompts").glob("*.safetensors"))) == 1
    pcm = (
        http.client()
        .audio.speech.create(model="tts-1", voice="anna", input="Good morning.", response_format="pcm")
        .content
    )
    assert 0 < len(pcm) and len(pcm) % (1920 * 2) == 0

    status, body = await _delete(http.url, "anna")
    assert status == 200 and body["deleted"] is True
    assert _listing(http.url)["data"] == [] and not any(folder.glob("anna.*"))
    with pytest.raises(openai.BadRequestError):
        http.client().audio.speech.create(model="tts-1", voice="anna", input="Hi.")


@pytest.mark.slow
async def test_bad_uploads_are_refused_and_leave_nothing(base_http: tuple[HttpServer, Path], tmp_path: Path) -> None:
    http, folder = base_http
    good = _clip_bytes(tmp_path)
    silent = io.BytesIO()
    soundfile.write(silent, np.zeros(48000, dtype=np.float32), 24000, format="WAV")
    cases = [
        ({"name": "junk", "text": "x"}, b"not audio at all", 400, "not an audio file"),
        ({"name": "short", "text": "x"}, _clip_bytes(tmp_path, 0.4), 400, "at least 1 s"),
        ({"name": "quiet", "text": "x"}, silent.getvalue(), 400, "silent"),
        ({"name": "../evil", "text": "x"}, good, 400, "name"),
        ({"name": "bob"}, good, 400, "transcript"),
        ({"name": "bob", "text": "x"}, None, 400, "missing"),
        ({"name": "huge", "text": "x"}, b"\0" * (17 * 1024 * 1024), 413, "larger"),
    ]
    for fields, audio, want, message in cases:
        status, body = await _post(http.url, fields, audio)
        assert status == want and message in body["error"]["message"], (fields, status, body)
    assert not folder.exists() or not [p for p in folder.iterdir() if p.is_file()]
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{http.url}/v1/audio/voices", json={"name": "x"}) as response:
            assert response.status == 415
    for name in ("nobody", "..%2f..%2fetc", "ryan"):
        status, _ = await _delete(http.url, name)
        assert status == 404, name
    # The server kept serving: an x-vector voice still goes in, and out again.
    status, body = await _post(http.url, {"name": "bob", "x_vector_only": "true"}, good)
    assert status == 201, body
    status, body = await _post(http.url, {"name": "bob", "x_vector_only": "true"}, good)
    assert status == 409 and body["error"]["code"] == "voice-exists"
    assert (await _delete(http.url, "bob"))[0] == 200


def test_a_customvoice_server_cannot_add_voices(tmp_path: Path) -> None:
    http = start_http(tmp_path, ["--data-dir", str(tmp_path / "data")], fake=True)
    try:
        assert _listing(http.url)["can_add_voices"] is False
        form = b'--B\r\nContent-Disposition: form-data; name="name"\r\n\r\nanna\r\n--B--\r\n'
        request = urllib.request.Request(
            f"{http.url}/v1/audio/voices",
            data=form,
            method="POST",
            headers={"Content-Type": "multipart/form-data; boundary=B"},
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 409 and b"Base model" in caught.value.read()
    finally:
        assert http.server.stop() == 0
