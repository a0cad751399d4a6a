"""The speech API's audio formats in tests: encoding frame groups with the server's encoder, and decoding a response
back to samples (with libsndfile where it reads the format, so the encoder is not checked only against itself)."""

from __future__ import annotations

import io

import av
import numpy as np
import soundfile

from wyoming_qwen3tts.http.audio_formats import FORMATS, AudioEncoder
from wyoming_qwen3tts.request import SAMPLE_RATE, SAMPLES_PER_FRAME


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
