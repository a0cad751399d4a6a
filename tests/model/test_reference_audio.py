"""Reading reference clips for voice cloning (model.reference_audio): formats, mono mixdown, resampling to 24 kHz
as the reference does it, and a clear ReferenceAudioError for every clip that cannot make a voice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from wyoming_qwen3tts.errors import ReferenceAudioError, VoiceError
from wyoming_qwen3tts.model import reference_audio as ra


def chirp(seconds: float, rate: int, *, channels: int = 1, seed: int = 0) -> np.ndarray:
    """A rising tone with a little noise: [n] or [n, channels] float32 within [-0.5, 0.5]."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    mono = 0.3 * np.sin(2 * np.pi * (150 + 250 * t) * t) + 0.03 * rng.standard_normal(t.size)
    if channels == 1:
        return mono.astype(np.float32)
    # Channels that differ, so a wrong mixdown (one channel, or a sum) is visible.
    return np.stack([mono * (0.5 + 0.5 * c) for c in range(channels)], axis=1).astype(np.float32)


@pytest.mark.parametrize(
    ("fmt", "subtype", "ext"),
    [
        ("WAV", "FLOAT", "wav"),
        ("WAV", "PCM_16", "wav"),
        ("FLAC", "PCM_24", "flac"),
        ("OGG", "VORBIS", "ogg"),
        ("MP3", "MPEG_LAYER_III", "mp3"),
    ],
)
def test_every_common_format_reads_as_24khz_mono(tmp_path: Path, fmt: str, subtype: str, ext: str) -> None:
    path = tmp_path / f"clip.{ext}"
    soundfile.write(path, chirp(2.0, 24000, channels=2), 24000, format=fmt, subtype=subtype)
    audio = ra.read_reference_audio(path)
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert abs(audio.seconds - 2.0) < 0.06  # lossy codecs may pad a frame
    assert audio.source == str(path)
    if ext in ("wav", "flac"):  # lossless: exactly the mean of the channels as stored
        stored, _ = soundfile.read(path, dtype="float32", always_2d=True)
        assert np.array_equal(audio.samples, stored.mean(axis=1))


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 44100, 48000])
def test_resampling_equals_librosa_soxr_hq(rate: int) -> None:
    """The reference resamples with librosa.resample (soxr_hq, length fixed to ceil(n * ratio)); ours must give
    the same samples, or the x-vector and codes of a clip at another rate would differ from the reference's."""
    librosa = pytest.importorskip("librosa")
    x = chirp(1.7, rate)
    ours = ra.resample(x, rate)
    theirs = librosa.resample(x, orig_sr=rate, target_sr=24000)
    # ceil(n * ratio) with the ratio in floating point, as librosa has it (one more sample than exact n * 24000 / rate
    # where the product rounds up past a whole number)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == (int(np.ceil(len(x) * (24000 / rate))),)
    assert np.array_equal(ours, theirs)


def test_bytes_and_file_objects_read_like_paths(tmp_path: Path) -> None:
    path = tmp_path / "clip.flac"
    soundfile.write(path, chirp(1.5, 16000), 16000)
    from_path = ra.read_reference_audio(path)
    from_bytes = ra.read_reference_audio(path.read_bytes())
    with open(path, "rb") as f:
        from_file = ra.read_reference_audio(f)
    assert np.array_equal(from_path.samples, from_bytes.samples) and np.array_equal(
        from_path.samples, from_file.samples
    )
    assert from_path.sha256 == from_bytes.sha256 and len(from_path.samples) == 36000
    assert from_bytes.source == "<audio data>"


def test_the_hash_follows_the_sound_not_the_container(tmp_path: Path) -> None:
    x = chirp(1.5, 24000)
    soundfile.write(tmp_path / "a.wav", x, 24000, subtype="FLOAT")
    soundfile.write(tmp_path / "b.flac", x, 24000, subtype="PCM_24")
    a, b = ra.read_reference_audio(tmp_path / "a.wav"), ra.read_reference_audio(tmp_path / "b.flac")
    assert a.sha256 == ra.reference_audio_from_array(x, 24000).sha256
    assert a.sha256 != b.sha256  # 24-bit rounding changed the samples, so it is another clip
    assert a.sha256 != ra.reference_audio_from_array(chirp(1.5, 24000, seed=1), 24000).sha256


@pytest.mark.parametrize("seconds", [0.0, 0.4, 0.99])
def test_too_short_is_refused(tmp_path: Path, seconds: float) -> None:
    path = tmp_path / "short.wav"
    soundfile.write(path, chirp(seconds, 24000), 24000)
    with pytest.raises(ReferenceAudioError, match=r"s long; it must be at least 1 s"):
        ra.read_reference_audio(path)


def test_too_long_is_refused_from_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "long.flac"
    soundfile.write(path, chirp(31.0, 8000), 8000)
    with pytest.raises(ReferenceAudioError, match=r"31\.0 s long; the limit is 30 s"):
        ra.read_reference_audio(path)

    # The limit is a setting, and the length is known before any sample is decoded.
    def no_read(*_a: object, **_k: object) -> None:
        raise AssertionError("samples were read although the header already says the clip is too long")

    monkeypatch.setattr(soundfile.SoundFile, "read", no_read)
    with pytest.raises(ReferenceAudioError, match="the limit is 10 s"):
        ra.read_reference_audio(path, max_seconds=10)
    monkeypatch.undo()
    assert ra.read_reference_audio(path, max_seconds=40).seconds == pytest.approx(31.0)


@pytest.mark.parametrize(("peak", "words"), [(0.0, "digital silence"), (3e-4, "-70 dBFS")])
def test_silence_is_refused(tmp_path: Path, peak: float, words: str) -> None:
    path = tmp_path / "silent.wav"
    x = np.full(48000, peak, dtype=np.float32)
    soundfile.write(path, x, 24000, subtype="FLOAT")
    with pytest.raises(ReferenceAudioError, match=f"is silent.*{words}"):
        ra.read_reference_audio(path)
    quiet_but_there = ra.reference_audio_from_array(chirp(2.0, 24000) * 0.01, 24000)  # about -50 dBFS peaks
    assert quiet_but_there.seconds == 2.0


@pytest.mark.parametrize("content", [b"", b"hello, I am a text file\n" * 50, bytes(range(256)) * 64])
def test_not_audio_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "voice.wav"
    path.write_bytes(content)
    with pytest.raises(ReferenceAudioError, match="not an audio file this server can read"):
        ra.read_reference_audio(path)
    with pytest.raises(ReferenceAudioError, match="not an audio file"):
        ra.read_reference_audio(content)


def test_missing_file_and_bad_arrays_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ReferenceAudioError, match="no such file"):
        ra.read_reference_audio(tmp_path / "nobody.wav")
    x = chirp(2.0, 24000)
    x[100] = np.nan
    with pytest.raises(ReferenceAudioError, match="NaN or infinite"):
        ra.reference_audio_from_array(x, 24000)
    with pytest.raises(ReferenceAudioError, match="sample rate"):
        ra.reference_audio_from_array(chirp(2.0, 24000), 0)
    with pytest.raises(ReferenceAudioError, match="mono or"):
        ra.reference_audio_from_array(np.zeros((2, 2, 24000), dtype=np.float32), 24000)
    assert issubclass(ReferenceAudioError, VoiceError)  # one except clause catches every voice problem


def test_stereo_arrays_are_mixed_to_mono() -> None:
    x = chirp(1.2, 24000, channels=2)
    audio = ra.reference_audio_from_array(x, 24000)
    assert np.array_equal(audio.samples, x.mean(axis=1))
