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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from wyoming.audio import AudioChunk as WyomingAudioChunk
from wyoming.audio import AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from .engine import CHANNELS, SAMPLE_RATE, SAMPLE_WIDTH, SamplingParams, SynthesisRequest
from .errors import Qwen3TTSError, TextTooLongError
from .sentences import SentenceSplitter, split_sentences
from .server import TtsService
from .voices import VoiceChoice

_LOGGER = logging.getLogger(__name__)


class _ClientGone(Exception):
    """Writing to the client failed: it closed the connection."""


class ProtocolError(Qwen3TTSError):
    """An event that is malformed or not allowed at this point of the exchange."""

    code = "bad-request"


@dataclass(frozen=True)
class HandlerConfig:
    """The per-request settings every handler shares."""

    max_text_chars: int = 5000
    max_sentence_chars: int = 400
    seed: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)


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

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._dispatch(event)
        except Qwen3TTSError as err:
            await self._fail(err)
        except (KeyError, TypeError, ValueError) as err:  # from_event on malformed data
            await self._fail(ProtocolError(f"Malformed {event.type} event: {err!r}"))
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
            synthesize = Synthesize.from_event(event)
            self._check_length(len(synthesize.text))
            exchange = self._begin(self.service.catalog.resolve(synthesize.voice), streaming=False)
            exchange.chars = len(synthesize.text)
            for sentence in split_sentences(synthesize.text, self.config.max_sentence_chars):
                exchange.pieces.put_nowait(sentence)
            exchange.pieces.put_nowait(None)
        elif SynthesizeStart.is_type(event.type):
            if self._stream is not None:
                raise ProtocolError("synthesize-start while a text stream is already open")
            start = SynthesizeStart.from_event(event)
            self._stream = self._begin(self.service.catalog.resolve(start.voice), streaming=True)
        elif SynthesizeChunk.is_type(event.type):
            if self._stream is None:
                raise ProtocolError("synthesize-chunk without synthesize-start")
            text = SynthesizeChunk.from_event(event).text
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
        else:
            # Unknown events (select-program, ...) are ignored, as the protocol asks.
            _LOGGER.debug("Ignoring event %s", event.type)
        return True

    def _check_length(self, chars: int) -> None:
        if chars > self.config.max_text_chars:
            raise TextTooLongError(f"Text has {chars} characters, more than the limit of {self.config.max_text_chars}")

    def _begin(self, voice: VoiceChoice, streaming: bool) -> _Exchange:
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
                    sampling=self.config.sampling,
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
        try:
            await self.write_event(event)
        except (ConnectionError, RuntimeError) as err:  # RuntimeError: the transport is closed
            raise _ClientGone(str(err) or type(err).__name__) from err

    async def _fail(self, err: Qwen3TTSError) -> None:
        """Send an error event, log it and close the connection (clients ignore errors)."""
        if self._closed:
            return
        self._closed = True
        _LOGGER.warning("Ending connection with error %s: %s", err.code, err)
        self._cancel_all()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.write_event(Error(text=str(err), code=err.code).event())
        self.writer.close()
        self.reader.feed_eof()  # ends run() even while it waits for the next event

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
