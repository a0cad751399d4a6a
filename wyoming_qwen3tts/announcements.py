"""Announcement cache: the audio of sentences spoken before, replayed at once instead of synthesized again.

Home Assistant repeats its announcements ("The washing machine is done"); each costs a full synthesis on the
GPU. A take (the audio chunks of one sentence) is kept in memory and on disk, keyed by everything that shapes
it: the server's version, the model (checkpoint path, config, a size + mtime fingerprint of its weight files,
device, dtype, backend, int8 or not, the engine's sampling and frame settings), the voice (speaker, the
cloned voice's prompt tensors hashed, a designed voice's description), language, style, the request's
sampling and seed, and the sentence as spoken (after the text front end). A sampled voice gets one take per
sentence, replayed every time, so an announcement sounds the same each time it is made.

A changed voice can never hit an old take: a cloned voice re-added with another clip has another prompt, so
another key; the old voice's takes are no longer reachable and age out of both tiers (LRU by bytes).

Both tiers are bounded by bytes. The memory tier is an LRU dict on the event loop; the disk tier is one file
per take in a folder, written and read on a thread of its own (never on the event loop), with its index on
the event loop. Only complete takes are stored: not one that was cancelled, ended with an error, was cut short
by the runaway guard, or made before the model loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import struct
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from . import __version__
from .request import AudioChunk, SynthesisRequest

_LOGGER = logging.getLogger(__name__)

MAGIC = b"Q3TTS-ANNOUNCEMENT-1\n"
SUFFIX = ".take"
_LENGTH = struct.Struct("<I")
_MB = 1024 * 1024


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=repr, sort_keys=True).encode("utf-8")).hexdigest()


class _Memo:
    """Digests of long-lived objects (engines, cloned voices), computed once per object."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[Any], str]] = {}

    def known(self, obj: object) -> bool:
        found = self._by_id.get(id(obj))
        return found is not None and found[0]() is obj

    def get(self, obj: object, compute: Any) -> str:
        if self.known(obj):
            return self._by_id[id(obj)][1]
        value = compute(obj)
        try:
            self._by_id[id(obj)] = (weakref.ref(obj), value)
        except TypeError:  # no weak references (a plain value): compute again next time, it is cheap then
            pass
        return value


def _weight_files(path: Path) -> list[tuple[str, int, int]]:
    """A cheap fingerprint of a checkpoint's weights: every safetensors file's name, size and mtime."""
    if not path.is_dir():
        return []
    return [
        (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*.safetensors"))
    ]


class Identified(Protocol):
    """What the cache needs of the engine that speaks (engine_set.Speaker declares it)."""

    def announcement_identity(self) -> str: ...


def checkpoint_identity(kind: str, path: Path, *settings: object) -> str:
    """What a model contributes to every take (Engine.announcement_identity): a hash of the engine's kind, its
    checkpoint's path, its weights' fingerprint and the settings that shape its audio."""
    return _digest(kind, str(path), _weight_files(path), *settings)


def combined_identity(identities: Sequence[str]) -> str:
    """What several models contribute together (EngineSet.announcement_identity): a hash of each one's."""
    return _digest(list(identities))


def voice_identity(clone: object) -> str:
    """A cloned voice's prompt, hashed: its speaker embedding, the clip's codes and the transcript's tokens."""
    import torch  # loaded with the engine that made the prompt

    h = hashlib.sha256(b"clone\0")
    for name in ("speaker_embedding", "ref_codes", "ref_text_ids"):
        value = getattr(clone, name, None)
        h.update(f"\0{name}\0".encode())
        if value is None:
            continue
        if hasattr(value, "detach"):  # a tensor
            value = value.detach().cpu().contiguous()
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
            value = value.view(-1).view(torch.uint8).numpy()
            h.update(value.tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


@dataclass
class Take:
    """One sentence's audio: replayed from the cache (`chunks` set) or recorded while it is synthesized."""

    cache: AnnouncementCache | None
    key: str | None
    cancel: threading.Event | None
    chunks: list[AudioChunk] | None = None  # a hit
    _recorded: list[AudioChunk] | None = None
    _cut_short: bool = False  # the runaway guard ended this sentence (its last chunk says why)

    @property
    def hit(self) -> bool:
        return self.chunks is not None

    def record(self, chunk: AudioChunk) -> None:
        if chunk.stopped is not None:
            self._cut_short = True
        if self.key is not None:
            if self._recorded is None:
                self._recorded = []
            self._recorded.append(chunk)

    def complete(self) -> None:
        """The synthesis ended without an error: keep the take, unless it was cancelled or is empty."""
        if self.cache is None or self.key is None or not self._recorded:
            return
        if self.cancel is not None and self.cancel.is_set():
            return
        if self._cut_short:
            # A take the runaway guard cut short (it babbled to its budget or looped) must not become the
            # announcement's voice for good.
            return
        self.cache.store(self.key, self._recorded)
        self._recorded = None


class AnnouncementCache:
    """Takes by key, in memory (`memory_mb`) and in `folder` (`disk_mb`); an LRU of bytes in each.

    Used from the event loop only (lookup, store); the disk work runs on a thread of the cache's own."""

    def __init__(
        self, *, memory_mb: float = 64.0, folder: Path | None = None, disk_mb: float = 512.0, enabled: bool = True
    ) -> None:
        self.enabled = enabled
        self.memory_limit = int(memory_mb * _MB)
        self.disk_limit = int(disk_mb * _MB) if folder is not None else 0
        self.folder = folder
        self._memory: OrderedDict[str, tuple[list[AudioChunk], int]] = OrderedDict()
        self.memory_bytes = 0
        self._disk: OrderedDict[str, int] = OrderedDict()  # file stem (the key) -> bytes, least recently used first
        self.disk_bytes = 0
        # Lookups so far, by outcome (exported as qwen3tts_announcement_cache_total by metrics.py).
        self.hits = 0
        self.misses = 0
        self._engines = _Memo()
        self._voices = _Memo()
        self._disk_thread: ThreadPoolExecutor | None = None
        if enabled and self.disk_limit > 0 and folder is not None:
            self._disk_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen3tts-announcements")
            self._scan()

    @classmethod
    def disabled(cls) -> AnnouncementCache:
        return cls(enabled=False)

    # -- keys ------------------------------------------------------------------------------------------
    def key(self, request: SynthesisRequest, engine: Identified) -> str:
        """Everything that shapes a take, hashed (the cloned voice by its prompt's contents)."""
        values = {f.name: getattr(request, f.name) for f in fields(request) if f.name != "clone"}
        voice = self._voices.get(request.clone, voice_identity) if request.clone is not None else None
        model = self._engines.get(engine, lambda e: e.announcement_identity())
        return _digest(__version__, model, voice, values)

    # -- lookup and store (event loop) -----------------------------------------------------------------
    async def lookup(
        self, request: SynthesisRequest, engine: Identified | None, cancel: threading.Event | None = None
    ) -> Take:
        """The cached take of `request` (a hit), or a Take to record while it is synthesized (a miss).
        Before the model has loaded (`engine` None), or with the cache off, neither: the take records nothing."""
        if not self.enabled or engine is None or (self.memory_limit <= 0 and self.disk_limit <= 0):
            return Take(None, None, cancel)
        if not self._engines.known(engine) or (request.clone is not None and not self._voices.known(request.clone)):
            # Once per model and per cloned voice: stats of the weight files, a cloned voice's tensors copied from
            # the GPU (which waits for the work queued there), hashed; all off the event loop.
            await asyncio.to_thread(self.key, request, engine)
        key = self.key(request, engine)
        found = self._memory.get(key)
        if found is not None:
            self._memory.move_to_end(key)
            chunks: list[AudioChunk] | None = found[0]
        else:
            chunks = await self._read_disk(key) if key in self._disk else None
            if chunks is not None:
                self._keep_in_memory(key, chunks)
        if chunks is not None:
            self.hits += 1
        else:
            self.misses += 1
        return Take(self, key, cancel, chunks=chunks)

    def store(self, key: str, chunks: list[AudioChunk]) -> None:
        chunks = [AudioChunk(pcm=c.pcm, codes=np.array(c.codes)) for c in chunks]  # the engine may reuse its arrays
        for chunk in chunks:
            chunk.codes.setflags(write=False)  # shared by every replay
        self._keep_in_memory(key, chunks)
        if self._disk_thread is not None:
            data = _encode(key, chunks)
            if len(data) <= self.disk_limit:
                self._disk[key] = len(data)
                self._disk.move_to_end(key)
                self.disk_bytes += len(data)
                evicted = self._evict_disk()
                self._disk_thread.submit(self._write, key, data, evicted).add_done_callback(_log_failure)

    def _keep_in_memory(self, key: str, chunks: list[AudioChunk]) -> None:
        size = sum(len(c.pcm) + c.codes.nbytes for c in chunks)
        if size > self.memory_limit:
            return
        old = self._memory.pop(key, None)
        if old is not None:
            self.memory_bytes -= old[1]
        self._memory[key] = (chunks, size)
        self.memory_bytes += size
        while self.memory_bytes > self.memory_limit:
            _, (_, dropped) = self._memory.popitem(last=False)
            self.memory_bytes -= dropped

    def _evict_disk(self) -> list[str]:
        evicted = []
        while self.disk_bytes > self.disk_limit and self._disk:
            name, size = self._disk.popitem(last=False)
            self.disk_bytes -= size
            evicted.append(name)
        return evicted

    # -- disk (the cache's thread) ---------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}{SUFFIX}"

    def _scan(self) -> None:
        """Index the takes already on disk, least recently used first, and trim them to the limit."""
        assert self.folder is not None
        found = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.folder):
                if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                    stat = entry.stat()
                    found.append((stat.st_mtime_ns, entry.name.removesuffix(SUFFIX), stat.st_size))
        for _, key, size in sorted(found):
            self._disk[key] = size
            self.disk_bytes += size
        self._remove(self._evict_disk())
        if found:
            _LOGGER.info(
                "Announcement cache %s: %d take(s), %.1f MB", self.folder, len(self._disk), self.disk_bytes / _MB
            )

    async def _read_disk(self, key: str) -> list[AudioChunk] | None:
        assert self._disk_thread is not None
        self._disk.move_to_end(key)
        chunks = await asyncio.get_running_loop().run_in_executor(self._disk_thread, self._read, key)
        if chunks is None and key in self._disk:  # unreadable: forget it (the next take replaces it)
            self.disk_bytes -= self._disk.pop(key)
        return chunks

    def _read(self, key: str) -> list[AudioChunk] | None:
        path = self._path(key)
        try:
            chunks = _decode(key, path.read_bytes())
            os.utime(path)  # the LRU order survives a restart
            return chunks
        except (OSError, ValueError) as err:
            _LOGGER.warning("Announcement cache: dropping %s: %s", path.name, err)
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def _write(self, key: str, data: bytes, evicted: list[str]) -> None:
        assert self.folder is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self._path(key)
        temp = path.with_name(f".{path.name}.tmp")  # renamed into place: a crash leaves no half-written take
        temp.write_bytes(data)
        os.replace(temp, path)
        self._remove(evicted)

    def _remove(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                self._path(key).unlink()

    def close(self) -> None:
        """Finish the disk writes queued so far."""
        if self._disk_thread is not None:
            self._disk_thread.shutdown(wait=True)


def _log_failure(future: Any) -> None:
    err = future.exception()
    if err is not None:
        _LOGGER.warning("Announcement cache: could not write to disk: %s", err)


def _encode(key: str, chunks: list[AudioChunk]) -> bytes:
    """MAGIC, the header's length, a JSON header (key, each chunk's PCM bytes and frames), then the PCM and the
    codes (int16: codebook indices are below 4096) of every chunk in order."""
    header = json.dumps(
        {
            "key": key,
            "pcm": [len(c.pcm) for c in chunks],
            "frames": [c.num_frames for c in chunks],
            "groups": int(chunks[0].codes.shape[1]) if chunks[0].codes.ndim == 2 else 0,
        }
    ).encode()
    codes = b"".join(np.asarray(c.codes, dtype="<i2").tobytes() for c in chunks)
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, *(c.pcm for c in chunks), codes])


def _decode(key: str, data: bytes) -> list[AudioChunk]:
    if not data.startswith(MAGIC):
        raise ValueError("not a take file")
    start = len(MAGIC) + _LENGTH.size
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    header = json.loads(data[start : start + length])
    if header.get("key") != key:
        raise ValueError("its key does not match its name")
    pos = start + length
    pcm = []
    for size in header["pcm"]:
        pcm.append(data[pos : pos + size])
        pos += size
    groups = header["groups"]
    total = sum(header["frames"]) * groups * 2
    if len(data) != pos + total or any(len(p) != n for p, n in zip(pcm, header["pcm"])):
        raise ValueError("truncated")
    codes = np.frombuffer(data, dtype="<i2", offset=pos, count=total // 2).astype(np.int64).reshape(-1, groups)
    chunks = []
    row = 0
    for piece, frames in zip(pcm, header["frames"]):
        part = codes[row : row + frames]
        part.setflags(write=False)
        chunks.append(AudioChunk(pcm=piece, codes=part))
        row += frames
    return chunks
