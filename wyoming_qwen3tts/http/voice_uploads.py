"""Adding and removing cloned voices over HTTP (the web page's Voices panel), where a Base model is loaded.

    POST   /v1/audio/voices          multipart/form-data: name, audio (the clip), text (its transcript),
                                     x_vector_only ("true"), language, description
    DELETE /v1/audio/voices/{name}   a voice of the voices folder

The same code path as the voices CLI (voices/folder.py): the clip is checked (readable audio, 1-30 s, not
silent), stored in the voices folder as NAME.wav with its side files, cloned on the engine's worker thread and
offered at once; a clip that fails to clone leaves no file behind. Only voices of the folder can be removed
(configured [[voices]] stay). The upload is read in chunks against its own limit; names are voice names (no
path), and the file's own name is never used.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import BodyPartReader, web

from ..errors import Qwen3TTSError
from ..service import TtsService
from ..voices import VoicePreset, check_voice_name
from ..voices.folder import remove_voice, store_voice, voice_exists
from .errors import ApiError

MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # 30 s of 48 kHz stereo float WAV is 11.5 MB
_FIELD_BYTES = 4096  # every form field but the clip


class VoiceUploads:
    def __init__(self, service: TtsService, folder: Path | None, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
        self.service = service
        self.folder = folder
        self.max_bytes = max_bytes
        self._lock = asyncio.Lock()  # one change of the folder at a time

    @property
    def can_add(self) -> bool:
        return self.folder is not None and self.service.clones_voices

    def is_folder_voice(self, preset: VoicePreset | None) -> bool:
        return (preset is not None and self.folder is not None and preset.reference_audio is not None
                and preset.reference_audio.parent == self.folder)  # fmt: skip

    def _check_can_add(self) -> Path:
        if self.folder is None:
            raise ApiError(409, "This server has no voices folder (set voices_dir or data_dir)", code="no-voices-folder")
        if not self.service.clones_voices:
            raise ApiError(409, "Cloned voices need a Base model, and none is loaded", code="no-base-model")
        return self.folder

    async def add(self, request: web.Request) -> web.Response:
        folder = self._check_can_add()
        if request.content_type != "multipart/form-data":
            raise ApiError(415, f"Content-Type must be multipart/form-data, not {request.content_type!r}", code="unsupported-media-type")
        if request.content_length is not None and request.content_length > self.max_bytes + 65536:
            raise ApiError(413, f"The upload is larger than {self.max_bytes} bytes", code="body-too-large")
        fields, clip = await self._read_form(request)
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
            raise ApiError(400, "text: give the clip's transcript, or x_vector_only", param="text", code="invalid-request")
        async with self._lock:
            if voice_exists(folder, name) or name in self.service.catalog.presets or name.lower() in (
                s.lower() for s in self.service.catalog.speakers
            ):
                raise ApiError(409, f"A voice {name!r} exists already", param="name", code="voice-exists")
            loop = asyncio.get_running_loop()
            try:
                audio = await loop.run_in_executor(None, _read_clip, clip)
                preset = await loop.run_in_executor(
                    None, lambda: store_voice(folder, name, audio.samples, text, x_vector_only=x_vector_only,
                                              language=fields.get("language"), description=fields.get("description")),
                )  # fmt: skip
                await self.service.add_voice(preset)
            except Qwen3TTSError as err:
                await loop.run_in_executor(None, remove_voice, folder, name)
                raise ApiError(400, str(err), param="audio", code=err.code) from None
            except ValueError as err:  # a language the catalog does not know, a bad setting
                await loop.run_in_executor(None, remove_voice, folder, name)
                self.service.remove_voice(name)
                raise ApiError(400, str(err), code="invalid-request") from None
        return web.json_response({"id": name, "object": "voice", "name": name, "seconds": round(audio.seconds, 2)}, status=201)

    async def _read_form(self, request: web.Request) -> tuple[dict[str, str], bytes | None]:
        reader = await request.multipart()
        fields: dict[str, str] = {}
        clip: bytes | None = None
        total = 0
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise ApiError(400, "nested multipart bodies are not accepted", code="invalid-request")
            limit = self.max_bytes if part.name == "audio" else _FIELD_BYTES
            data = bytearray()
            while chunk := await part.read_chunk(65536):
                data += chunk
                total += len(chunk)
                if len(data) > limit or total > self.max_bytes + 65536:
                    what = "the clip" if part.name == "audio" else f"field {part.name!r}"
                    raise ApiError(413, f"{what} is larger than {limit} bytes", code="body-too-large")
            if part.name == "audio":
                clip = bytes(data)
            elif part.name:
                try:
                    fields[part.name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise ApiError(400, f"field {part.name!r} is not UTF-8", param=part.name, code="invalid-request") from None
        return fields, clip

    async def remove(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        preset = self.service.catalog.presets.get(name)
        if not self.is_folder_voice(preset):
            raise ApiError(404, f"No voice {name[:80]!r} in the voices folder (configured voices stay)", code="unknown-voice")
        assert self.folder is not None
        async with self._lock:
            await asyncio.get_running_loop().run_in_executor(None, remove_voice, self.folder, name)
            self.service.remove_voice(name)
        return web.json_response({"id": name, "object": "voice", "deleted": True})


def _read_clip(data: bytes):  # type: ignore[no-untyped-def]
    from ..model.reference_audio import read_reference_audio

    return read_reference_audio(data)

