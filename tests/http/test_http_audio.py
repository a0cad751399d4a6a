"""The speech API's encoders (wyoming_qwen3tts/http/audio_formats.py): every format decodes back to
24 kHz mono, the lossless ones to the very samples put in, bytes leave as chunks go in, and speed
stretches time.  Decoding uses libsndfile (soundfile) where it reads the format, so the encoder
(FFmpeg, through PyAV) is not checked only against itself."""

from __future__ import annotations

import numpy as np
import pytest
from audio_codecs import decode, encode

from wyoming_qwen3tts.http.audio_formats import FORMATS, AudioEncoder
from wyoming_qwen3tts.request import SAMPLE_RATE, SAMPLES_PER_FRAME

FRAMES = 10


def speech_like(frames: int = FRAMES, seed: int = 0) -> np.ndarray:
    """A voiced-sounding test signal: a few harmonics under a slow envelope, plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * SAMPLES_PER_FRAME) / SAMPLE_RATE
    tone = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 6))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)
    signal = 6000 * tone * envelope + rng.normal(0, 200, t.shape)
    return signal.astype("<i2")


def test_offered_formats() -> None:
    # PyAV's wheels carry all of these; a build without one would drop it from the API.
    assert list(FORMATS) == ["mp3", "opus", "aac", "flac", "wav", "pcm"]


@pytest.mark.parametrize("name", ["pcm", "wav", "flac"])
def test_lossless_formats_give_back_the_samples(name: str) -> None:
    samples = speech_like()
    decoded, rate, channels = decode(name, b"".join(encode(name, samples, [1, 2, 4, 3])))
    assert (rate, channels) == (SAMPLE_RATE, 1)
    assert len(decoded) == FRAMES * SAMPLES_PER_FRAME  # whole frames, nothing padded or lost
    assert np.array_equal(np.round(decoded * 32768).astype(np.int16), samples)


@pytest.mark.parametrize("name", ["mp3", "opus", "aac"])
def test_lossy_formats_sound_like_the_input(name: str) -> None:
    samples = speech_like()
    decoded, rate, channels = decode(name, b"".join(encode(name, samples, [1, 2, 4, 3])))
    assert (rate, channels) == (SAMPLE_RATE, 1)
    # Codecs add priming and padding samples, at most a few codec frames (1152 for MP3).
    extra = len(decoded) - len(samples)
    assert 0 <= extra <= 3 * 1152, extra
    # Same sound: the best alignment correlates strongly (codec delay unknown up front).
    reference = samples / 32768
    best = max(
        np.corrcoef(decoded[lag : lag + len(reference)], reference)[0, 1]
        for lag in range(0, extra + 1)
        if lag + len(reference) <= len(decoded)
    )
    assert best > 0.95, best


@pytest.mark.parametrize("name", list(FORMATS))
def test_bytes_leave_with_the_first_chunk(name: str) -> None:
    """Streaming: the first two-frame group already gives bytes (headers and the first audio)."""
    parts = encode(name, speech_like(), [2, 2, 2, 2, 2])
    assert parts[0], f"{name}: nothing after the first frame group"
    assert sum(len(p) for p in parts[1:-1]) > 0


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_stretches_time(speed: float) -> None:
    samples = speech_like(frames=50)
    decoded, rate, _ = decode("wav", b"".join(encode("wav", samples, [5] * 10, speed=speed)))
    assert rate == SAMPLE_RATE
    assert abs(len(decoded) - len(samples) / speed) < 0.03 * len(samples) / speed


@pytest.mark.parametrize("speed", [0.2, 4.5])
def test_speed_out_of_range(speed: float) -> None:
    with pytest.raises(ValueError):
        AudioEncoder(FORMATS["wav"], speed)


def test_abandoned_encoder_closes() -> None:
    encoder = AudioEncoder(FORMATS["mp3"])
    encoder.encode(speech_like(frames=2).tobytes())
    encoder.close()
    encoder.close()  # twice is harmless
