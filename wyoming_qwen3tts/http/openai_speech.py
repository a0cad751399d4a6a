"""OpenAI's speech API on the shared TtsService: POST /v1/audio/speech, GET /v1/audio/voices, GET /v1/models.

A speech request is checked whole before anything is spoken (JSON body, voice, text, format) and
answered with an OpenAI-shaped error if anything is wrong.  Its text goes through the same
cleaning and sentence splitting as a Wyoming request, and each sentence is submitted to the
service on its own, so HTTP and Wyoming requests interleave sentence by sentence on the one
engine.  The response's status and headers wait for the first frame group, so an error before any
audio (model still loading, out of GPU memory) still gets its status code; after that the body
streams as frames are decoded: raw audio (stream_format "audio") or Server-Sent Events
("speech.audio.delta" with base64 audio, then "speech.audio.done").  An error after the first
bytes ends an SSE stream with an "error" event and cuts an audio stream short (the incomplete
chunked body tells the client it failed).

Each speech request registers with the service as one connection (service.Connection), so it
counts against max_connections (429 beyond it) and SIGTERM drains it like a Wyoming exchange.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError
from wyoming.tts import SynthesizeVoice

from .. import speech
from ..errors import Qwen3TTSError, TextTooLongError
from ..metrics import Metrics, SpeechMeter, model_state
from ..options import TextOptions
from ..request import SAMPLE_RATE, AudioChunk
from ..service import TaskConnection, TtsService
from ..text.sentences import clean_client_text
from ..text.stream import Sentence
from ..voices import AUTO, VoiceChoice, language_code, language_name
from ..wire import short
from .audio_formats import FORMATS, MAX_SPEED, MIN_SPEED, AudioEncoder, AudioFormat
from .errors import ApiError

if TYPE_CHECKING:
    from .voice_uploads import VoiceUploads

_LOGGER = logging.getLogger(__name__)

STREAM_FORMATS = ("audio", "sse")
# A style instruction is one or two sentences; the limit keeps every sentence's prompt small.
MAX_INSTRUCTIONS_CHARS = 1000
# Voice names are looked up in memory, never used as paths; this only keeps error messages short.
MAX_VOICE_CHARS = 200


@dataclass(frozen=True)
class SpeechConfig:
    """The speech API's settings, taken from the server's Settings."""

    model_id: str = "qwen3-tts"
    max_body_bytes: int = 1_048_576
    max_text_chars: int = TextOptions.max_text_chars
    max_sentence_chars: int = TextOptions.max_sentence_chars
    text_frontend: bool = TextOptions.text_frontend
    body_timeout: float = 120.0  # seconds to receive a request body
    write_timeout: float = 60.0  # seconds a client may take to accept audio
    seed: int | None = TextOptions.seed

    @property
    def text(self) -> TextOptions:
        return TextOptions(self.max_text_chars, self.max_sentence_chars, self.text_frontend, self.seed)


class _VoiceId(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str


class SpeechBody(BaseModel):
    """OpenAI's request body, plus `language` (as vLLM-Omni has it).  Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # any name: the loaded model answers
    input: str
    voice: str | _VoiceId | None = None  # None: the default voice
    instructions: str | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    language: str | None = None


@dataclass(frozen=True)
class SpeechPlan:
    """A checked request: what to speak, with what, and how to send it."""

    voice: VoiceChoice
    text: str  # the input as the client sent it
    sentences: list[Sentence]  # what is spoken (filled by create_speech from text)
    chars: int
    format: AudioFormat
    speed: float
    sse: bool


class _ClientGone(Exception):
    """The client stopped reading (closed the connection or stalled past write_timeout)."""


class HttpSpeechStream(TaskConnection):
    """One speech request as the service sees a connection: drained and aborted on SIGTERM; aborting also stops
    the engine and says why."""

    def __init__(self) -> None:
        super().__init__()
        self.cancel = threading.Event()  # stops the engine after its current frame group
        self.draining = False
        self.failure: Qwen3TTSError | None = None

    def begin_drain(self) -> None:
        # The request is finished as usual; the response then closes its keep-alive connection.
        self.draining = True

    async def abort(self, err: Qwen3TTSError) -> None:
        self.failure = err
        self.cancel.set()
        await super().abort(err)


class _Encoding:
    """Runs an AudioEncoder, off the event loop for the costly codecs, and frees it only when no call is in flight."""

    def __init__(self, encoder: AudioEncoder) -> None:
        self._encoder = encoder
        self._running: asyncio.Future[bytes] | None = None

    async def encode(self, pcm: bytes) -> bytes:
        return await self._run(self._encoder.encode, pcm)

    async def finish(self) -> bytes:
        return await self._run(self._encoder.finish)

    async def _run(self, fn: Callable[..., bytes], *args: Any) -> bytes:
        if not self._encoder.format.heavy:
            return fn(*args)
        self._running = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        # Shielded: a cancelled request must not mark the job done while the thread still encodes.
        return await asyncio.shield(self._running)

    def close(self) -> None:
        if self._running is not None and not self._running.done():
            self._running.add_done_callback(lambda _: self._encoder.close())
        else:
            self._encoder.close()


class SpeechApi:
    """The /v1 routes: speech, voices, models."""

    def __init__(self, service: TtsService, config: SpeechConfig, metrics: Metrics) -> None:
        self.service = service
        self.config = config
        self.metrics = metrics
        self.uploads: VoiceUploads | None = None  # the page's cloned voices (build_app sets it)

    # -- GET /v1/models, GET /v1/audio/voices -------------------------------------------------
    async def list_models(self, request: web.Request) -> web.Response:
        model = {"id": self.config.model_id, "object": "model", "created": 0, "owned_by": "qwen"}
        return web.json_response({"object": "list", "data": [model]})

    async def list_voices(self, request: web.Request) -> web.Response:
        """Every voice of the catalog, with what the web page shows of it; `?language=de-DE`: those speaking it,
        the voices native to it first."""
        catalog = self.service.catalog
        voices = []
        try:
            listed = catalog.voices_for(request.query.get("language", "")[:MAX_VOICE_CHARS])
        except Qwen3TTSError as err:
            raise ApiError.from_service(err, param="language") from None
        for voice in listed:
            entry: dict[str, Any] = {
                "id": voice.name,
                "object": "voice",
                "name": voice.name,
                "description": voice.description,
                "languages": voice.languages,
                "kind": "speaker" if voice.name in catalog.speakers else "preset",
            }
            preset = catalog.presets.get(voice.name)
            if preset is not None:
                entry.update(speaker=preset.speaker, instruct=preset.instruct or preset.design)
                entry["kind"] = {"base": "cloned", "voice_design": "designed"}.get(preset.kind, "preset")
            entry["removable"] = self.uploads is not None and self.uploads.is_folder_voice(preset)
            voices.append(entry)
        return web.json_response(
            {
                "object": "list",
                "data": voices,
                "default_voice": catalog.default_voice,
                "languages": [AUTO] + [language_code(lang) for lang in catalog.languages if lang != AUTO],
                "supports_instructions": catalog.supports_instruct,
                "response_formats": list(FORMATS),
                "can_add_voices": self.uploads is not None and self.uploads.can_add,
                "model_state": model_state(self.service),
            }
        )

    # -- POST /v1/audio/speech ------------------------------------------------------------------
    async def create_speech(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        self._check_ready()
        plan = self._plan(await self._read_json(request))
        try:
            # The one place the input is cleaned, held to max_text_chars and split, as a Wyoming text is.
            sentences = await speech.prepare(plan.text, plan.voice.language, self.config.text)
        except TextTooLongError as err:
            raise ApiError.from_service(err, param="input") from None
        if not sentences:  # empty, blank, or only marks and control characters
            raise ApiError(400, "input has nothing to speak (no letters or digits)", param="input", code="empty-text")
        plan = replace(plan, sentences=sentences)
        stream = HttpSpeechStream()
        refused = self.service.admit(stream)
        if refused is not None:
            raise ApiError.from_service(refused)
        try:
            assert stream.task is not None
            self.service.track(stream.task)
            meter = self.metrics.speech("http", started_at=started)
            try:
                return await self._respond(request, plan, stream, meter)
            finally:
                meter.finish("cancelled")  # a no-op when _respond counted its outcome
        finally:
            self.service.release(stream)

    def _check_ready(self) -> None:
        state = model_state(self.service)
        if state == "loading":
            raise ApiError(
                503, "The model is still loading; try again shortly", code="model-loading", headers={"Retry-After": "5"}
            )
        if state == "failed":
            raise ApiError(503, f"The model could not be loaded: {self.service.load_error}", code="model-load-failed")

    async def _read_json(self, request: web.Request) -> Any:
        if request.content_type != "application/json":
            raise ApiError(
                415,
                f"Content-Type must be application/json, not {request.content_type!r}",
                code="unsupported-media-type",
            )
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(
                413,
                f"The request body has {request.content_length} bytes, more than the limit of {limit}",
                code="body-too-large",
            )
        try:
            async with asyncio.timeout(self.config.body_timeout):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(
                413, f"The request body is larger than the limit of {limit} bytes", code="body-too-large"
            ) from None
        except TimeoutError:
            raise ApiError(
                408, f"The request body did not arrive within {self.config.body_timeout:g} s", code="body-timeout"
            ) from None
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            raise ApiError(400, f"The request body is not valid JSON: {short(err)}", code="invalid-json") from None

    def _plan(self, payload: Any) -> SpeechPlan:
        try:
            body = SpeechBody.model_validate(payload)
        except ValidationError as err:
            first = err.errors()[0]
            param = str(first["loc"][0]) if first["loc"] else None  # ("voice", "str"): a union's member
            raise ApiError(400, f"{param or 'body'}: {first['msg']}", param=param, code="invalid-request") from None
        fmt = FORMATS.get(body.response_format)
        if fmt is None:
            raise ApiError(
                400,
                f"Unsupported response_format {short(body.response_format)}; this server offers {', '.join(FORMATS)}",
                param="response_format",
                code="unsupported-format",
            )
        if body.stream_format not in STREAM_FORMATS:
            raise ApiError(
                400,
                f"stream_format must be 'audio' or 'sse', not {short(body.stream_format)}",
                param="stream_format",
                code="invalid-request",
            )
        if not MIN_SPEED <= body.speed <= MAX_SPEED:
            raise ApiError(
                400,
                f"speed must be between {MIN_SPEED} and {MAX_SPEED}, not {body.speed}",
                param="speed",
                code="invalid-request",
            )
        return SpeechPlan(
            self._voice(body), body.input, [], len(body.input), fmt, body.speed, body.stream_format == "sse"
        )

    def _voice(self, body: SpeechBody) -> VoiceChoice:
        catalog = self.service.catalog
        name = body.voice.id if isinstance(body.voice, _VoiceId) else body.voice
        if name is not None and len(name) > MAX_VOICE_CHARS:
            raise ApiError(400, f"Unknown voice {short(name)}", param="voice", code="unknown-voice")
        try:
            voice = catalog.resolve(SynthesizeVoice(name=name) if name else None)
        except Qwen3TTSError as err:
            raise ApiError.from_service(err, param="voice") from None
        if body.language:
            try:
                voice = replace(voice, language=language_name(body.language[:MAX_VOICE_CHARS], catalog.languages))
            except Qwen3TTSError as err:
                raise ApiError.from_service(err, param="language") from None
        instructions = clean_client_text(body.instructions or "").strip()
        if instructions:
            designed = not voice.speaker and voice.clone is None  # its instruct is its description: the style joins it
            if not (designed or (voice.speaker and catalog.supports_instruct)):
                raise ApiError(
                    400,
                    f"Voice {short(voice.voice)} does not follow style instructions (1.7B CustomVoice speakers and designed voices do)",
                    param="instructions",
                    code="instructions-unsupported",
                )
            if len(instructions) > MAX_INSTRUCTIONS_CHARS:
                raise ApiError(
                    400,
                    f"instructions have {len(instructions)} characters, more than the limit of {MAX_INSTRUCTIONS_CHARS}",
                    param="instructions",
                    code="text-too-long",
                )
            voice = replace(voice, instruct=f"{voice.instruct} {instructions}" if designed else instructions)
        return voice

    async def _respond(
        self, request: web.Request, plan: SpeechPlan, stream: HttpSpeechStream, meter: SpeechMeter
    ) -> web.StreamResponse:
        chunks = speech.speak(
            self.service, plan.voice, speech.each(plan.sentences), stream.cancel, meter, seed=self.config.seed
        )
        response: web.StreamResponse | None = None
        encoding: _Encoding | None = None
        try:
            first = await anext(chunks, None)  # before the status line: an error here still gets its status
            response = web.StreamResponse(headers=_stream_headers(plan))
            if stream.draining:
                response.force_close()
            await response.prepare(request)
            encoding = _Encoding(AudioEncoder(plan.format, plan.speed))
            try:
                if first is not None:
                    await self._send_audio(request, response, plan, encoding, meter, first)
                async for chunk in chunks:
                    await self._send_audio(request, response, plan, encoding, meter, chunk)
                await self._send(request, response, plan, await encoding.finish())
                if plan.sse:
                    usage = {
                        "input_tokens": plan.chars,
                        "output_tokens": meter.frames,
                        "total_tokens": plan.chars + meter.frames,
                    }
                    await self._send_event(request, response, {"type": "speech.audio.done", "usage": usage})
                await response.write_eof()
            except Qwen3TTSError as err:
                meter.finish(err.code)
                _LOGGER.warning("HTTP speech with %s ended with error %s: %s", plan.voice.voice, err.code, err)
                await self._end_with_error(request, response, plan, ApiError.from_service(err))
                return response
            except _ClientGone as err:
                meter.finish("client-gone")
                _LOGGER.info("HTTP client gone during synthesis with %s: %s", plan.voice.voice, err)
                return response
            meter.finish("ok")
            speech.log_spoken(
                _LOGGER, plan.voice, plan.chars, meter, f" format={plan.format.name}{' sse' if plan.sse else ''} (http)"
            )
            return response
        except Qwen3TTSError as err:  # from the first frame group
            meter.finish(err.code)
            raise ApiError.from_service(err) from None
        except asyncio.CancelledError:
            # aiohttp cancels the handler when its client disconnects; abort() when draining took too long.
            stream.cancel.set()
            if stream.failure is None:
                meter.finish("client-gone")
                raise
            meter.finish(stream.failure.code)
            if response is None:
                task = asyncio.current_task()
                assert task is not None  # a request handler runs in a task
                task.uncancel()  # our own cancel: answer it
                raise ApiError.from_service(stream.failure) from None
            with contextlib.suppress(Exception):
                await self._end_with_error(request, response, plan, ApiError.from_service(stream.failure))
            raise
        finally:
            stream.cancel.set()  # a no-op after a whole answer; stops the engine otherwise
            await chunks.aclose()
            if encoding is not None:
                encoding.close()

    async def _send_audio(
        self,
        request: web.Request,
        response: web.StreamResponse,
        plan: SpeechPlan,
        encoding: _Encoding,
        meter: SpeechMeter,
        chunk: AudioChunk,
    ) -> None:
        await self._send(request, response, plan, await encoding.encode(chunk.pcm))
        meter.audio(chunk.num_frames)

    async def _send(self, request: web.Request, response: web.StreamResponse, plan: SpeechPlan, data: bytes) -> None:
        if not data:
            return
        if plan.sse:
            await self._send_event(
                request, response, {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")}
            )
        else:
            await self._write(request, response, data)

    async def _send_event(self, request: web.Request, response: web.StreamResponse, event: dict[str, Any]) -> None:
        await self._write(request, response, b"data: " + json.dumps(event).encode() + b"\n\n")

    async def _write(self, request: web.Request, response: web.StreamResponse, data: bytes) -> None:
        try:
            async with asyncio.timeout(self.config.write_timeout):
                await response.write(data)
        except TimeoutError:
            if request.transport is not None:
                request.transport.abort()  # a client that stopped reading: its socket buffers are full
            raise _ClientGone(f"client accepted no audio for {self.config.write_timeout:g} s") from None
        except (ConnectionError, RuntimeError) as err:  # RuntimeError: the transport is closed
            raise _ClientGone(str(err) or type(err).__name__) from err

    async def _end_with_error(
        self, request: web.Request, response: web.StreamResponse, plan: SpeechPlan, err: ApiError
    ) -> None:
        """After the status line went out: an SSE "error" event, or an audio body cut short."""
        if plan.sse:
            with contextlib.suppress(_ClientGone):
                async with asyncio.timeout(5):
                    await self._send_event(request, response, {"type": "error", **err.body()})
                    await response.write_eof()
                return
        if request.transport is not None:
            request.transport.abort()


def _stream_headers(plan: SpeechPlan) -> dict[str, str]:
    headers = {
        "Cache-Control": "no-store",
        "X-Accel-Buffering": "no",  # reverse proxies (nginx) must not buffer a stream
        "X-Sample-Rate": str(SAMPLE_RATE),
    }
    headers["Content-Type"] = "text/event-stream" if plan.sse else plan.format.content_type
    return headers
