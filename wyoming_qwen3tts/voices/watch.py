"""The voices folder watched while the server runs: NAME.wav + NAME.txt (+ NAME.toml) added, changed or removed
there is offered, cloned again or withdrawn within a second or two, on both protocols, without a restart.

watchfiles (inotify on Linux, through Rust's notify crate) reports changes to the folder's own files, grouped over
DEBOUNCE_MS; each group rescans the folder (scan_voice_folder, off the event loop) and compares it with what was
last seen, by each voice's settings and its clip's size and mtime. A new or changed voice is cloned through
TtsService.add_voice (on the engine's worker, after the requests before it), a vanished one is withdrawn with
TtsService.remove_voice; a clip that cannot be cloned is logged and skipped, and tried again when its files change.

Hidden files and temporary names (".x", "x.tmp", "x.part": writes in progress, the prompt cache in .prompts) are
not voices and do not wake the watcher. Voices that the config names ([[voices]]) win over folder voices of the
same name, as at startup. The web page's uploads write into the same folder and add or remove the voice
themselves; the watcher then finds it already offered as scanned and does not clone it again.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Protocol

import watchfiles

from ..errors import Qwen3TTSError
from . import AUDIO_SUFFIXES, VoiceCatalog, VoicePreset, scan_voice_folder

_LOGGER = logging.getLogger(__name__)

DEBOUNCE_MS = 400  # a clip and its transcript copied together arrive as one change
_VOICE_SUFFIXES = (*AUDIO_SUFFIXES, ".txt", ".toml")
_TEMPORARY_SUFFIXES = (".tmp", ".part")


def is_voice_file(path: str | Path) -> bool:
    """Whether a file of the folder can be part of a voice (not hidden, not a temporary name)."""
    name = Path(path).name
    lower = name.lower()
    return not name.startswith(".") and not lower.endswith(_TEMPORARY_SUFFIXES) and lower.endswith(_VOICE_SUFFIXES)


def _seen(preset: VoicePreset) -> tuple[VoicePreset, int, int]:
    """A voice as last seen: its settings and its clip's size and mtime (a clip replaced under the same name)."""
    assert preset.reference_audio is not None
    stat = preset.reference_audio.stat()
    return preset, stat.st_size, stat.st_mtime_ns


class VoiceService(Protocol):
    """What the watcher needs of the service (service.TtsService, a layer above this one)."""

    @property
    def loaded(self) -> asyncio.Future[Any] | None: ...

    @property
    def clones_voices(self) -> bool: ...

    @property
    def catalog(self) -> VoiceCatalog: ...

    async def add_voice(self, preset: VoicePreset) -> None: ...

    def remove_voice(self, name: str) -> None: ...


class VoiceFolderWatcher:
    """Keeps the service's folder voices in step with the folder, once the model has loaded."""

    def __init__(self, service: VoiceService, folder: Path, configured: set[str] | None = None) -> None:
        self.service = service
        self.folder = folder
        self.configured = set(configured or ())  # [[voices]] names: the folder's voices of these names are not served
        self._known: dict[str, tuple[VoicePreset, int, int]] = {}
        self._stop = asyncio.Event()
        self.synced = asyncio.Event()  # set after every rescan (tests wait on it)

    async def run(self) -> None:
        """Watch until stop(); returns at once when the model cannot clone voices (not a Base model)."""
        loaded = self.service.loaded
        if loaded is None:
            raise RuntimeError("start the model load before watching the voices folder")
        try:
            await asyncio.shield(loaded)
        except Exception:  # the load failed: the server reports it and exits
            return
        if not self.service.clones_voices:
            return
        await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)
        _LOGGER.info("Watching the voices folder %s for voices added, changed or removed", self.folder)
        # An empty set each second without changes: the first one says the watch is on, so the catch-up sync for
        # what changed between the startup's scan and now misses nothing.
        watching = watchfiles.awatch(
            self.folder,
            watch_filter=lambda _, path: is_voice_file(path),
            debounce=DEBOUNCE_MS,
            recursive=False,
            stop_event=self._stop,
            rust_timeout=1000,
            yield_on_timeout=True,
        )
        caught_up = False
        try:
            async for changes in watching:
                if changes or not caught_up:
                    caught_up = True
                    await self.sync()
        except OSError as err:  # the folder went away or cannot be read: serve on without watching
            _LOGGER.error("Stopped watching the voices folder %s: %s", self.folder, err)

    def stop(self) -> None:
        self._stop.set()

    async def sync(self) -> None:
        """Rescan the folder; offer new and changed voices, withdraw vanished ones."""
        current = await asyncio.to_thread(self._scan)
        for name in sorted(set(self._known) - set(current)):
            del self._known[name]
            self.service.remove_voice(name)
            _LOGGER.info("Voice %r removed from the voices folder: no longer offered", name)
        for name, seen in sorted(current.items()):
            if self._known.get(name) == seen:
                continue
            first_look = name not in self._known
            self._known[name] = seen
            preset = seen[0]
            if first_look and (
                self.service.catalog.presets.get(name) == preset or name in self.service.catalog.skipped
            ):
                continue  # offered (or refused, with the reason logged) at startup or by an upload, from these files
            try:
                await self.service.add_voice(preset)
            except Qwen3TTSError as err:
                _LOGGER.error("Voice %r of the voices folder is not offered: %s", name, err)
                continue
            _LOGGER.info("Voice %r %s from the voices folder", name, "added" if first_look else "cloned again")
        self.synced.set()

    def _scan(self) -> dict[str, tuple[VoicePreset, int, int]]:
        found, problems = scan_voice_folder(self.folder)
        for problem in problems:
            _LOGGER.error("%s", problem)
        current = {}
        for preset in found:
            if preset.name in self.configured:
                continue
            try:
                current[preset.name] = _seen(preset)
            except OSError:  # removed between the scan and now: the next change rescans
                continue
        return current
