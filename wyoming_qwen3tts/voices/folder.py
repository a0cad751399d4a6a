"""Writing and removing the voices of a voices folder: the one code path of the voices CLI and the web page.

A folder voice is NAME.wav with NAME.txt (its transcript) and NAME.toml (x_vector_only, language, description)
beside it; scan_voice_folder (voices/__init__.py) reads them back. The clip is stored as a float WAV of the
original's samples mixed down to mono, at the original's rate: it reads back to exactly the samples the original
gives (model/reference_audio.read_mono), so cloning from the folder equals cloning from the original file.

Changes survive a crash at any point as all or nothing:
- every file is written under a temporary name (.NAME.SUFFIX.partial) and renamed into place once complete;
- an add first writes the marker .NAME.adding, writes the side files, then the clip, and drops the marker only once
  the voice is in service (commit_voice); a remove writes .NAME.removing, deletes the clip (the voice is then gone),
  then the side files, then the marker;
- repair_voice_folder, run at startup, removes temporary files, undoes every add whose marker is left and
  finishes every remove whose marker is left.
These names start with a dot and end in no audio suffix, so a folder scan never takes them for voices.
Only files named after a checked voice name, directly inside the folder, are ever written or removed.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from . import AUDIO_SUFFIXES, VoicePreset, check_voice_name

_SIDE_FILES = (".txt", ".toml")
_ADDING = ".adding"
_REMOVING = ".removing"
_PARTIAL = ".partial"


def _toml_line(key: str, value: object) -> str:
    if isinstance(value, bool):
        return f"{key} = {'true' if value else 'false'}\n"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    return f'{key} = "{escaped}"\n'


def _marker(folder: Path, name: str, kind: str) -> Path:
    return folder / f".{name}{kind}"


def voice_exists(folder: Path, name: str) -> bool:
    return any((folder / f"{name}{suffix}").exists() for suffix in AUDIO_SUFFIXES)


def voice_preset(
    folder: Path,
    name: str,
    text: str | None,
    *,
    x_vector_only: bool = False,
    language: str | None = None,
    description: str | None = None,
) -> VoicePreset:
    """The voice NAME as the folder scan will read it once stored. Raises ValueError for a name that is not a voice
    name (and so could be a path)."""
    return VoicePreset(
        name=name,
        reference_audio=folder / f"{name}.wav",
        reference_text=(text or "").strip() or None,
        x_vector_only=x_vector_only,
        language=language or None,
        description=description or None,
    )


def _write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> Iterator[Path]:
    """Write path through a temporary name in the same folder; yields after each of the two steps."""
    tmp = path.with_name(f".{path.name}{_PARTIAL}")
    with open(tmp, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    yield tmp
    os.replace(tmp, path)
    yield path


def store_steps(preset: VoicePreset, samples: np.ndarray, sample_rate: int) -> Iterator[Path]:
    """Store a voice (voice_preset's) with its clip, mono float32 samples at sample_rate, one durable step at a
    time: each yield is a point where a crash leaves a state repair_voice_folder undoes. The add marker stays
    until commit_voice."""
    import soundfile

    assert preset.reference_audio is not None
    folder, name = preset.reference_audio.parent, preset.name
    folder.mkdir(parents=True, exist_ok=True)
    marker = _marker(folder, name, _ADDING)
    marker.touch()
    yield marker
    settings = "".join(
        _toml_line(key, value)
        for key, value in (
            ("x_vector_only", preset.x_vector_only or None),
            ("language", preset.language),
            ("description", preset.description),
        )
        if value
    )
    if settings:
        tomllib.loads(settings)  # what the scan will read
        yield from _write_atomic(folder / f"{name}.toml", lambda h: h.write(settings.encode("utf-8")))
    if preset.reference_text:
        text = (preset.reference_text + "\n").encode("utf-8")
        yield from _write_atomic(folder / f"{name}.txt", lambda h: h.write(text))
    clip = np.asarray(samples, dtype=np.float32)
    yield from _write_atomic(
        preset.reference_audio, lambda h: soundfile.write(h, clip, sample_rate, format="WAV", subtype="FLOAT")
    )


def store_voice(
    folder: Path,
    name: str,
    samples: np.ndarray,
    sample_rate: int,
    text: str | None,
    *,
    x_vector_only: bool = False,
    language: str | None = None,
    description: str | None = None,
) -> VoicePreset:
    """Write NAME.wav (mono samples in [-1, 1] at sample_rate, kept as float32) and its side files, marked as an add
    in progress until commit_voice; returns the voice as the folder scan will read it. Raises ValueError for a name
    that is not a voice name; no other file is touched."""
    preset = voice_preset(folder, name, text, x_vector_only=x_vector_only, language=language, description=description)
    write_voice(preset, samples, sample_rate)
    return preset


def write_voice(preset: VoicePreset, samples: np.ndarray, sample_rate: int) -> None:
    """store_steps to the end."""
    for _ in store_steps(preset, samples, sample_rate):
        pass


def commit_voice(folder: Path, name: str) -> None:
    """End the add of NAME: from now on a restart keeps it."""
    check_voice_name(name)
    _marker(folder, name, _ADDING).unlink(missing_ok=True)


def _own_file(folder: Path, path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and path.resolve().parent == folder.resolve()


def _delete_steps(folder: Path, name: str, removed: list[Path]) -> Iterator[Path]:
    for suffix in (*AUDIO_SUFFIXES, *_SIDE_FILES):  # the clips first: without one, the rest is no voice
        path = folder / f"{name}{suffix}"
        if _own_file(folder, path):
            path.unlink()
            removed.append(path)
            yield path
    for suffix in (*AUDIO_SUFFIXES, *_SIDE_FILES):
        path = _marker(folder, f"{name}{suffix}", _PARTIAL)
        if path.exists():
            path.unlink()
            yield path


def _delete_files(folder: Path, name: str) -> list[Path]:
    removed: list[Path] = []
    for _ in _delete_steps(folder, name, removed):
        pass
    return removed


def remove_steps(folder: Path, name: str, removed: list[Path]) -> Iterator[Path]:
    """Delete NAME's clip and side files (regular files inside the folder only), and any add of it left unfinished,
    one durable step at a time (see store_steps); what was removed is appended to `removed`."""
    check_voice_name(name)  # no paths
    if not folder.is_dir():
        return
    marker = _marker(folder, name, _REMOVING)
    marker.touch()
    yield marker
    yield from _delete_steps(folder, name, removed)
    adding = _marker(folder, name, _ADDING)
    if adding.exists():
        adding.unlink()
        yield adding
    marker.unlink()
    yield marker


def remove_voice(folder: Path, name: str) -> list[Path]:
    """remove_steps to the end; returns the files removed."""
    removed: list[Path] = []
    for _ in remove_steps(folder, name, removed):
        pass
    return removed


def repair_voice_folder(folder: Path) -> list[str]:
    """Bring the folder back to whole voices after a crash (see the module's docstring); returns what was done."""
    done: list[str] = []
    if not folder.is_dir():
        return done
    for path in sorted(folder.iterdir()):
        if not path.name.startswith(".") or not path.is_file() or path.is_symlink():
            continue
        kind = path.suffix
        name = path.name[1 : -len(kind)] if kind else ""
        try:
            check_voice_name(name.rsplit(".", 1)[0] if kind == _PARTIAL else name)
        except ValueError:
            continue  # not one of ours
        if kind == _PARTIAL:
            path.unlink(missing_ok=True)
            done.append(f"removed the unfinished file {path.name}")
        elif kind == _ADDING:
            removed = _delete_files(folder, name)
            path.unlink(missing_ok=True)
            done.append(f"undid the unfinished add of {name!r} ({len(removed)} file(s) removed)")
        elif kind == _REMOVING:
            _delete_files(folder, name)
            _marker(folder, name, _ADDING).unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            done.append(f"finished the removal of {name!r}")
    return done
