"""Reference clips for voice cloning: read any format libsndfile knows (WAV, FLAC, OGG, MP3, ...), mix to mono,
resample to the codec's 24 kHz, and refuse what cannot make a voice (not audio, too short, too long, silent) with a
message that says what to do.

The resampler is soxr at its high-quality setting, the one the reference gets through librosa, with the output length
fixed to ceil(n * ratio) as librosa does, so a clip at another rate gives the reference's samples.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile
import soxr

from ..errors import ReferenceAudioError

SAMPLE_RATE = 24000
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
# A clip whose loudest sample stays under -60 dBFS holds no usable voice (a muted microphone, digital silence).
SILENCE_PEAK = 10 ** (-60 / 20)


@dataclass(frozen=True)
class ReferenceAudio:
    """A checked reference clip: mono float32 samples at 24 kHz."""

    samples: np.ndarray = field(repr=False)
    source: str  # where it came from, for messages

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    @property
    def sha256(self) -> str:
        """Hash of the samples the encoders see: the same sound gives the same key whatever file it came in."""
        return hashlib.sha256(np.ascontiguousarray(self.samples, dtype="<f4").tobytes()).hexdigest()


def resample(samples: np.ndarray, rate: int, to_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of mono float32 samples (soxr HQ); the output has ceil(n * to_rate / rate) samples."""
    samples = np.asarray(samples, dtype=np.float32)
    if rate == to_rate:
        return samples
    out = soxr.resample(samples, rate, to_rate, quality="HQ")
    n = int(np.ceil(len(samples) * (float(to_rate) / rate)))
    if len(out) < n:
        out = np.pad(out, (0, n - len(out)))
    return np.asarray(out[:n], dtype=np.float32)


def read_reference_audio(
    source: str | Path | bytes | BinaryIO, *, min_seconds: float = MIN_SECONDS, max_seconds: float = MAX_SECONDS
) -> ReferenceAudio:
    """Read and check a reference clip from a file path, the bytes of a file, or a binary file object.

    The length is checked from the file's header before its samples are read, so a long file is refused cheaply.
    Raises ReferenceAudioError.
    """
    name = str(source) if isinstance(source, (str, Path)) else "<audio data>"
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        raise ReferenceAudioError(f"reference audio {name}: no such file")
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with soundfile.SoundFile(handle) as f:
            rate, frames = f.samplerate, f.frames
            if rate > 0 and frames > 0:
                _check_length(name, frames / rate, min_seconds, max_seconds)
            data = f.read(dtype="float32", always_2d=True)
    except ReferenceAudioError:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as err:
        raise ReferenceAudioError(
            f"reference audio {name} is not an audio file this server can read (WAV, FLAC, OGG or MP3): {err}"
        ) from None
    return reference_audio_from_array(
        data.mean(axis=1), rate, source=name, min_seconds=min_seconds, max_seconds=max_seconds
    )


def reference_audio_from_array(
    samples: np.ndarray,
    sample_rate: int,
    *,
    source: str = "<samples>",
    min_seconds: float = MIN_SECONDS,
    max_seconds: float = MAX_SECONDS,
) -> ReferenceAudio:
    """Check samples ([n], or [n, channels] which are averaged) at sample_rate and bring them to 24 kHz mono.
    Raises ReferenceAudioError."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim == 2:
        x = x.mean(axis=1, dtype=np.float32)
    if x.ndim != 1:
        raise ReferenceAudioError(f"reference audio {source}: expected mono or [samples, channels], got {x.shape}")
    if sample_rate <= 0:
        raise ReferenceAudioError(f"reference audio {source}: invalid sample rate {sample_rate}")
    _check_length(source, len(x) / sample_rate, min_seconds, max_seconds)
    if not np.isfinite(x).all():
        raise ReferenceAudioError(f"reference audio {source} holds NaN or infinite samples")
    peak = float(np.abs(x).max())
    if peak < SILENCE_PEAK:
        level = f"{20 * math.log10(peak):.0f} dBFS" if peak > 0 else "digital silence"
        raise ReferenceAudioError(
            f"reference audio {source} is silent (its loudest sample is {level}); record the voice again, closer "
            "to the microphone"
        )
    return ReferenceAudio(samples=resample(x, sample_rate), source=source)


def _check_length(source: str, seconds: float, min_seconds: float, max_seconds: float) -> None:
    if seconds < min_seconds:
        raise ReferenceAudioError(
            f"reference audio {source} is {seconds:.2f} s long; it must be at least {min_seconds:g} s "
            "(5-15 s of clear speech clone best)"
        )
    if seconds > max_seconds:
        raise ReferenceAudioError(
            f"reference audio {source} is {seconds:.1f} s long; the limit is {max_seconds:g} s "
            "(5-15 s of clear speech clone best): trim it"
        )
