"""The Wyoming event handler: describe, one-shot and streamed synthesis, audio out.

One handler per connection.  handle_event only does protocol bookkeeping and returns at once;
each request ("exchange") is spoken by its own task that takes sentences in order, hands them to
the shared TtsService (which runs the engine on its worker thread) and writes audio events as
frame groups are decoded.  So the connection keeps reading while audio is produced: a disconnect
is seen at once and cancels the work, and describe is answered during a synthesis.

Every exchange is answered with exactly one audio-start and one audio-stop (plus
synthesize-stopped for a stream), whatever the number of sentences: Home Assistant builds its
WAV header from the first audio-start, and wyoming-bench's one-shot mode stops reading at the
first audio-stop.  Home Assistant ignores error events and has no timeout, so an error is sent,
logged and followed by closing the connection.

Client input is never trusted (docs/reliability.md): events are read by our own bounded reader
(not the wyoming library's, which would allocate whatever data_length or payload_length a header
claims), every malformed or out-of-order event ends the connection with an error event, text is
cleaned of control characters and unpaired surrogates, and idle, stuck or surplus connections are
closed.  No client field is ever used as a file path: voices are looked up by name in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass

from wyoming.audio import AudioChunk as WyomingAudioChunk
from wyoming.audio import AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from .options import EngineOptions
from .request import CHANNELS, SAMPLE_RATE, SAMPLE_WIDTH, SynthesisRequest
from .errors import (
    EventTooLargeError,
    IdleTimeoutError,
    ProtocolError,
    Qwen3TTSError,
    ShuttingDownError,
    TextTooLongError,
)
from .sentences import SentenceSplitter, clean_client_text, split_sentences
from .server import TtsService
from .voices import VoiceChoice

_LOGGER = logging.getLogger(__name__)


class _ClientGone(Exception):
    """Writing to the client failed: it closed the connection."""


@dataclass(frozen=True)
class HandlerConfig:
    """The per-request settings every handler shares."""

    max_text_chars: int = EngineOptions.max_text_chars
    max_sentence_chars: int = 400
    seed: int | None = None
    max_event_bytes: int = 1_048_576
    idle_timeout: float = 120.0
    write_timeout: float = 60.0


# -- bounded event reading ------------------------------------------------------------------


async def read_event(reader: asyncio.StreamReader, max_bytes: int) -> Event | None:
    """One Wyoming event, or None at a clean end of the connection.

    The same wire format as wyoming.event.async_read_event, but nothing is allocated on the
    client's word: the header line is read in pieces of at most the stream's buffer limit and
    refused past `max_bytes`, and data_length/payload_length are checked against `max_bytes`
    before anything is read.  Anything malformed raises ProtocolError (the library returns None,
    which looks like a clean disconnect).
    """
    line = await _read_line(reader, max_bytes)
    if line is None:
        return None
    try:
        header = json.loads(line)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"Event header is not JSON: {_short(err)}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("Event header must be a JSON object with a string 'type'")
    data = header.get("data")
    if data is None:
        data = {}
    elif not isinstance(data, dict):
        raise ProtocolError("Event 'data' must be a JSON object")
    data_length = _length(header, "data_length")
    payload_length = _length(header, "payload_length")
    total = len(line) + data_length + payload_length
    if total > max_bytes:
        raise EventTooLargeError(f"Event {header['type']!r} of {total} bytes is over the limit of {max_bytes} bytes")
    if data_length:
        raw = await _read_exactly(reader, data_length, "data")
        try:
            extra = json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise ProtocolError(f"Event data is not JSON: {_short(err)}") from None
        if not isinstance(extra, dict):
            raise ProtocolError("Event data must be a JSON object")
        data = {**data, **extra}
    payload = await _read_exactly(reader, payload_length, "payload") if payload_length else None
    return Event(type=header["type"], data=data, payload=payload)


async def _read_line(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    pieces: list[bytes] = []
    size = 0
    while True:
        try:
            piece = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as err:
            if not err.partial and not pieces:
                return None
            raise ProtocolError("Connection closed inside an event header") from None
        except asyncio.LimitOverrunError as err:
            # The line is longer than the stream's buffer: take what is buffered and go on.
            if size + err.consumed > max_bytes:
                raise EventTooLargeError(f"Event header line longer than the limit of {max_bytes} bytes") from None
            piece = await reader.readexactly(err.consumed)
            pieces.append(piece)
            size += len(piece)
            continue
        size += len(piece)
        if size > max_bytes:
            raise EventTooLargeError(f"Event header line longer than the limit of {max_bytes} bytes")
        pieces.append(piece)
        return b"".join(pieces)


async def _read_exactly(reader: asyncio.StreamReader, n: int, what: str) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as err:
        raise ProtocolError(f"Connection closed after {len(err.partial)} of {n} {what} bytes") from None


def _length(header: dict[str, object], key: str) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ProtocolError(f"Event {key!r} must be a non-negative integer, not {_short(value)}")
    return value


def _short(value: object, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _text_of(event: Event) -> str:
    text = event.data.get("text")
    if not isinstance(text, str):
        raise ProtocolError(f"{event.type} needs a string 'text', not {_short(text)}")
    return clean_client_text(text)


def _voice_of(event: Event) -> SynthesizeVoice | None:
    """The request's voice; Synthesize.from_event would crash on a voice of the wrong type."""
    voice = event.data.get("voice")
    if voice is None or voice == {}:
        return None
    if not isinstance(voice, dict):
        raise ProtocolError(f"{event.type}: 'voice' must be an object, not {_short(voice)}")
    for key in ("name", "language", "speaker"):
        if voice.get(key) is not None and not isinstance(voice[key], str):
            raise ProtocolError(f"{event.type}: voice {key!r} must be a string, not {_short(voice[key])}")
    return SynthesizeVoice.from_dict(voice)


class _Exchange:
    """One request: sentences in order in, one audio-start ... audio-stop out."""

    def __init__(self, voice: VoiceChoice, streaming: bool, max_sentence_chars: int) -> None:
        self.voice = voice
        self.streaming = streaming
        self.pieces: asyncio.Queue[str | None] = asyncio.Queue()
        self.cancel = threading.Event()
        self.splitter = SentenceSplitter(max_sentence_chars)
        self.chars = 0
        self.started_at = time.monotonic()
        self.task: asyncio.Task[None] | None = None


class Qwen3TTSEventHandler(AsyncEventHandler):
    """Answers one client connection."""

    def __init__(
        self,
        service: TtsService,
        config: HandlerConfig,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        super().__init__(reader, writer)
        self.service = service
        self.config = config
        self._stream: _Exchange | None = None  # the text stream between synthesize-start and -stop
        self._exchanges: list[_Exchange] = []  # not yet finished, in order
        self._closed = False
        self._draining = False
        self._quiet_since = time.monotonic()  # last event, or end of the last answer

    async def run(self) -> None:
        """Read events (bounded, see read_event) until the client leaves or an error ends it."""
        self._is_running = True
        refused = self.service.admit(self)
        try:
            if refused is not None:
                _LOGGER.warning("Refusing a connection: %s", refused)
                await self._fail(refused, linger=True)
                return
            while self._is_running and not self._closed:
                try:
                    event = await self._next_event()
                except Qwen3TTSError as err:
                    await self._fail(err, linger=True)
                    break
                except (ConnectionError, OSError) as err:
                    _LOGGER.debug("Connection error while reading: %s", err)
                    break
                if event is None:
                    break
                if not await self.handle_event(event):
                    break
        finally:
            await self.disconnect()
            self.writer.close()
            self.service.release(self)

    def _speaking(self) -> bool:
        """Whether a request of this client is being answered (not just an open text stream)."""
        return any(e is not self._stream for e in self._exchanges)

    async def _next_event(self) -> Event | None:
        """The next event; a client silent for idle_timeout while nothing is spoken is closed."""
        read = asyncio.ensure_future(read_event(self.reader, self.config.max_event_bytes))
        try:
            while True:
                if self._speaking():
                    timeout = self.config.idle_timeout  # only a re-check: answers take their time
                else:
                    timeout = self._quiet_since + self.config.idle_timeout - time.monotonic()
                done, _ = await asyncio.wait({read}, timeout=max(timeout, 0))
                if done:
                    self._quiet_since = time.monotonic()
                    return read.result()
                if not self._speaking() and time.monotonic() - self._quiet_since >= self.config.idle_timeout:
                    waiting_for = "the text of its stream" if self._stream is not None else "a request"
                    raise IdleTimeoutError(f"No event for {self.config.idle_timeout:g} s while waiting for {waiting_for}")
        finally:
            if not read.done():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._dispatch(event)
        except Qwen3TTSError as err:
            await self._fail(err, linger=True)
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # malformed data
            await self._fail(ProtocolError(f"Malformed {event.type} event: {_short(err)}"), linger=True)
        except Exception as err:  # a bug must still end the exchange for the client
            _LOGGER.exception("Failed to handle %s", event.type)
            await self._fail(Qwen3TTSError(f"Internal error handling {event.type}: {_short(err)}"), linger=True)
        return False

    async def _dispatch(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.service.info().event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif Synthesize.is_type(event.type):
            if self._stream is not None:
                # Home Assistant repeats the whole text inside a stream for old servers.
                _LOGGER.debug("Ignoring back-compatible synthesize inside a text stream")
                return True
            text = _text_of(event)
            self._check_length(len(text))
            exchange = self._begin(self.service.catalog.resolve(_voice_of(event)), streaming=False)
            exchange.chars = len(text)
            for sentence in split_sentences(text, self.config.max_sentence_chars):
                exchange.pieces.put_nowait(sentence)
            exchange.pieces.put_nowait(None)
        elif SynthesizeStart.is_type(event.type):
            if self._stream is not None:
                raise ProtocolError("synthesize-start while a text stream is already open")
            self._stream = self._begin(self.service.catalog.resolve(_voice_of(event)), streaming=True)
        elif SynthesizeChunk.is_type(event.type):
            if self._stream is None:
                raise ProtocolError("synthesize-chunk without synthesize-start")
            text = _text_of(event)
            self._stream.chars += len(text)
            self._check_length(self._stream.chars)
            for sentence in self._stream.splitter.feed(text):
                self._stream.pieces.put_nowait(sentence)
        elif SynthesizeStop.is_type(event.type):
            if self._stream is None:
                raise ProtocolError("synthesize-stop without synthesize-start")
            for sentence in self._stream.splitter.finish():
                self._stream.pieces.put_nowait(sentence)
            self._stream.pieces.put_nowait(None)
            self._stream = None
            self._close_if_drained()
        else:
            # Unknown events (select-program, ...) are ignored, as the protocol asks.
            _LOGGER.debug("Ignoring event %s", event.type)
        return True

    def _check_length(self, chars: int) -> None:
        if chars > self.config.max_text_chars:
            raise TextTooLongError(f"Text has {chars} characters, more than the limit of {self.config.max_text_chars}")

    def _begin(self, voice: VoiceChoice, streaming: bool) -> _Exchange:
        if self._draining:
            raise ShuttingDownError("The server is shutting down and takes no new requests")
        exchange = _Exchange(voice, streaming, self.config.max_sentence_chars)
        previous = self._exchanges[-1].task if self._exchanges else None
        self._exchanges.append(exchange)
        exchange.task = asyncio.create_task(self._speak(exchange, previous), name="qwen3tts exchange")
        self.service.track(exchange.task)
        return exchange

    async def _speak(self, exchange: _Exchange, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            # Requests pipelined on one connection are answered in order.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await previous
        started = False
        audio_bytes = 0
        first_audio: float | None = None
        busy = 0.0  # seconds spent synthesizing, for the real-time factor
        try:
            while (sentence := await exchange.pieces.get()) is not None:
                request = SynthesisRequest(
                    text=sentence,
                    speaker=exchange.voice.speaker,
                    language=exchange.voice.language,
                    instruct=exchange.voice.instruct,
                    seed=self.config.seed,
                )
                _LOGGER.debug("Speaking %r with %s", sentence, exchange.voice)
                piece_start = time.monotonic()
                async with contextlib.aclosing(self.service.synthesize(request, exchange.cancel)) as chunks:
                    async for chunk in chunks:
                        if not started:
                            await self._send(AudioStart(rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS).event())
                            started = True
                            first_audio = time.monotonic()
                        await self._send(
                            WyomingAudioChunk(
                                rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS, audio=chunk.pcm
                            ).event()
                        )
                        audio_bytes += len(chunk.pcm)
                busy += time.monotonic() - piece_start
            if not started:  # nothing to say: still a well-formed, empty answer
                await self._send(AudioStart(rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS).event())
            await self._send(AudioStop().event())
            if exchange.streaming:
                await self._send(SynthesizeStopped().event())
        except Qwen3TTSError as err:
            await self._fail(err)
            return
        except _ClientGone as err:
            exchange.cancel.set()
            _LOGGER.info("Client gone during synthesis with %s: %s", exchange.voice.voice, err)
            return
        except Exception as err:  # an engine bug must still end the exchange for the client
            _LOGGER.exception("Synthesis failed")
            await self._fail(Qwen3TTSError(f"Synthesis failed: {err}"))
            return
        finally:
            with contextlib.suppress(ValueError):
                self._exchanges.remove(exchange)
            self._quiet_since = time.monotonic()
            self._close_if_drained()
        seconds = audio_bytes / (SAMPLE_RATE * SAMPLE_WIDTH * CHANNELS)
        _LOGGER.info(
            "Spoke voice=%s chars=%d audio=%.2fs first_audio=%s rtf=%s%s",
            exchange.voice.voice,
            exchange.chars,
            seconds,
            f"{first_audio - exchange.started_at:.3f}s" if first_audio is not None else "-",
            f"{busy / seconds:.3f}" if seconds else "-",
            " (stream)" if exchange.streaming else "",
        )

    async def _send(self, event: Event) -> None:
        if self._closed:
            raise _ClientGone("connection closed")
        try:
            await asyncio.wait_for(self.write_event(event), self.config.write_timeout)
        except asyncio.TimeoutError:
            # A client that stopped reading: its socket buffers are full.
            self.writer.transport.abort()
            raise _ClientGone(f"client accepted no audio for {self.config.write_timeout:g} s") from None
        except (ConnectionError, RuntimeError) as err:  # RuntimeError: the transport is closed
            raise _ClientGone(str(err) or type(err).__name__) from err

    async def _fail(self, err: Qwen3TTSError, linger: bool = False) -> None:
        """Send an error event, log it and close the connection (clients ignore errors).

        With `linger` (only from the reading loop, which owns the reader) the connection is
        half-closed and what the client still sends is read and dropped for a moment (at most
        max_event_bytes, one second), so it reads the error instead of a connection reset.
        """
        if self._closed:
            return
        self._closed = True
        _LOGGER.warning("Ending connection with error %s: %s", err.code, err)
        self._cancel_all()
        with contextlib.suppress(ConnectionError, RuntimeError, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self.write_event(Error(text=str(err), code=err.code).event()), 5)
        if linger:
            with contextlib.suppress(ConnectionError, RuntimeError, OSError, asyncio.TimeoutError):
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                await asyncio.wait_for(self._discard_input(self.config.max_event_bytes), 1.0)
        self.writer.close()
        self.reader.feed_eof()  # ends run() even while it waits for the next event

    async def _discard_input(self, limit: int) -> None:
        dropped = 0
        while dropped <= limit and (data := await self.reader.read(65536)):
            dropped += len(data)

    # -- draining on SIGTERM (TtsService.drain) ---------------------------------------------
    def begin_drain(self) -> None:
        """Finish what this connection asked for, take nothing new, then close."""
        self._draining = True
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self._draining and not self._closed and not self._exchanges and self._stream is None:
            self._closed = True
            self.writer.close()
            self.reader.feed_eof()

    async def abort(self, err: Qwen3TTSError) -> None:
        """Cancel this connection's requests with an error (draining took too long)."""
        await self._fail(err)

    def _cancel_all(self) -> None:
        current = asyncio.current_task()
        for exchange in list(self._exchanges):
            exchange.cancel.set()
            if exchange.task is not None and exchange.task is not current:
                exchange.task.cancel()
        self._stream = None

    async def disconnect(self) -> None:
        """The client closed the connection: stop its work within one frame group."""
        pending = [e for e in self._exchanges if e.task is not None and not e.task.done()]
        if pending:
            _LOGGER.info("Client disconnected; cancelling %d request(s)", len(pending))
        self._cancel_all()
