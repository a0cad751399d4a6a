"""The OpenAI API's `speed` and `instructions` (issue 37 item 5): speed changes tempo and keeps pitch, and every
response_format streams at every speed (the first bytes leave before the whole text is synthesized, through the
official openai client); instructions become the style where the voice takes one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from audio_codecs import decode, encode
from fake_engine import FakeEngine
from http_server import HttpServer, start_http
from in_process_http import serve

from wyoming_qwen3tts.http.audio_formats import FORMATS
from wyoming_qwen3tts.request import SAMPLE_RATE, SAMPLES_PER_FRAME
from wyoming_qwen3tts.voices import VoicePreset

pytestmark = pytest.mark.timeout(120)


def pitch(samples: np.ndarray) -> float:
    """The strongest frequency (Hz) of a signal, from its spectrum."""
    window = samples * np.hanning(len(samples))
    spectrum = np.abs(np.fft.rfft(window, n=8 * len(samples)))
    return float(np.fft.rfftfreq(8 * len(samples), 1 / SAMPLE_RATE)[np.argmax(spectrum)])


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_speed_keeps_the_pitch_and_streams(speed: float) -> None:
    t = np.arange(60 * SAMPLES_PER_FRAME) / SAMPLE_RATE
    samples = (8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2")  # 220 Hz for 4.8 s
    parts = encode("pcm", samples, [2] * 30, speed=speed)
    assert all(parts[3:-1]), "the stretched audio leaves chunk by chunk, not at the end"
    out, _, _ = decode("pcm", b"".join(parts))
    assert abs(len(out) - len(samples) / speed) < 0.03 * len(samples) / speed  # tempo changed
    middle = out[len(out) // 4 : 3 * len(out) // 4]
    assert abs(pitch(middle) - 220) < 3  # pitch kept (a resampler would give 220 x speed)


# -- through the server and the openai client ----------------------------------------------------------


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """The fake engine at 40 ms per word: three sentences take about a second to synthesize."""
    http = start_http(tmp_path_factory.mktemp("speed"), [], fake=True, frame_delay=0.04, name="speed")
    yield http
    assert http.server.stop() == 0


TEXT = " ".join(["One two three four five six seven eight."] * 3)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_streams_at_any_speed(slow: HttpServer, fmt: str) -> None:
    client = slow.client()
    for speed in (1.0, 0.5, 2.0):
        sent = time.monotonic()
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="ryan", input=TEXT, response_format=fmt, speed=speed
        ) as response:
            chunks = response.iter_bytes()
            first = next(chunks)
            first_at = time.monotonic() - sent
            body = first + b"".join(chunks)
            total = time.monotonic() - sent
        assert first_at < total / 2, f"{fmt} at {speed}: first bytes after {first_at:.2f} s of {total:.2f} s"
        samples, rate, _ = decode(fmt, body)
        expected = 24 * SAMPLES_PER_FRAME / speed  # one frame per word
        assert rate == SAMPLE_RATE and abs(len(samples) - expected) < 0.05 * expected + 3 * 1152, (fmt, speed)


# -- instructions --------------------------------------------------------------------------------------


class KindsEngine(FakeEngine):
    """The fake engine as CustomVoice + VoiceDesign + Base models with one cloned voice."""

    model_types: ClassVar[set[str]] = {"custom_voice", "voice_design", "base"}

    def __init__(self) -> None:
        super().__init__()
        self.clone_prompts = {"anna": object()}


async def test_instructions_become_the_style_where_the_voice_takes_one(tmp_path: Path) -> None:
    presets = [
        VoicePreset(name="narrator", design="A calm, deep narrator."),
        VoicePreset(name="anna", reference_audio=tmp_path / "anna.wav", x_vector_only=True),
    ]
    engine = KindsEngine()
    async with serve(engine, presets=presets) as api:
        for voice, expected in (("ryan", "Whisper."), ("narrator", "A calm, deep narrator. Whisper.")):
            response = await api.speak(input="Hello.", voice=voice, instructions="Whisper.", response_format="pcm")
            assert response.status == 200, await response.text()
            await response.read()
            assert engine.requests[-1].instruct == expected
        response = await api.speak(input="Hello.", voice="anna", instructions="Whisper.", response_format="pcm")
        error = (await response.json())["error"]
        assert response.status == 400 and error["param"] == "instructions" and "'anna'" in error["message"], error
