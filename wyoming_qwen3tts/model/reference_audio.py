"""Reference clips for voice cloning: read any format libsndfile knows (WAV, FLAC, OGG, MP3, ...), mix to mono,
resample to the codec's 24 kHz, and refuse what cannot make a voice (not audio, too short, too long, silent) with a
message that says what to do.

What a clip may cost is bounded before its samples are decoded: the header's channels, sample rate and length are
checked first (at most MAX_CHANNELS, MAX_SAMPLE_RATE and MAX_SECONDS), and the samples are read in blocks of at most
_BLOCK_BYTES, each mixed down to mono at once into one array. Decoding a clip thus holds at most MAX_SAMPLE_RATE x
MAX_SECONDS mono float32 samples (23 MB) and one block (4 MB), whatever the file claims or holds (a compressed file can
expand far beyond its own size): 31 MB at the peak for the worst clip accepted, 8 channels at 192 kHz for 29 s.

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
MAX_CHANNELS = 8  # 7.1 surround; more is no recording of a voice
MAX_SAMPLE_RATE = 192_000  # studio recorders' highest rate
_BLOCK_BYTES = 4 << 20  # samples of all channels decoded at a time, before mixing down


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

    The clip's channels, rate and length are checked from the file's header before its samples are read, so a clip
    that would cost too much is refused cheaply (see the module's docstring). Raises ReferenceAudioError.
    """
    mono, rate, name = read_mono(source, min_seconds=min_seconds, max_seconds=max_seconds)
    return reference_audio_from_array(mono, rate, source=name, min_seconds=min_seconds, max_seconds=max_seconds)


def read_mono(
    source: str | Path | bytes | BinaryIO, *, min_seconds: float = MIN_SECONDS, max_seconds: float = MAX_SECONDS
) -> tuple[np.ndarray, int, str]:
    """A clip's samples mixed down to mono float32 at the file's own rate, its rate, and its name for messages.

    What read_reference_audio decodes before resampling: stored as a float WAV at that rate, a clip reads back to the
    very same samples. Raises ReferenceAudioError."""
    name = str(source) if isinstance(source, (str, Path)) else "<audio data>"
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        raise ReferenceAudioError(f"reference audio {name}: no such file")
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with soundfile.SoundFile(handle) as f:
            rate, frames, channels = f.samplerate, f.frames, f.channels
            if not 0 < channels <= MAX_CHANNELS:
                raise ReferenceAudioError(
                    f"reference audio {name} has {channels} channels; at most {MAX_CHANNELS} are read (mono is best)"
                )
            if not 0 < rate <= MAX_SAMPLE_RATE:
                raise ReferenceAudioError(
                    f"reference audio {name} has a sample rate of {rate} Hz; the limit is {MAX_SAMPLE_RATE} Hz "
                    "(24 kHz or 48 kHz is best)"
                )
            if frames > 0:
                _check_length(name, frames / rate, min_seconds, max_seconds)
            mono = _read_blocks(f, name, rate, channels, max_seconds)
    except ReferenceAudioError:
        raise
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as err:
        raise ReferenceAudioError(
            f"reference audio {name} is not an audio file this server can read (WAV, FLAC, OGG or MP3): {err}"
        ) from None
    return mono, rate, name


def _read_blocks(f: soundfile.SoundFile, name: str, rate: int, channels: int, max_seconds: float) -> np.ndarray:
    """The samples of an open file mixed down to mono block by block, into one array sized from the header; refused
    once past max_seconds (a header's frame count can be wrong or missing: MP3, a WAV whose length field lies)."""
    limit = math.ceil(max_seconds * rate)
    block = max(_BLOCK_BYTES // (4 * channels), 1024)
    out = np.empty(f.frames if 0 < f.frames <= limit else 0, dtype=np.float32)
    extra: list[np.ndarray] = []  # what comes past the header's count
    filled = total = 0
    while len(data := f.read(block, dtype="float32", always_2d=True)):
        total += len(data)
        if total > limit:
            _check_length(name, total / rate, 0.0, max_seconds)
        # Averaging a one-column block returns its samples exactly, so a mono file reads as it is stored.
        mono = data.mean(axis=1, dtype=np.float32) if channels > 1 else data[:, 0]
        fits = min(len(mono), len(out) - filled)
        out[filled : filled + fits] = mono[:fits]
        filled += fits
        if fits < len(mono):
            extra.append(mono[fits:].copy())
    return np.concatenate([out[:filled], *extra]) if extra else out[:filled]


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
    peak = max(float(x.max()), -float(x.min()))  # no |x| copy of a long clip
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
