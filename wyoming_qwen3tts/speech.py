"""One speech request's path, shared by both front ends (the Wyoming handler and the HTTP API).

- `prepare` (a whole text) and `TextStream` (text arriving in fragments, Wyoming's synthesize-chunk):
  clean the client's text, hold it to max_text_chars, split it into spoken sentences with the text
  front end, off the event loop when the text is long;
- `speak`: each sentence as a SynthesisRequest on the shared TtsService, in order; only a request's
  first sentence may be refused with queue-full, a sentence with nothing left to say is skipped, and
  the engine time is measured on the request's SpeechMeter;
- `log_spoken`: the one "Spoke ..." line per answered request.

What stays with each front end is its protocol: how a request arrives, how audio and errors are
written, and the connection's limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING

from .errors import EmptyTextError, TextTooLongError
from .options import TextOptions
from .request import SAMPLE_RATE, SAMPLES_PER_FRAME, AudioChunk, SynthesisRequest
from .text.sentences import StreamCleaner, clean_client_text
from .text.stream import OFFLOAD_CHARS, Sentence, SpokenSentences, spoken_sentences
from .voices import VoiceChoice
from .wire import short

if TYPE_CHECKING:
    from .metrics import SpeechMeter
    from .service import TtsService

_LOGGER = logging.getLogger(__name__)


def check_length(chars: int, options: TextOptions) -> None:
    if chars > options.max_text_chars:
        raise TextTooLongError(f"Text has {chars} characters, more than the limit of {options.max_text_chars}")


def _split(text: str, language: str, options: TextOptions) -> list[Sentence]:
    return spoken_sentences(
        clean_client_text(text), language, enabled=options.text_frontend, max_chars=options.max_sentence_chars
    )


async def prepare(text: str, language: str, options: TextOptions) -> list[Sentence]:
    """The sentences to speak of a whole text; TextTooLongError past max_text_chars."""
    check_length(len(text), options)
    if len(text) <= OFFLOAD_CHARS:
        return _split(text, language, options)
    return await asyncio.get_running_loop().run_in_executor(None, _split, text, language, options)


class TextStream:
    """A text that arrives in fragments cut anywhere: sentences come out as soon as they are complete.

    The text is cleaned as one (a control marker may be cut between two fragments) and held to
    max_text_chars as the fragments add up."""

    def __init__(self, language: str, options: TextOptions) -> None:
        self.options = options
        self.chars = 0
        self._cleaner = StreamCleaner()
        self._sentences = SpokenSentences(language, enabled=options.text_frontend, max_chars=options.max_sentence_chars)

    async def feed(self, fragment: str) -> list[Sentence]:
        self.chars += len(fragment)
        check_length(self.chars, self.options)
        if len(fragment) <= OFFLOAD_CHARS:
            return self._feed(fragment)
        return await asyncio.get_running_loop().run_in_executor(None, self._feed, fragment)

    def _feed(self, fragment: str) -> list[Sentence]:
        return self._sentences.feed(self._cleaner.feed(fragment))

    def finish(self) -> list[Sentence]:
        """What is left at the end of the text (at most a sentence)."""
        return self._sentences.feed(self._cleaner.finish()) + self._sentences.finish()


async def speak(
    service: TtsService,
    voice: VoiceChoice,
    sentences: AsyncIterable[Sentence],
    cancel: threading.Event,
    meter: SpeechMeter,
    *,
    seed: int | None,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger] = _LOGGER,
) -> AsyncGenerator[AudioChunk, None]:
    """The audio of every sentence in order, one sentence at a time on the service.

    Only the first sentence may find the queue full (QueueFullError); the rest of an answer always
    queues. Setting `cancel` (or closing the iteration) stops the engine after its current frame group."""
    admitted = False
    async for sentence in sentences:
        request = SynthesisRequest(
            text=sentence.spoken,
            speaker=voice.speaker,
            language=voice.language,
            instruct=voice.instruct,
            seed=seed,  # sampling: the engine's (generation_config.json and the settings) unless a seed is set
            clone=voice.clone,
        )
        if sentence.spoken != sentence.text:
            log.debug(
                "Speaking %r (written %r, read as %s) with %s", sentence.spoken, sentence.text, sentence.language, voice
            )
        else:
            log.debug("Speaking %r with %s", sentence.spoken, voice)
        started = time.monotonic()
        try:
            async with contextlib.aclosing(service.synthesize(request, cancel, continuing=admitted)) as chunks:
                async for chunk in chunks:
                    if chunk.stopped is not None:
                        meter.runaway_stop(chunk.stopped)
                    yield chunk
        except EmptyTextError:
            # Nothing left once the engine tokenized it: the sentence is skipped, the rest is spoken.
            log.debug("Skipped a sentence with nothing to say: %s", short(sentence.text))
        admitted = True
        meter.synthesized(time.monotonic() - started)


async def each(sentences: list[Sentence]) -> AsyncIterator[Sentence]:
    """A list of sentences as `speak` takes them."""
    for sentence in sentences:
        yield sentence


def log_spoken(
    log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    voice: VoiceChoice,
    chars: int,
    meter: SpeechMeter,
    detail: str = "",
) -> None:
    """The line every answered request leaves: voice, text length, audio length, time to first audio, real-time factor."""
    seconds = meter.frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    first = f"{meter.first_audio_at - meter.started_at:.3f}s" if meter.first_audio_at is not None else "-"
    rtf = f"{meter.busy / seconds:.3f}" if seconds else "-"
    log.info(
        "Spoke voice=%s chars=%d audio=%.2fs first_audio=%s rtf=%s%s", voice.voice, chars, seconds, first, rtf, detail
    )
