"""The shared synthesis service: loads the engine in the background and runs every synthesis on
one worker thread, first come first served across all connections (with max_streams > 1, on that
many threads, whose requests the batching backend decodes together).

The worker thread is a one-thread executor: the model load is its first job, so a synthesis that
arrives early simply queues behind the load, and requests from different clients run in the order
they were submitted.  Handlers submit one sentence at a time, so two long requests interleave
sentence by sentence instead of one waiting for the other to finish.  The queue is bounded: a new
request that finds max_queued_streams sentences already waiting for a worker is refused at once
(QueueFullError), while the later sentences of a request being answered always queue, so no answer
is cut short.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from wyoming.event import Event
from wyoming.info import Info, TtsProgram

from . import __version__
from .announcements import AnnouncementCache
from .request import AudioChunk, SynthesisRequest

if TYPE_CHECKING:  # torch and the engine load on the worker thread, after the server is listening
    from .engine_set import Speaker
    from .model.prompt import ClonePrompt
from .errors import (
    ModelLoadError,
    QueueFullError,
    Qwen3TTSError,
    ServerBusyError,
    ShuttingDownError,
    SynthesisCancelled,
    VoiceError,
)
from .model.config import MODEL_TYPE_NAMES
from .options import QUEUED_MIN, QUEUED_PER_STREAM
from .process import freeze_loaded, loading
from .voices import ATTRIBUTION, DEFAULT_LANGUAGES, SPEAKER_DESCRIPTIONS, VoiceCatalog, VoicePreset, language_name

_LOGGER = logging.getLogger(__name__)
PROGRAM_NAME = "qwen3-tts"

_END = object()
_T = TypeVar("_T")
# How long starting the synthesis threads ahead (TtsService._start_synthesis_threads) may hold up the load.
WARM_THREADS_SECONDS = 10.0


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Connection(Protocol):
    """What the service needs of a client connection (the handler), for limits and draining."""

    def begin_drain(self) -> None:
        """Take no new requests; close once those in progress are answered."""

    async def abort(self, err: Qwen3TTSError) -> None:
        """Cancel all work, tell the client `err` and drop the connection, in a bounded time."""


class TaskConnection:
    """A connection that is one request's asyncio task (an HTTP request): SIGTERM lets it finish while
    draining, and aborting cancels the task."""

    def __init__(self) -> None:
        self.task = asyncio.current_task()

    def begin_drain(self) -> None:
        pass  # the request in progress is finished; its reply then closes the keep-alive connection

    async def abort(self, err: Qwen3TTSError) -> None:
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()


class TtsService:
    """One engine shared by every connection, plus what describe answers with."""

    def __init__(
        self,
        load_engine: Callable[[], Speaker],
        presets: list[VoicePreset],
        *,
        streaming: bool = True,
        default_voice: str = "",
        max_connections: int = 64,
        workers: int = 1,
        max_queued_streams: int | None = None,
        announcements: AnnouncementCache | None = None,
    ) -> None:
        """workers: syntheses run at once (max_streams: the batching backend decodes them together);
        0: the engine's max_streams, known once it has loaded (until then requests queue behind the load
        and run one at a time); the model load and voice cloning stay on one thread of their own, first of all.
        max_queued_streams: sentences that may wait for a worker before a new request is refused
        (None: QUEUED_PER_STREAM per worker, at least QUEUED_MIN)."""
        self._load_engine = load_engine
        self.announcements = AnnouncementCache.disabled() if announcements is None else announcements
        self._presets = presets
        self._default_voice = default_voice
        self.streaming = streaming
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen3tts-engine")
        # More than one: syntheses get threads of their own, which wait for the load to end; they
        # start in the order they were submitted (the executor's queue) as threads come free.
        self._workers_from_engine = workers == 0
        self._synth_executor: ThreadPoolExecutor | None = None
        self._load_done = threading.Event()
        self._engine: Speaker | None = None
        self._load_error: BaseException | None = None
        self.loaded: asyncio.Future[Speaker] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # connections' speaking tasks (one each at most)
        self.max_connections = max_connections
        self._queued_setting = max_queued_streams
        self._set_workers(max(workers, 1))  # sets workers and max_queued_streams
        self.syntheses = 0  # sentences submitted and not finished: running, or waiting for a worker
        self.connections: set[Connection] = set()
        self._no_connections = asyncio.Event()
        self._no_connections.set()
        self._info: tuple[VoiceCatalog, Info, Event] | None = None
        self.draining = False  # SIGTERM: no new connections or requests, finish the ones in progress
        self.jobs_running = 0  # worker jobs (load or synthesis) submitted and not finished
        # Until the model is loaded, describe answers with the speakers every released
        # CustomVoice checkpoint has, so Home Assistant can be set up while weights download.
        self.catalog = VoiceCatalog(
            list(SPEAKER_DESCRIPTIONS),
            DEFAULT_LANGUAGES,
            presets,
            default_voice=default_voice,
            version=__version__,
            model_type=None,  # every configured voice, until the model says which kind it speaks
        )

    def start_loading(self) -> asyncio.Future[Speaker]:
        """Queue the model load as the worker's first job; returns a future for the engine."""
        loop = asyncio.get_running_loop()
        self.loaded = self._submit(loop, self._load)
        self.loaded.add_done_callback(self._on_loaded)
        return self.loaded

    def _set_workers(self, workers: int) -> None:
        """Syntheses run at once, and the queue limit that follows from them."""
        self.workers = workers
        if workers > 1 and self._synth_executor is None:
            self._synth_executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qwen3tts-synth")
        queued = self._queued_setting
        self.max_queued_streams = max(QUEUED_MIN, QUEUED_PER_STREAM * workers) if queued is None else queued

    def _load(self) -> Speaker:
        try:
            with loading():
                self._engine = self._load_engine()
            if self._workers_from_engine:
                self._set_workers(max(self._engine.max_streams, 1))
                _LOGGER.info("Serving %d request(s) at once (max_streams)", self.workers)
            self._start_synthesis_threads(self._engine)
            # Everything loaded so far lives as long as the process: out of the collector's sight, a full
            # collection (which stops every thread) walks only what requests make.
            freeze_loaded()
        except BaseException as err:
            self._load_error = err
            raise
        finally:
            self._load_done.set()
        return self._engine

    def _start_synthesis_threads(self, engine: Speaker) -> None:
        """Start every synthesis thread before serving and let each meet its first CUDA work there
        (Engine.warm_thread), so a burst of requests waits neither for threads to start nor for their
        first GPU calls: on the H200 (run 32, max_streams 16) the first round of 16 simultaneous requests,
        on threads new to the process, got first audio at 260 ms, the next round at 60-105 ms."""
        if self._synth_executor is None:
            return
        if self.syntheses:
            # Requests that came during the load already hold the threads, waiting for the load to end: warm-up
            # jobs queued behind them would wait for the load they are part of.
            _LOGGER.debug("Not starting the synthesis threads ahead: %d requests already hold them", self.syntheses)
            return
        warm = engine.warm_thread
        started = time.monotonic()
        barrier = threading.Barrier(self.workers)

        def job() -> int:
            warm()
            barrier.wait(
                timeout=WARM_THREADS_SECONDS
            )  # held until every job has a thread: the executor starts one each
            return threading.get_ident()

        try:
            futures = [self._synth_executor.submit(job) for _ in range(self.workers)]
            # Bounded: a request that arrives now takes a thread first and waits for the load to end.
            threads = {f.result(timeout=WARM_THREADS_SECONDS) for f in futures}
        except Exception as err:  # not worth failing the load for: requests then start threads as they come
            _LOGGER.warning("Could not start the synthesis threads ahead: %s", err)
            return
        _LOGGER.info("Started %d synthesis threads in %.0f ms", len(threads), (time.monotonic() - started) * 1000)

    def _on_loaded(self, future: asyncio.Future[Speaker]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        try:
            self.catalog = self._catalog_of(future.result())
        except Exception as err:  # the presets do not fit this model
            self._load_error = err
            _LOGGER.error("Voice presets do not fit the loaded model: %s", err)

    def _catalog_of(self, engine: Speaker, presets: list[VoicePreset] | None = None) -> VoiceCatalog:
        return VoiceCatalog(
            engine.speakers,
            engine.languages,
            self._presets if presets is None else presets,
            supports_instruct=engine.supports_instruct,
            default_voice=self._default_voice,
            version=__version__,
            model_type=set(engine.model_types),
            clones=engine.clone_prompts,
        )

    # -- cloned voices added and removed while serving (the web page) ---------------------------
    @property
    def clones_voices(self) -> bool:
        """Whether a Base model is loaded, so cloned voices can be added."""
        kinds = self.catalog.model_types
        return self._engine is not None and kinds is not None and "base" in kinds

    async def add_voice(self, preset: VoicePreset) -> None:
        """Clone `preset` (a VoicePreset with reference_audio) on the worker thread, after the jobs before it,
        and offer it from now on. All or nothing: on any error (a bad clip, no transcript, a language the model
        does not speak) or cancellation nothing of it is kept, in the catalog or in the engine's prompts."""
        engine = self._engine
        if engine is None or not self.clones_voices:
            raise VoiceError("cloned voices need a Base model, and none is loaded")
        if preset.language is not None:
            language_name(preset.language, self.catalog.languages)  # UnknownLanguageError before any work

        def job() -> ClonePrompt:
            failed = engine.clone_voices([preset])
            # Taken back out at once, on the same thread: the prompt is offered only once all is checked, so a
            # cancelled add (its job runs on regardless) never leaves one behind.
            prompt = engine.clone_prompts.pop(preset.name, None)
            if failed or prompt is None:
                raise VoiceError(failed.get(preset.name, "the clip could not be cloned"))
            return prompt

        prompt = await self._submit(asyncio.get_running_loop(), job)
        presets = [p for p in self._presets if p.name != preset.name] + [preset]
        engine.clone_prompts[preset.name] = prompt
        try:
            catalog = self._catalog_of(engine, presets)
        except BaseException:
            engine.clone_prompts.pop(preset.name, None)
            raise
        self._presets, self.catalog = presets, catalog

    def remove_voice(self, name: str) -> None:
        """Stop offering a cloned voice (requests already speaking it finish)."""
        self._presets = [p for p in self._presets if p.name != name]
        if self._engine is not None:
            self._engine.clone_prompts.pop(name, None)
            self.catalog = self._catalog_of(self._engine)

    @property
    def load_error(self) -> BaseException | None:
        """Why the model (or the presets for it) could not be loaded, once that is known."""
        return self._load_error

    def info(self) -> Info:
        """What describe answers."""
        return self.info_event()[0]

    def info_event(self) -> tuple[Info, Event]:
        """describe's answer and its event, built once per voice catalog: describe may come in
        floods, and building the event is most of the work of answering it."""
        catalog = self.catalog
        if self._info is None or self._info[0] is not catalog:
            info = self._build_info(catalog)
            self._info = (catalog, info, info.event())
        return self._info[1], self._info[2]

    def _build_info(self, catalog: VoiceCatalog) -> Info:
        program = TtsProgram(
            name=PROGRAM_NAME,
            description="Qwen3-TTS "
            + " + ".join(
                MODEL_TYPE_NAMES.get(k, k) + (" (cloned voices)" if k == "base" else "")
                for k in sorted(catalog.model_types or {"custom_voice"})
            ),
            attribution=ATTRIBUTION,
            installed=True,
            version=__version__,
            voices=catalog.tts_voices(),
            supports_synthesize_streaming=self.streaming,
        )
        return Info(tts=[program])

    async def synthesize(
        self, request: SynthesisRequest, cancel: threading.Event, *, continuing: bool = False
    ) -> AsyncGenerator[AudioChunk, None]:
        """Audio chunks of one sentence as the worker produces them.

        The first sentence of a request raises QueueFullError at once when max_queued_streams
        sentences already wait for a worker; a `continuing` one (a later sentence of a request being
        answered) always queues. Stopping the iteration (or closing it) sets `cancel`, which stops
        the engine after the frame group it is working on.
        """
        take = await self.announcements.lookup(request, self._engine, cancel)
        if take.hit:
            for cached in take.chunks or ():
                yield cached
            return
        waiting = self.syntheses - self.workers
        if not continuing and waiting >= self.max_queued_streams:
            raise QueueFullError(
                f"The server is busy: all {self.workers} decode slot(s) are in use and {waiting} requests wait "
                f"for one (max_queued_streams); try again shortly"
            )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()

        submitted = time.monotonic()

        def job() -> None:
            _LOGGER.debug(
                "Synthesis thread took the sentence %.1f ms after it was submitted",
                (time.monotonic() - submitted) * 1000,
            )

            # Runs on the worker thread, after every job submitted before it (or, with several
            # synthesis threads, once the model load has ended).
            if self._synth_executor is not None:
                while not self._load_done.wait(0.5):
                    if cancel.is_set():
                        break
            if cancel.is_set():
                raise SynthesisCancelled("cancelled before it started")
            engine = self._engine
            if engine is None or self._load_error is not None:
                raise ModelLoadError(f"The model could not be loaded: {self._load_error}")
            # Out of GPU memory the engine frees its cache and raises GpuOutOfMemoryError: the request ends
            # with that error, and the next one runs normally.
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

        future = self._submit(loop, job, self._synth_executor)
        self.syntheses += 1
        counted = True

        def uncount(_: object = None) -> None:
            # Once per sentence: when its job ends, or when its caller gives up on it, whichever is first.
            nonlocal counted
            if counted:
                counted = False
                self.syntheses -= 1

        future.add_done_callback(uncount)
        # The done callback is scheduled after every chunk the job queued, so _END comes last.
        future.add_done_callback(lambda _: queue.put_nowait(_END))
        try:
            while (item := await queue.get()) is not _END:
                assert isinstance(item, AudioChunk)
                take.record(item)
                yield item
            future.result()
            take.complete()
        finally:
            if not future.done():
                cancel.set()
                # An abandoned sentence stops counting against max_queued_streams now, not when the
                # worker thread reaches it: a client that leaves must not refuse the next one.
                uncount()
                # Nobody waits for it any more: fetch its end (e.g. SynthesisCancelled) so asyncio
                # does not log "exception was never retrieved".
                future.add_done_callback(_retrieve)

    def _submit(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[[], _T], executor: ThreadPoolExecutor | None = None
    ) -> asyncio.Future[_T]:
        self.jobs_running += 1
        future = loop.run_in_executor(executor or self._executor, fn)

        def done(_: object) -> None:
            self.jobs_running -= 1

        future.add_done_callback(done)
        return future

    # -- connections: the limit, and draining on SIGTERM ------------------------------------
    def admit(self, connection: Connection) -> Qwen3TTSError | None:
        """Register a new connection, or say why it is refused."""
        if self.draining:
            return ShuttingDownError("The server is shutting down")
        if len(self.connections) >= self.max_connections:
            return ServerBusyError(f"Too many connections: the limit is {self.max_connections}")
        self.connections.add(connection)
        self._no_connections.clear()
        return None

    def release(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self._no_connections.set()

    async def drain(self, timeout: float) -> bool:
        """Stop taking requests, let those in progress finish (up to `timeout` s), then close.

        Returns True when every connection finished in time; the rest are aborted together,
        each with an error event, within a fraction of a second.
        """
        self.draining = True
        for connection in list(self.connections):
            connection.begin_drain()
        if self._tasks:
            _LOGGER.info("Finishing %d connection(s) with requests in progress (up to %g s)", len(self._tasks), timeout)
        try:
            async with asyncio.timeout(timeout):
                await self._no_connections.wait()
            return True
        except TimeoutError:
            _LOGGER.warning("%d connection(s) still open after %g s: cancelling them", len(self.connections), timeout)
            await self.abort_all()
            return False

    async def abort_all(self) -> None:
        """Cancel every connection's work and drop it, all at once (see Connection.abort)."""
        connections = list(self.connections)
        results = await asyncio.gather(
            *(c.abort(ShuttingDownError("The server is shutting down")) for c in connections), return_exceptions=True
        )
        for connection, result in zip(connections, results):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                _LOGGER.error("Aborting %s failed", connection, exc_info=result)

    def track(self, task: asyncio.Task[None]) -> None:
        """Remember a connection's speaking task until it ends (see wait_idle)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Wait until nothing is being spoken (stdio://: input ended, the answers are still due)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._synth_executor is not None:
            self._synth_executor.shutdown(wait=False, cancel_futures=True)
