"""Adding and removing cloned voices over HTTP (the web page's Voices panel), where a Base model is loaded.

    POST   /v1/audio/voices          multipart/form-data: name, audio (the clip), text (its transcript),
                                     x_vector_only ("true"), language, description
    DELETE /v1/audio/voices/{name}   a voice of the voices folder

The same code path as the voices CLI (voices/folder.py): the clip is checked (readable audio, 1-30 s, not
silent, bounded channels and rate), stored in the voices folder as NAME.wav with its side files, cloned on the
engine's worker thread and offered at once. Only voices of the folder can be removed (configured [[voices]] stay,
and so does a clip a configured voice uses). Names are voice names (no path), and the file's own name is never used.

Bounded per upload: at most max_uploads at once (each also counts as a connection against max_connections), the
body read in chunks against its own limit within upload_timeout, the clip decoded within the limits of
model/reference_audio.py. State stays whole: one change of the folder at a time, and a change, once its body is
read, runs to its end or is undone as a unit even when the client leaves or the server stops (a crash is undone at
the next start: voices/folder.py); a client that left during an add gets no voice it was never told of.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import BodyPartReader, web

from ..errors import Qwen3TTSError, ShuttingDownError
from ..service import TaskConnection, TtsService
from ..voices import VoicePreset, check_voice_name, language_name
from ..voices.folder import (
    commit_voice,
    remove_voice,
    voice_exists,
    voice_preset,
    write_voice,
)
from .errors import ApiError

_LOGGER = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # 30 s of 48 kHz stereo float WAV is 11.5 MB
_FIELD_BYTES = 4096  # every form field but the clip
_FORM_SLACK = 65536  # the form's own bytes around its fields (boundaries, part headers)
# Parts of a form: its six fields, and room for a client's extras. aiohttp parses a form on the event loop, part by
# part: 16 MiB of tiny parts took over 10 s and held up every other client for seconds at a time.
_MAX_PARTS = 16


class _Abandoned(Exception):
    """The client of an add went away before it was answered: the add is undone."""


class VoiceUploads:
    def __init__(
        self,
        service: TtsService,
        folder: Path | None,
        max_bytes: int = MAX_UPLOAD_BYTES,
        *,
        configured: frozenset[str] = frozenset(),
        max_uploads: int = 2,
        upload_timeout: float = 120.0,
    ) -> None:
        self.service = service
        self.folder = folder
        self.max_bytes = max_bytes
        self.configured = configured  # the [[voices]] of the configuration: never removed here
        self.max_uploads = max_uploads
        self.upload_timeout = upload_timeout
        self.uploads = 0  # uploads being received or checked now
        self._lock = asyncio.Lock()  # one change of the folder at a time
        self._changes: set[asyncio.Task[Any]] = set()  # changes in progress (each may outlive its request)

    @property
    def can_add(self) -> bool:
        return self.folder is not None and self.service.clones_voices

    def is_folder_voice(self, preset: VoicePreset | None) -> bool:
        """Whether the voice came from the voices folder (and so may be removed here)."""
        return (
            preset is not None
            and self.folder is not None
            and preset.name not in self.configured
            and preset.reference_audio is not None
            and preset.reference_audio.parent == self.folder
        )

    def _check_can_add(self) -> Path:
        if self.folder is None:
            raise ApiError(
                409, "This server has no voices folder (set voices_dir or data_dir)", code="no-voices-folder"
            )
        if not self.service.clones_voices:
            raise ApiError(409, "Cloned voices need a Base model, and none is loaded", code="no-base-model")
        return self.folder

    # -- POST /v1/audio/voices -------------------------------------------------------------------
    async def add(self, request: web.Request) -> web.Response:
        folder = self._check_can_add()
        if request.content_type != "multipart/form-data":
            raise ApiError(
                415,
                f"Content-Type must be multipart/form-data, not {request.content_type!r}",
                code="unsupported-media-type",
            )
        if request.content_length is not None and request.content_length > self.max_bytes + _FORM_SLACK:
            raise ApiError(413, f"The upload is larger than {self.max_bytes} bytes", code="body-too-large")
        if self.uploads >= self.max_uploads:
            raise ApiError(
                429,
                f"{self.uploads} voice uploads are in progress (max_uploads); try again shortly",
                code="too-many-uploads",
                headers={"Retry-After": "1"},
            )
        upload = TaskConnection()  # counted by max_connections, cancelled on SIGTERM like the others
        refused = self.service.admit(upload)
        if refused is not None:
            raise ApiError.from_service(refused)
        self.uploads += 1
        try:
            return await self._add(request, folder)
        finally:
            self.uploads -= 1
            self.service.release(upload)

    async def _add(self, request: web.Request, folder: Path) -> web.Response:
        try:
            async with asyncio.timeout(self.upload_timeout):
                fields, clip = await self._read_form(request)
        except TimeoutError:
            raise ApiError(
                408, f"The upload did not arrive within {self.upload_timeout:g} s", code="body-timeout"
            ) from None
        name = fields.get("name", "")
        try:
            check_voice_name(name)  # a voice name, no path
        except ValueError as err:
            raise ApiError(400, f"name: {err}", param="name", code="invalid-name") from None
        if clip is None:
            raise ApiError(400, "audio: the clip is missing", param="audio", code="invalid-request")
        text = fields.get("text", "").strip() or None
        x_vector_only = fields.get("x_vector_only", "").lower() in ("1", "true", "on", "yes")
        if not text and not x_vector_only:
            raise ApiError(
                400, "text: give the clip's transcript, or x_vector_only", param="text", code="invalid-request"
            )
        language = fields.get("language", "").strip() or None
        if language is not None:
            try:
                language_name(language, self.service.catalog.languages)
            except Qwen3TTSError as err:
                raise ApiError(400, str(err), param="language", code=err.code) from None
        try:
            mono, rate, seconds = await asyncio.get_running_loop().run_in_executor(None, _read_clip, clip)
        except Qwen3TTSError as err:
            raise ApiError(400, str(err), param="audio", code=err.code) from None
        del clip
        try:
            preset = voice_preset(
                folder,
                name,
                text,
                x_vector_only=x_vector_only,
                language=language,
                description=fields.get("description"),
            )
        except ValueError as err:
            raise ApiError(400, str(err), code="invalid-request") from None
        await self._run_to_end(lambda abandoned: self._add_voice(preset, mono, rate, abandoned))
        return web.json_response(
            {"id": preset.name, "object": "voice", "name": preset.name, "seconds": round(seconds, 2)}, status=201
        )

    async def _add_voice(self, preset: VoicePreset, mono: Any, rate: int, abandoned: asyncio.Event) -> None:
        """Store, clone and offer the voice; undone as a whole on any failure, or when its client left."""
        assert self.folder is not None and preset.reference_audio is not None
        folder, name = self.folder, preset.name
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self._taken(name):
                raise ApiError(409, f"A voice {name!r} exists already", param="name", code="voice-exists")
            try:
                await loop.run_in_executor(None, write_voice, preset, mono, rate)
                await self.service.add_voice(preset)
                if abandoned.is_set():
                    raise _Abandoned
                await loop.run_in_executor(None, commit_voice, folder, name)
            except BaseException as err:
                self.service.remove_voice(name)
                try:
                    await loop.run_in_executor(None, remove_voice, folder, name)
                except OSError as undo_err:  # its marker stays: the next start finishes the undo
                    _LOGGER.error("Could not undo the add of voice %r in %s: %s", name, folder, undo_err)
                if isinstance(err, _Abandoned):
                    _LOGGER.info("The client left while voice %r was being added: not added", name)
                    return
                if isinstance(err, Qwen3TTSError):
                    raise ApiError(400, str(err), param="audio", code=err.code) from None
                elif isinstance(err, ValueError):  # a setting the catalog refuses
                    raise ApiError(400, str(err), code="invalid-request") from None
                raise
        _LOGGER.info("Added voice %r to %s", name, folder)

    def _taken(self, name: str) -> bool:
        assert self.folder is not None
        catalog = self.service.catalog
        return (
            voice_exists(self.folder, name)
            or name in catalog.presets
            or name.lower() in (s.lower() for s in catalog.speakers)
        )

    async def _run_to_end(self, change: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        """Run a change of the folder to its end even when the request is cancelled meanwhile (the client left, or
        the server stops): a change cut in the middle would leave the folder, the catalog and the engine's prompts
        disagreeing. The change is handed an event set once its client has left."""
        abandoned = asyncio.Event()
        task = asyncio.ensure_future(change(abandoned))
        self._changes.add(task)  # the loop keeps only a weak reference to a task

        def done(task: asyncio.Task[None]) -> None:
            self._changes.discard(task)
            error = None if task.cancelled() else task.exception()
            if abandoned.is_set() and error is not None and not isinstance(error, ApiError):
                _LOGGER.error("A change of the voices folder failed after its client left", exc_info=error)

        task.add_done_callback(done)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            abandoned.set()
            raise

    async def _read_form(self, request: web.Request) -> tuple[dict[str, str], bytes | None]:
        try:
            reader = await request.multipart()
        except ValueError as err:  # no or a malformed boundary
            raise ApiError(400, f"The body is not a multipart form: {_reason(err)}", code="invalid-form") from None
        fields: dict[str, str] = {}
        clip: bytes | None = None
        total = parts = 0
        while True:
            try:
                part = await reader.next()
            except ValueError as err:  # a missing, unterminated or long boundary
                raise ApiError(
                    400, f"The body is not a well-formed multipart form: {_reason(err)}", code="invalid-form"
                ) from None
            if part is None:
                break
            parts += 1
            if parts > _MAX_PARTS:
                raise ApiError(400, f"The form has more than {_MAX_PARTS} fields", code="invalid-form")
            if not isinstance(part, BodyPartReader):
                raise ApiError(400, "nested multipart bodies are not accepted", code="invalid-form")
            limit = self.max_bytes if part.name == "audio" else _FIELD_BYTES
            data = bytearray()
            while True:
                try:
                    chunk = await part.read_chunk(65536)
                except ValueError as err:
                    raise ApiError(
                        400, f"The body is not a well-formed multipart form: {_reason(err)}", code="invalid-form"
                    ) from None
                if not chunk:
                    break
                data += chunk
                total += len(chunk)
                if len(data) > limit or total > self.max_bytes + _FORM_SLACK:
                    what = "the clip" if part.name == "audio" else f"field {(part.name or '')[:40]!r}"
                    raise ApiError(413, f"{what} is larger than {limit} bytes", code="body-too-large")
            if part.name == "audio":
                clip = bytes(data)
            elif part.name:
                try:
                    fields[part.name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise ApiError(
                        400, f"field {part.name[:40]!r} is not UTF-8", param=part.name[:40], code="invalid-request"
                    ) from None
        return fields, clip

    # -- DELETE /v1/audio/voices/{name} ------------------------------------------------------------
    async def remove(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if self.service.draining:
            raise ApiError.from_service(ShuttingDownError("The server is shutting down"))
        await self._run_to_end(lambda _: self._remove_voice(name))
        return web.json_response({"id": name, "object": "voice", "deleted": True})

    async def _remove_voice(self, name: str) -> None:
        async with self._lock:  # after any add of the same name has ended
            preset = self.service.catalog.presets.get(name)
            if not self.is_folder_voice(preset):
                raise ApiError(
                    404, f"No voice {name[:80]!r} in the voices folder (configured voices stay)", code="unknown-voice"
                )
            assert self.folder is not None and preset is not None
            users = sorted(
                p.name
                for p in self.service.catalog.presets.values()
                if p.name != name and p.reference_audio == preset.reference_audio
            )
            if users:
                raise ApiError(
                    409,
                    f"The clip of {name!r} is also the voice of configured voice(s) {', '.join(users)[:200]}",
                    code="voice-in-use",
                )
            self.service.remove_voice(name)  # first: a clip deleted under a voice still offered fails its requests
            await asyncio.get_running_loop().run_in_executor(None, remove_voice, self.folder, name)
        _LOGGER.info("Removed voice %r from %s", name, self.folder)


def _read_clip(data: bytes) -> tuple[Any, int, float]:
    """The clip's mono samples at its own rate, the rate and its length, once it is checked (ReferenceAudioError)."""
    from ..model.reference_audio import read_mono, reference_audio_from_array

    mono, rate, name = read_mono(data)
    audio = reference_audio_from_array(mono, rate, source=name)
    return mono, rate, audio.seconds


def _reason(err: BaseException) -> str:
    """An exception's message for a client, cut short (it may quote the client's own bytes)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:120]
