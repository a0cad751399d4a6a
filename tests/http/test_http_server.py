"""The HTTP API of the real server process, driven by the official `openai` client: the tiny random
checkpoint on the CPU for speech in every format (streamed and whole, SSE, speed, instructions)
and next to Wyoming clients; the fake engine (tests/support/reliability_plugin.py) for the API key and
SIGTERM, where the model does not matter."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from audio_codecs import decode
from http_server import HttpServer, start_http
from prometheus_text import metric_value
from reliability_support import synthesize
from tiny_server import start_tiny

from wyoming_qwen3tts.http.app import _loopback_only
from wyoming_qwen3tts.request import SAMPLE_RATE, SAMPLES_PER_FRAME

pytestmark = pytest.mark.timeout(300)

TEXT = "Hello there, how are you?"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Iterator[HttpServer]:
    args = ["--max-frames", "6", "--first-chunk-frames", "1", "--chunk-frames", "2", "--greedy", "--seed", "1"]
    limits = ["--max-text-chars", "300", "--max-event-bytes", "65536"]
    http = start_tiny(tmp_path_factory.mktemp("http-real"), tiny_checkpoint, *args, *limits, name="real", http=True)
    yield http
    assert http.server.stop() == 0
    log = http.server.log_text()
    assert "Traceback" not in log and "without an API key" not in log  # 127.0.0.1: no warning


@pytest.fixture(scope="module")
def reference(real: HttpServer) -> np.ndarray:
    """The s16 samples of TEXT as pcm (greedy decoding with a fixed seed: the same every time)."""
    pcm = real.client().audio.speech.create(model="tts-1", voice="ryan", input=TEXT, response_format="pcm").content
    assert len(pcm) % (SAMPLES_PER_FRAME * 2) == 0 and 1 <= len(pcm) // (SAMPLES_PER_FRAME * 2) <= 6
    return np.frombuffer(pcm, "<i2")


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus", "aac"])
def test_every_format_whole_and_streamed(real: HttpServer, reference: np.ndarray, fmt: str) -> None:
    client = real.client()
    whole = client.audio.speech.create(model="tts-1", voice="ryan", input=TEXT, response_format=fmt)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="ryan", input=TEXT, response_format=fmt
    ) as response:
        chunks = response.iter_bytes()
        first = next(chunks)
        # The first bytes are here while the request is still being answered.
        assert metric_value(real.metrics(), "qwen3tts_active_streams", protocol="http") == 1
        streamed = first + b"".join(chunks)
    assert streamed == whole.content  # greedy + seed + bit-exact muxing: the same bytes both ways
    samples, rate, channels = decode(fmt, whole.content)
    assert (rate, channels) == (SAMPLE_RATE, 1)
    if fmt in ("pcm", "wav", "flac"):
        assert len(samples) % SAMPLES_PER_FRAME == 0
        assert np.array_equal(np.round(samples * 32768).astype(np.int16), reference)
    else:  # lossy: the same length but for the codec's priming and padding
        assert 0 <= len(samples) - len(reference) <= 3 * 1152


def test_sse(real: HttpServer, reference: np.ndarray) -> None:
    with real.client().audio.speech.with_streaming_response.create(
        model="tts-1", voice="ryan", input=TEXT, response_format="pcm", stream_format="sse"
    ) as response:
        assert response.headers["content-type"] == "text/event-stream"
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert np.array_equal(np.frombuffer(pcm, "<i2"), reference)
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == len(reference) // SAMPLES_PER_FRAME


def test_speed_and_instructions(real: HttpServer, reference: np.ndarray) -> None:
    client = real.client()
    fast = client.audio.speech.create(model="tts-1", voice="ryan", input=TEXT, response_format="wav", speed=2.0)
    samples, _, _ = decode("wav", fast.content)
    assert abs(len(samples) - len(reference) / 2) <= 0.1 * len(reference)
    styled = client.audio.speech.create(
        model="tts-1", voice="ryan", input=TEXT, response_format="pcm", instructions="Whisper, very slowly."
    )
    assert (
        len(styled.content) % (SAMPLES_PER_FRAME * 2) == 0 and styled.content != reference.tobytes()
    )  # the prompt changed
    preset = client.audio.speech.create(model="tts-1", voice="ryan-calm", input=TEXT, response_format="pcm")
    assert len(preset.content) % (SAMPLES_PER_FRAME * 2) == 0


def test_models_and_voices(real: HttpServer) -> None:
    assert [m.id for m in real.client().models.list()] == ["tiny"]
    voices = json.loads(real.get("/v1/audio/voices")[1])
    names = [v["id"] for v in voices["data"]]
    assert "ryan" in names and names[-1] == "ryan-calm" and voices["supports_instructions"] is True


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"voice": "nobody"}, 400, "unknown-voice"),
        ({"input": ""}, 400, "empty-text"),
        ({"input": "word " * 70}, 400, "text-too-long"),
        ({"response_format": "ogg"}, 400, "unsupported-format"),
        ({"speed": 5.0}, 400, "invalid-request"),
        ({"input": "x" * 70_000}, 413, "body-too-large"),
    ],
)
def test_bad_requests(real: HttpServer, kwargs: dict[str, object], status: int, code: str) -> None:
    request = {"model": "tts-1", "voice": "ryan", "input": TEXT, **kwargs}
    with pytest.raises(openai.APIStatusError) as caught:
        real.client().audio.speech.create(**request)  # type: ignore[arg-type]
    assert caught.value.status_code == status and caught.value.code == code, caught.value.body
    real.server.check_alive()


async def test_wyoming_and_http_at_once(real: HttpServer, reference: np.ndarray) -> None:
    client = openai.AsyncOpenAI(base_url=f"{real.url}/v1", api_key="unused", max_retries=0, timeout=120)

    async def http() -> bytes:
        response = await client.audio.speech.create(model="tts-1", voice="ryan", input=TEXT, response_format="pcm")
        return response.content

    async def wyoming() -> int:
        return await synthesize(real.server.port, TEXT, {"name": "ryan"})

    answers = await asyncio.gather(http(), wyoming(), http(), wyoming())
    assert answers[0] == answers[2] == reference.tobytes()
    assert answers[1] == answers[3] == len(reference) // SAMPLES_PER_FRAME


async def test_wyoming_requests_are_counted(real: HttpServer) -> None:
    before = real.metrics()
    frames = await synthesize(real.server.port, TEXT, {"name": "ryan"})
    after = real.metrics()
    ok = {"protocol": "wyoming", "outcome": "ok"}
    assert (
        metric_value(after, "qwen3tts_speech_requests_total", **ok)
        == metric_value(before, "qwen3tts_speech_requests_total", **ok) + 1
    )
    count = "qwen3tts_time_to_first_audio_seconds_count"
    assert metric_value(after, count, protocol="wyoming") == metric_value(before, count, protocol="wyoming") + 1
    frames_total = "qwen3tts_audio_frames_total"
    assert (
        metric_value(after, frames_total, protocol="wyoming") - metric_value(before, frames_total, protocol="wyoming")
        == frames
    )


# -- the fake engine: API key, SIGTERM ----------------------------------------------------------------


def test_api_key(tmp_path: Path) -> None:
    http = start_http(tmp_path, [], fake=True, key="k3y-for-tests")
    try:
        audio = http.client().audio.speech.create(
            model="tts-1", voice="ryan", input="One two three.", response_format="pcm"
        )
        assert len(audio.content) == 3 * SAMPLES_PER_FRAME * 2
        for wrong in ("wrong", "k3y-for-test"):
            with pytest.raises(openai.AuthenticationError) as caught:
                http.client(key=wrong).audio.speech.create(model="tts-1", voice="ryan", input="Hi.")
            assert caught.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            http.client(key="wrong").models.list()
        assert http.get("/healthz")[0] == 200  # no key needed
        assert http.get("/")[0] == 200
        assert http.get("/metrics")[0] == 401
        assert "qwen3tts_speech_requests_total" in http.metrics()
    finally:
        assert http.server.stop() == 0


def test_sigterm_drains_http_streams(tmp_path: Path) -> None:
    """SIGTERM during an HTTP stream: the listener closes, the stream is answered whole, exit 0."""
    http = start_http(tmp_path, ["--drain-seconds", "20"], fake=True, frame_delay=0.02)
    try:
        words = 60
        text = " ".join(["word"] * words) + "."
        with http.client().audio.speech.with_streaming_response.create(
            model="tts-1", voice="ryan", input=text, response_format="pcm"
        ) as response:
            chunks = response.iter_bytes()
            received = next(chunks)
            http.server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with pytest.raises(OSError):  # not accepting any more
                socket.create_connection(("127.0.0.1", int(http.url.rsplit(":", 1)[1])), timeout=2).close()
            received += b"".join(chunks)
        assert len(received) == words * SAMPLES_PER_FRAME * 2
        assert http.server.proc.wait(30) == 0
        log = http.server.log_text()
        assert "Stopping (SIGTERM)" in log and "Traceback" not in log
    finally:
        http.server.stop()


def test_loopback_only() -> None:
    assert (
        _loopback_only("tcp://127.0.0.1:8000")
        and _loopback_only("tcp://[::1]:8000")
        and _loopback_only("tcp://localhost:80")
    )
    assert _loopback_only("unix:///run/qwen3tts.sock")
    assert not _loopback_only("tcp://0.0.0.0:8000") and not _loopback_only("tcp://[::]:8000")
    assert not _loopback_only("tcp://192.168.1.5:8000") and not _loopback_only("tcp://tts.example:8000")


@pytest.mark.gpu
def test_gpu_memory_in_metrics(tmp_path: Path, tiny_checkpoint: Path) -> None:
    """On a GPU, /metrics reports torch's allocator per device once the engine has run."""
    args = ["--model", str(tiny_checkpoint), "--device", "cuda", "--max-frames", "6", "--greedy", "--seed", "1"]
    http = start_http(tmp_path, args, fake=False, name="gpu")
    try:
        audio = http.client().audio.speech.create(model="tts-1", voice="ryan", input=TEXT, response_format="pcm")
        assert len(audio.content) % (SAMPLES_PER_FRAME * 2) == 0
        text = http.metrics()
        memory = {
            kind: metric_value(text, "qwen3tts_gpu_memory_bytes", device="cuda:0", kind=kind)
            for kind in ("allocated", "reserved", "total")
        }
        assert 0 < memory["allocated"] <= memory["reserved"] < memory["total"], memory
        assert metric_value(text, "qwen3tts_frames_per_second_count", protocol="http") == 1
    finally:
        assert http.server.stop() == 0
