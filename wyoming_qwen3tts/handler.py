"""The Wyoming event handler: one client connection, from its events to its answers.

The reading loop (run) only does protocol bookkeeping and returns to reading at once: describe
and ping are answered, each synthesis request ("exchange") is queued.  One worker task per
connection speaks the queued exchanges in order: it takes sentences, hands them to the shared
TtsService (which runs the engine on its worker thread) and writes audio events as frame groups
are decoded.  So the connection keeps reading while audio is produced: a disconnect is seen at
once and cancels the work, and describe is answered during a synthesis.

Every exchange is answered with exactly one audio-start and one audio-stop (plus
synthesize-stopped for a stream), whatever the number of sentences: Home Assistant builds its
WAV header from the first audio-start, and wyoming-bench's one-shot mode stops reading at the
first audio-stop.  A sentence with nothing to say is skipped, and a request with nothing to say
gets that empty answer.  Home Assistant ignores error events and has no timeout, so an error is
sent, logged and followed by closing the connection.

Client input is never trusted, and no client can hold the server (docs/reliability.md): events
are read by the bounded reader of wire.py, every malformed or out-of-order event ends the
connection with an error event, text is cleaned of control characters and unpaired surrogates
and split in linear time (off the event loop when it is long), one connection has at most
max_pending_requests exchanges, every write (describe answers too) drops a client that does not
take it within write_timeout, and closing a connection cancels all of its work at once.  No
client field is ever used as a file path: voices are looked up by name in memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from wyoming.audio import AudioChunk as WyomingAudioChunk
from wyoming.audio import AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from . import speech
from .errors import (
    IdleTimeoutError,
    ProtocolError,
    Qwen3TTSError,
    ShuttingDownError,
    TooManyRequestsError,
)
from .metrics import METRICS, SpeechMeter
from .options import TextOptions
from .request import CHANNELS, SAMPLE_RATE, SAMPLE_WIDTH
from .service import TtsService
from .speech import TextStream
from .text.stream import Sentence
from .voices import VoiceChoice
from .wire import event_bytes, read_event, short

_LOGGER = logging.getLogger(__name__)

# JSON (an event's header line and data block) is parsed on the event loop, where 1 MiB of it can
# take 50 ms: an event's JSON is held to what the longest text needs, escaped (at most 12 bytes a
# character, as a surrogate pair), plus room for the rest.
JSON_BYTES_BASE = 65536
JSON_BYTES_PER_CHAR = 12
# How long the error event that ends a connection may take to reach the client.
ERROR_WRITE_SECONDS = 2.0
# On shutdown after drain_seconds: how long the last error event may take, all connections at once.
ABORT_WRITE_SECONDS = 0.25
# After a protocol error the client's input is read and dropped this long (and at most
# max_event_bytes), so it reads the error rather than a connection reset.
LINGER_SECONDS = 1.0


class _ClientGone(Exception):
    """The client cannot be written to: it closed the connection, or stopped reading (stuck)."""

    def __init__(self, reason: str, *, stuck: bool = False) -> None:
        super().__init__(reason)
        self.stuck = stuck


@dataclass(frozen=True)
class HandlerConfig:
    """The per-request settings every handler shares."""

    max_text_chars: int = TextOptions.max_text_chars
    max_sentence_chars: int = TextOptions.max_sentence_chars
    text_frontend: bool = TextOptions.text_frontend
    seed: int | None = TextOptions.seed
    max_event_bytes: int = 1_048_576
    idle_timeout: float = 120.0
    write_timeout: float = 60.0
    max_pending_requests: int = 8

    @property
    def text(self) -> TextOptions:
        return TextOptions(self.max_text_chars, self.max_sentence_chars, self.text_frontend, self.seed)


class _ConnectionLog(logging.LoggerAdapter[logging.Logger]):
    """Log lines of one connection, each starting with the client's address."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        assert self.extra is not None  # made with extra={"peer": ...}
        return f"{self.extra['peer']}: {msg}", kwargs


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "local client"


def _text_of(event: Event) -> str:
    text = event.data.get("text")
    if not isinstance(text, str):
        raise ProtocolError(f"{event.type} needs a string 'text', not {short(text)}")
    return text


def _voice_of(event: Event) -> SynthesizeVoice | None:
    """The request's voice; Synthesize.from_event would crash on a voice of the wrong type."""
    voice = event.data.get("voice")
    if voice is None or voice == {}:
        return None
    if not isinstance(voice, dict):
        raise ProtocolError(f"{event.type}: 'voice' must be an object, not {short(voice)}")
    for key in ("name", "language", "speaker"):
        if voice.get(key) is not None and not isinstance(voice[key], str):
            raise ProtocolError(f"{event.type}: voice {key!r} must be a string, not {short(voice[key])}")
    return SynthesizeVoice.from_dict(voice)


class _Exchange:
    """One request: sentences in order in, one audio-start ... audio-stop out."""

    def __init__(self, voice: VoiceChoice, streaming: bool, config: HandlerConfig) -> None:
        self.voice = voice
        self.streaming = streaming
        self.pieces: asyncio.Queue[Sentence | None] = asyncio.Queue()  # None ends the text
        self.cancel = threading.Event()
        # Streamed text: the front end keeps what it cannot decide yet until more arrives.
        self.text = TextStream(voice.language, config.text)
        self.chars = 0
        self.started_at = time.monotonic()

    async def sentences(self) -> AsyncIterator[Sentence]:
        while (sentence := await self.pieces.get()) is not None:
            yield sentence


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
        self.log = _ConnectionLog(_LOGGER, {"peer": _peer_name(writer)})
        self._pending: collections.deque[_Exchange] = collections.deque()  # accepted, unfinished, in order
        self._stream: _Exchange | None = None  # the pending exchange whose text is still arriving
        self._worker: asyncio.Task[None] | None = None  # speaks _pending; ends when it is empty
        self._reading: asyncio.Task[None] | None = None  # run()
        self._closed = False
        self._draining = False
        self._quiet_since = time.monotonic()  # last event, or end of the last answer

    # -- the connection ---------------------------------------------------------------------
    async def run(self) -> None:
        """Read events (bounded, see wire.read_event) until the client leaves or an error ends it."""
        self._reading = asyncio.current_task()
        refused = self.service.admit(self)
        try:
            if refused is not None:
                await self._end(refused, linger=True)
            else:
                await self._read_events()
            self._cancel_all()
            await self._close_within(self.config.write_timeout)
        except Exception:  # a bug: log it here, not as an unretrieved task exception
            self.log.exception("Connection failed")
        finally:
            self._cancel_all()
            self.writer.transport.abort()  # no-op once closed; drops what a vanished client left unread
            if refused is None:
                self.service.release(self)

    async def _read_events(self) -> None:
        while not self._closed:
            try:
                event = await self._next_event()
            except Qwen3TTSError as err:
                await self._end(err, linger=True)
                return
            except (ConnectionError, OSError) as err:
                self.log.debug("Connection lost while reading: %s", err)
                break
            if event is None or self._closed:
                break
            if not await self.handle_event(event):
                return
            # Other connections run between this client's events, however many it has sent.
            await asyncio.sleep(0)
        if self._pending and not self._closed:
            self.log.info("Client disconnected; cancelling %d request(s)", len(self._pending))

    def _speaking(self) -> bool:
        """Whether a request of this client is being answered (not just an open text stream)."""
        return any(e is not self._stream for e in self._pending)

    async def _next_event(self) -> Event | None:
        """The next event; a client silent for idle_timeout while nothing is spoken is closed."""
        max_json = JSON_BYTES_BASE + JSON_BYTES_PER_CHAR * self.config.max_text_chars
        read = asyncio.ensure_future(read_event(self.reader, self.config.max_event_bytes, max_json))
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
                    raise IdleTimeoutError(
                        f"No event for {self.config.idle_timeout:g} s while waiting for {waiting_for}"
                    )
        finally:
            if not read.done():
                read.cancel()
                with contextlib.suppress(BaseException):
                    await read

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._dispatch(event)
        except _ClientGone as err:
            self._drop(err)
        except Qwen3TTSError as err:
            await self._end(err, linger=True)
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # malformed data
            await self._end(ProtocolError(f"Malformed {event.type} event: {short(err)}"), linger=True)
        except Exception as err:  # a bug must still end the exchange for the client
            self.log.exception("Failed to handle %s", event.type)
            await self._end(
                Qwen3TTSError(f"Internal error handling {event.type}: {short(err)}"), linger=True, logged=True
            )
        return False

    async def _dispatch(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.service.info_event()[1])
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif Synthesize.is_type(event.type):
            if self._stream is not None:
                # Home Assistant repeats the whole text inside a stream for old servers.
                self.log.debug("Ignoring back-compatible synthesize inside a text stream")
                return True
            text = _text_of(event)
            speech.check_length(len(text), self.config.text)
            exchange = self._begin(self.service.catalog.resolve(_voice_of(event)), streaming=False)
            exchange.chars = len(text)
            for sentence in await speech.prepare(text, exchange.voice.language, self.config.text):
                exchange.pieces.put_nowait(sentence)
            exchange.pieces.put_nowait(None)
        elif SynthesizeStart.is_type(event.type):
            if self._stream is not None:
                raise ProtocolError("synthesize-start while a text stream is already open")
            self._stream = self._begin(self.service.catalog.resolve(_voice_of(event)), streaming=True)
        elif SynthesizeChunk.is_type(event.type):
            stream = self._stream
            if stream is None:
                raise ProtocolError("synthesize-chunk without synthesize-start")
            text = _text_of(event)
            for sentence in await stream.text.feed(text):
                stream.pieces.put_nowait(sentence)
            stream.chars = stream.text.chars
        elif SynthesizeStop.is_type(event.type):
            stream = self._stream
            if stream is None:
                raise ProtocolError("synthesize-stop without synthesize-start")
            for sentence in stream.text.finish():  # at most a sentence is left
                stream.pieces.put_nowait(sentence)
            stream.pieces.put_nowait(None)
            self._stream = None
        else:
            # Unknown events (select-program, ...) are ignored, as the protocol asks.
            self.log.debug("Ignoring event %s", event.type)
        return True

    # -- speaking: one worker per connection, exchanges in order ------------------------------
    def _begin(self, voice: VoiceChoice, streaming: bool) -> _Exchange:
        if self._draining:
            raise ShuttingDownError("The server is shutting down and takes no new requests")
        if len(self._pending) >= self.config.max_pending_requests:
            raise TooManyRequestsError(
                f"More than {self.config.max_pending_requests} requests waiting on one connection"
            )
        exchange = _Exchange(voice, streaming, self.config)
        self._pending.append(exchange)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._speak_pending(), name="qwen3tts speaker")
            self._worker.add_done_callback(self._worker_done)
            self.service.track(self._worker)
        return exchange

    async def _speak_pending(self) -> None:
        while self._pending and not self._closed:
            exchange = self._pending[0]
            try:
                await self._speak(exchange)
            finally:
                if self._pending and self._pending[0] is exchange:
                    self._pending.popleft()
                self._quiet_since = time.monotonic()
        self._close_if_drained()

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (err := task.exception()) is not None:  # _speak catches all: a bug
            self.log.error("Speaking failed", exc_info=err)

    async def _speak(self, exchange: _Exchange) -> None:
        # Counted into the same series as the HTTP API's (metrics.py); "cancelled" if the task is.
        meter = METRICS.speech("wyoming", started_at=exchange.started_at)
        try:
            await self._speak_measured(exchange, meter)
        finally:
            meter.finish("cancelled")  # a no-op once _speak_measured has counted its outcome

    async def _speak_measured(self, exchange: _Exchange, meter: SpeechMeter) -> None:
        started = False
        chunks = speech.speak(
            self.service,
            exchange.voice,
            exchange.sentences(),
            exchange.cancel,
            meter,
            seed=self.config.seed,
            log=self.log,
        )
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    first = not started
                    if first:
                        await self.write_event(
                            AudioStart(rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS).event()
                        )
                        started = True
                    await self.write_event(
                        WyomingAudioChunk(
                            rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS, audio=chunk.pcm
                        ).event()
                    )
                    if first and chunk.made_at and self.log.isEnabledFor(logging.DEBUG):
                        # With the engine's own first-chunk line: the time a request spends outside the engine.
                        now = time.monotonic()
                        self.log.debug(
                            "First audio written %.1f ms after the request was read, %.1f ms after the engine made it",
                            (now - exchange.started_at) * 1000,
                            (now - chunk.made_at) * 1000,
                        )
                    meter.audio(chunk.num_frames)
            if not started:  # nothing to say: still a well-formed, empty answer
                await self.write_event(AudioStart(rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS).event())
            await self.write_event(AudioStop().event())
            if exchange.streaming:
                await self.write_event(SynthesizeStopped().event())
        except _ClientGone as err:
            meter.finish("client-gone")
            self._drop(err)
            return
        except Qwen3TTSError as err:
            meter.finish(err.code)
            await self._end(err)
            return
        except Exception as err:  # an engine bug must still end the exchange for the client
            meter.finish("error")
            self.log.exception("Synthesis failed")
            await self._end(Qwen3TTSError(f"Synthesis failed: {err}"), logged=True)
            return
        meter.finish("ok")
        speech.log_spoken(self.log, exchange.voice, exchange.chars, meter, " (stream)" if exchange.streaming else "")

    # -- writing, and ending the connection ---------------------------------------------------
    async def write_event(self, event: Event) -> None:
        """Send an event; a client that does not take it within write_timeout is dropped.

        Every answer goes through here (describe too), so a client that writes and never reads
        holds up only itself, and only for write_timeout.
        """
        if self._closed:
            raise _ClientGone("the connection is closed")
        await self._write(event, self.config.write_timeout)

    async def _write(self, event: Event, timeout: float) -> None:
        transport = self.writer.transport
        if transport.is_closing():
            raise _ClientGone("the connection is closed")
        try:
            self.writer.write(event_bytes(event))
            if not transport.get_write_buffer_size():
                return  # the socket took it all: nothing to wait for (and no timer to arm, each chunk of a burst)
            async with asyncio.timeout(timeout):
                await self.writer.drain()
        except TimeoutError:
            self.writer.transport.abort()
            raise _ClientGone(f"the client took no data for {timeout:g} s", stuck=True) from None
        except (ConnectionError, RuntimeError, OSError) as err:  # RuntimeError: the transport is closed
            raise _ClientGone(str(err) or type(err).__name__) from err

    def _drop(self, reason: _ClientGone) -> None:
        """The client is gone or stuck: cancel its work and close, without a word."""
        if self._closed:
            return
        level = logging.INFO if reason.stuck or self._pending else logging.DEBUG  # leaving is no news
        self.log.log(level, "Dropping the connection (%d request(s) cancelled): %s", len(self._pending), reason)
        self._closed = True
        self._cancel_all()
        self.writer.transport.abort()  # also ends the reading loop

    async def _end(self, err: Qwen3TTSError, *, linger: bool = False, logged: bool = False) -> None:
        """Send an error event, log it and close the connection (clients ignore errors).

        With `linger` (only from the reading loop, which owns the reader) the connection is
        half-closed and what the client still sends is read and dropped for a moment (at most
        max_event_bytes, LINGER_SECONDS), so it reads the error instead of a connection reset.
        """
        if self._closed:
            return
        self._closed = True
        if not logged:
            self.log.log(err.log_level, "Ending the connection with error %s: %s", err.code, err)
        self._cancel_all()
        with contextlib.suppress(_ClientGone):
            await self._write(
                Error(text=str(err), code=err.code).event(), min(self.config.write_timeout, ERROR_WRITE_SECONDS)
            )
        if linger and not self.writer.transport.is_closing():
            with contextlib.suppress(ConnectionError, RuntimeError, OSError):  # TimeoutError is an OSError
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                async with asyncio.timeout(LINGER_SECONDS):
                    await self._discard_input(self.config.max_event_bytes)
        self.writer.close()  # stops reading; what was written still goes out (see _close_within)
        self.reader.feed_eof()  # ends run() even while it waits for the next event

    async def _discard_input(self, limit: int) -> None:
        dropped = 0
        while dropped <= limit and (data := await self.reader.read(65536)):
            dropped += len(data)

    async def _close_within(self, seconds: float) -> None:
        """Close once everything written has reached the client; drop it after `seconds`."""
        self.writer.close()
        try:
            async with asyncio.timeout(seconds):
                await self.writer.wait_closed()
        except OSError:  # a reset, or the timeout (TimeoutError is an OSError)
            self.writer.transport.abort()

    def _cancel_all(self) -> None:
        """Stop all of this connection's work at once: each exchange's engine job, and the worker."""
        for exchange in self._pending:
            exchange.cancel.set()
        self._pending.clear()
        self._stream = None
        worker = self._worker
        if worker is not None and worker is not asyncio.current_task():
            worker.cancel()

    # -- draining and aborting on SIGTERM (TtsService.drain) --------------------------------
    def begin_drain(self) -> None:
        """Finish what this connection asked for, take nothing new, then close."""
        self._draining = True
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self._draining and not self._closed and not self._pending:
            self._closed = True
            self.writer.close()
            self.reader.feed_eof()

    async def abort(self, err: Qwen3TTSError) -> None:
        """Cancel this connection's work, send `err` and drop the connection, all within
        ABORT_WRITE_SECONDS (TtsService aborts every connection at once)."""
        try:
            async with asyncio.timeout(ABORT_WRITE_SECONDS):
                if not self._closed:
                    self._closed = True
                    if self._pending:
                        self.log.info("Cancelling %d request(s): %s", len(self._pending), err)
                    self._cancel_all()
                    if not self.writer.transport.is_closing():
                        self.writer.write(event_bytes(Error(text=str(err), code=err.code).event()))
                        await self.writer.drain()
                self.writer.close()
                await self.writer.wait_closed()
        except (OSError, RuntimeError):  # the timeout (an OSError), a reset, a closed transport
            pass
        self.writer.transport.abort()  # no-op once closed
        if self._reading is not None and self._reading is not asyncio.current_task():
            self._reading.cancel()

    async def disconnect(self) -> None:
        """The library's hook when a connection ends: stop its work within one frame group."""
        self._cancel_all()
