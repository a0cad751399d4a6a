"""The shared synthesis service: loads the engine in the background and runs every synthesis on
one worker thread, first come first served across all connections.

The worker thread is a one-thread executor: the model load is its first job, so a synthesis that
arrives early simply queues behind the load, and requests from different clients run in the order
they were submitted.  Handlers submit one sentence at a time, so two long requests interleave
sentence by sentence instead of one waiting for the other to finish.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from wyoming.info import Info, TtsProgram

from . import __version__
from .engine import AudioChunk, Engine, SynthesisRequest
from .errors import ModelLoadError, SynthesisCancelled
from .voices import ATTRIBUTION, DEFAULT_LANGUAGES, SPEAKER_DESCRIPTIONS, VoiceCatalog, VoicePreset

_LOGGER = logging.getLogger(__name__)
PROGRAM_NAME = "qwen3-tts"

_END = object()


class TtsService:
    """One engine shared by every connection, plus what describe answers with."""

    def __init__(
        self,
        load_engine: Callable[[], Engine],
        presets: list[VoicePreset],
        *,
        streaming: bool = True,
        default_voice: str = "",
    ) -> None:
        self._load_engine = load_engine
        self._presets = presets
        self._default_voice = default_voice
        self.streaming = streaming
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen3tts-engine")
        self._engine: Engine | None = None
        self._load_error: BaseException | None = None
        self.loaded: asyncio.Future[Engine] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # exchanges being answered, all connections
        # Until the model is loaded, describe answers with the speakers every released
        # CustomVoice checkpoint has, so Home Assistant can be set up while weights download.
        self.catalog = VoiceCatalog(
            list(SPEAKER_DESCRIPTIONS),
            DEFAULT_LANGUAGES,
            presets,
            default_voice=default_voice,
            version=__version__,
        )

    def start_loading(self) -> asyncio.Future[Engine]:
        """Queue the model load as the worker's first job; returns a future for the engine."""
        loop = asyncio.get_running_loop()
        self.loaded = loop.run_in_executor(self._executor, self._load)
        self.loaded.add_done_callback(self._on_loaded)
        return self.loaded

    def _load(self) -> Engine:
        try:
            self._engine = self._load_engine()
        except BaseException as err:
            self._load_error = err
            raise
        return self._engine

    def _on_loaded(self, future: asyncio.Future[Engine]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        engine = future.result()
        try:
            self.catalog = VoiceCatalog(
                engine.speakers,
                engine.languages,
                self._presets,
                supports_instruct=engine.supports_instruct,
                default_voice=self._default_voice,
                version=__version__,
            )
        except Exception as err:  # the presets do not fit this model
            self._load_error = err
            _LOGGER.error("Voice presets do not fit the loaded model: %s", err)

    @property
    def load_error(self) -> BaseException | None:
        """Why the model (or the presets for it) could not be loaded, once that is known."""
        return self._load_error

    def info(self) -> Info:
        program = TtsProgram(
            name=PROGRAM_NAME,
            description="Qwen3-TTS CustomVoice",
            attribution=ATTRIBUTION,
            installed=True,
            version=__version__,
            voices=self.catalog.tts_voices(),
            supports_synthesize_streaming=self.streaming,
        )
        return Info(tts=[program])

    async def synthesize(self, request: SynthesisRequest, cancel: threading.Event) -> AsyncIterator[AudioChunk]:
        """Audio chunks of one request as the worker produces them.

        Stopping the iteration (or closing it) sets `cancel`, which stops the engine after the
        frame group it is working on.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()

        def job() -> None:
            # Runs on the worker thread, after every job submitted before it.
            if cancel.is_set():
                raise SynthesisCancelled("cancelled before it started")
            engine = self._engine
            if engine is None or self._load_error is not None:
                raise ModelLoadError(f"The model could not be loaded: {self._load_error}")
            chunks = engine.synthesize(request, cancel)
            try:
                for chunk in chunks:
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
                    if cancel.is_set():
                        break
            finally:
                close = getattr(chunks, "close", None)  # generators: stop the engine's loop now
                if close is not None:
                    close()

        future = loop.run_in_executor(self._executor, job)
        # The done callback is scheduled after every chunk the job queued, so _END comes last.
        future.add_done_callback(lambda _: queue.put_nowait(_END))
        try:
            while (item := await queue.get()) is not _END:
                assert isinstance(item, AudioChunk)
                yield item
            future.result()
        finally:
            if not future.done():
                cancel.set()

    def track(self, task: asyncio.Task[None]) -> None:
        """Remember a handler's exchange task until it ends (see wait_idle)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Wait for every exchange to finish (stdio://: input ended, the answers are still due)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
