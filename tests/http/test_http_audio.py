"""The speech API's encoders (wyoming_qwen3tts/http/audio_formats.py): every format decodes back to
24 kHz mono, the lossless ones to the very samples put in, bytes leave as chunks go in, and speed
stretches time.  Decoding uses libsndfile (soundfile) where it reads the format, so the encoder
(FFmpeg, through PyAV) is not checked only against itself."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile

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


def encode(name: str, samples: np.ndarray, groups: list[int], speed: float = 1.0) -> list[bytes]:
    """Encode frame groups of `groups` frames each, then finish: the bytes of each step."""
    encoder = AudioEncoder(FORMATS[name], speed)
    out, start = [], 0
    for frames in groups:
        end = start + frames * SAMPLES_PER_FRAME
        out.append(encoder.encode(samples[start:end].tobytes()))
        start = end
    out.append(encoder.finish())
    return out


def decode(name: str, data: bytes) -> tuple[np.ndarray, int, int]:
    """Samples (float, -1..1), sample rate and channels of an encoded response."""
    if name == "pcm":
        return np.frombuffer(data, "<i2") / 32768, SAMPLE_RATE, 1
    if name in ("aac", "flac"):
        # libsndfile has no AAC, and fails at the end of a FLAC stream whose header says "length
        # unknown" (as a streamed one must): FFmpeg's decoders, independent of its encoders.
        with av.open(io.BytesIO(data)) as container:
            frames = [f.to_ndarray() for f in container.decode(audio=0)]
            stream = container.streams.audio[0]
            samples = np.concatenate(frames, axis=1)[0]
            if samples.dtype.kind == "i":  # FLAC decodes to s16, AAC to float
                samples = samples / 32768
            return samples, stream.codec_context.sample_rate, stream.codec_context.channels
    with soundfile.SoundFile(io.BytesIO(data)) as sound:
        rate, channels = sound.samplerate, sound.channels
        # In blocks: a streamed WAV's header says 0xFFFFFFFF bytes.
        blocks = [block for block in sound.blocks(4096, dtype="float64", always_2d=True)]
    return np.concatenate(blocks)[:, 0], rate, channels


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
