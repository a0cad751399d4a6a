"""Writing and removing the voices of a voices folder: the one code path of the voices CLI and the web page.

A folder voice is NAME.wav (24 kHz mono 16-bit, as stored here) with NAME.txt (its transcript) and NAME.toml
(x_vector_only, language, description) beside it; scan_voice_folder (voices/__init__.py) reads them back.
Only files named after a checked voice name, directly inside the folder, are ever written or removed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np

from . import AUDIO_SUFFIXES, VoicePreset, check_voice_name

SAMPLE_RATE = 24000  # what ReferenceAudio holds (model/reference_audio.py), without importing torch here
_SIDE_FILES = (".txt", ".toml")


def _toml_line(key: str, value: object) -> str:
    if isinstance(value, bool):
        return f"{key} = {'true' if value else 'false'}\n"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    return f'{key} = "{escaped}"\n'


def voice_exists(folder: Path, name: str) -> bool:
    return any((folder / f"{name}{suffix}").exists() for suffix in AUDIO_SUFFIXES)


def store_voice(folder: Path, name: str, samples: np.ndarray, text: str | None, *, x_vector_only: bool = False,
                language: str | None = None, description: str | None = None) -> VoicePreset:  # fmt: skip
    """Write NAME.wav (24 kHz mono samples in [-1, 1]) and its side files; returns the voice as the folder scan
    will read it. Raises ValueError for a name that is not a voice name; no other file is touched."""
    import soundfile

    preset = VoicePreset(name=name, reference_audio=folder / f"{name}.wav", reference_text=(text or "").strip() or None,
                         x_vector_only=x_vector_only, language=language or None, description=description or None)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    assert preset.reference_audio is not None
    soundfile.write(str(preset.reference_audio), np.asarray(samples, dtype=np.float32), SAMPLE_RATE, subtype="PCM_16")
    if preset.reference_text:
        (folder / f"{name}.txt").write_text(preset.reference_text + "\n", encoding="utf-8")
    settings = "".join(
        _toml_line(key, value)
        for key, value in (("x_vector_only", x_vector_only or None), ("language", preset.language),
                           ("description", preset.description))  # fmt: skip
        if value
    )
    if settings:
        tomllib.loads(settings)  # what the scan will read
        (folder / f"{name}.toml").write_text(settings, encoding="utf-8")
    return preset


def remove_voice(folder: Path, name: str) -> list[Path]:
    """Delete NAME's clip and side files (regular files inside the folder only); returns what was removed."""
    check_voice_name(name)  # no paths
    removed = []
    for suffix in (*AUDIO_SUFFIXES, *_SIDE_FILES):
        path = folder / f"{name}{suffix}"
        if path.is_file() and not path.is_symlink() and path.resolve().parent == folder.resolve():
            path.unlink()
            removed.append(path)
    return removed
