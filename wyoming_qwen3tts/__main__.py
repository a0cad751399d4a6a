"""`python -m wyoming_qwen3tts`: settings -> engine (loading in the background) -> Wyoming server.

The server binds and answers describe at once; the model loads on the engine's worker thread
meanwhile (Home Assistant gives setup one second, a download can take minutes).  If the model
cannot be loaded the server logs why and exits with status 1.

SIGTERM (and Ctrl-C) drain: the listening socket closes at once, requests in progress are
finished (up to drain_seconds; then every connection is cancelled with an error event and
dropped, all at once, within a fraction of a second), idle connections are closed, and the
process exits 0 without waiting for the engine's worker thread.  A second signal cancels what
is left at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING, Any

from wyoming.server import AsyncServer, AsyncStdioServer, AsyncTcpServer, AsyncUnixServer

from . import __version__
from .handler import HandlerConfig, Qwen3TTSEventHandler
from .process import watch_collections
from .service import TtsService
from .settings import Settings, load_settings
from .voices import VoicePreset, scan_voice_folder
from .voices.watch import VoiceFolderWatcher

if TYPE_CHECKING:
    from .engine_set import Speaker
    from .http.app import HttpServer

_LOGGER = logging.getLogger("wyoming_qwen3tts")


def all_voices(settings: Settings) -> list[VoicePreset]:
    """The configured voices, then the voices folder's (a folder voice whose name is configured is skipped)."""
    voices = list(settings.voices)
    folder = settings.voice_folder()
    if folder is None:
        return voices
    from .voices.folder import repair_voice_folder

    for repair in repair_voice_folder(folder):  # what a crash in the middle of an add or remove left
        _LOGGER.warning("Voices folder %s: %s", folder, repair)
    found, problems = scan_voice_folder(folder)
    for problem in problems:
        _LOGGER.error("%s", problem)
    names = {v.name for v in voices}
    voices += [v for v in found if v.name not in names]
    _LOGGER.info("Voices folder %s: %d voice(s)", folder, len(found))
    return voices


def load_engine(settings: Settings, voices: list[VoicePreset] | None = None) -> Speaker:
    """The blocking model load (download + weights), run on the engine's worker thread; a Base model
    then clones the cloned voices (from the prompt cache where it has them)."""
    _LOGGER.info(
        "Loading %s (device=%s, dtype=%s, backend=%s)",
        settings.model,
        settings.device,
        settings.dtype,
        settings.backend,
    )
    # Imported here, on the worker thread: torch takes a second or more to import, and the server
    # must already be answering describe by then (Home Assistant gives setup one second).
    from .engine import Engine

    options = settings.engine_options()
    first = Engine.from_pretrained(settings.model, options)
    _LOGGER.info("Model loaded: %d speakers", len(first.speakers))
    engine: Speaker = first
    if settings.extra_models:  # one model of each type, each voice routed to its model's type
        from .engine_set import EngineSet

        extra = []
        for model in settings.extra_models:
            _LOGGER.info("Loading %s as well", model)
            extra.append(Engine.from_pretrained(model, options))
        engine = EngineSet([first, *extra])
    if "base" in engine.model_types:
        engine.clone_voices([v for v in voices or [] if v.kind == "base"])
    # Before "Ready": the first real request must not pay for graph capture or lazy init.
    engine.warm_up()
    return engine


async def main(settings: Settings) -> int:
    watch_collections()
    voices = all_voices(settings)
    service = TtsService(
        partial(load_engine, settings, voices),
        voices,
        streaming=settings.streaming,
        default_voice=settings.voice,
        max_connections=settings.max_connections,
        workers=settings.max_streams,
        max_queued_streams=settings.max_queued_streams,
        announcements=settings.announcements(),
    )
    config = HandlerConfig(**settings.values_for(HandlerConfig))
    server = AsyncServer.from_uri(settings.uri)

    if settings.zeroconf is not None:
        if not isinstance(server, AsyncTcpServer):
            raise SystemExit("--zeroconf needs a tcp:// URI")
        from wyoming.zeroconf import HomeAssistantZeroconf

        # A wildcard bind address is not reachable: let zeroconf find the LAN address.
        host = None if server.host in ("0.0.0.0", "::", "") else server.host
        await HomeAssistantZeroconf(name=settings.zeroconf, port=server.port, host=host).register_server()
        _LOGGER.info("Zeroconf discovery enabled as %s", settings.zeroconf)

    handler_factory = partial(Qwen3TTSEventHandler, service, config)
    if isinstance(server, AsyncStdioServer):
        return await _serve_stdio(server, service, handler_factory)

    loop = asyncio.get_running_loop()
    http_server: HttpServer | None = None
    signals = asyncio.Queue[int]()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signals.put_nowait, signum)
    folder = settings.voice_folder()
    watcher = (
        VoiceFolderWatcher(service, folder, {v.name for v in settings.voices})
        if folder and settings.watch_voices
        else None
    )
    watching: asyncio.Task[None] | None = None
    try:
        loaded = service.start_loading()
        watching = asyncio.create_task(watcher.run()) if watcher is not None else None
        await server.start(handler_factory)
        _LOGGER.info("Listening on %s (version %s)", settings.uri, __version__)
        http_server = await _start_http(settings, service)
        signalled = asyncio.ensure_future(signals.get())
        waiting: set[asyncio.Future[Any]] = {loaded, signalled}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if loaded in done:
            if not _report_load(service):
                return 1
            await signalled
        _LOGGER.info(
            "Stopping (%s): no new connections; finishing requests in progress",
            signal.Signals(signalled.result()).name,
        )
        _stop_listening(server)
        if http_server is not None:
            await http_server.stop_listening()
        drain = asyncio.ensure_future(service.drain(settings.drain_seconds))
        again = asyncio.ensure_future(signals.get())
        await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            _LOGGER.warning("Second signal: cancelling the requests still running")
            drain.cancel()
            await service.abort_all()
        again.cancel()
        _LOGGER.info("Stopped")
        return 0 if service.load_error is None else 1
    finally:
        if watcher is not None and watching is not None:
            watcher.stop()
            watching.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        _stop_listening(server)
        if http_server is not None:
            await http_server.close()
        _note_worker(service)
        service.shutdown()


async def _start_http(settings: Settings, service: TtsService) -> HttpServer | None:
    """The HTTP API and web page, when the `http` setting asks for them (aiohttp loads only then)."""
    if settings.http is None:
        return None
    from .http.app import start_http_server

    return await start_http_server(settings, service)


def _report_load(service: TtsService) -> bool:
    """Log the end of the model load: "Ready", or why it failed."""
    if service.load_error is not None:
        _LOGGER.error("Could not load the model: %s", service.load_error)
        return False
    _LOGGER.info("Ready")
    return True


def _stop_listening(server: AsyncServer) -> None:
    """Close the listening socket; connections already accepted stay open."""
    listener = getattr(server, "_server", None)
    if listener is not None:
        listener.close()
    if isinstance(server, AsyncUnixServer):
        server.socket_path.unlink(missing_ok=True)


async def _serve_stdio(
    server: AsyncStdioServer, service: TtsService, handler_factory: partial[Qwen3TTSEventHandler]
) -> int:
    """stdio://: one client on stdin/stdout; at the end of the input its requests are still answered."""
    loaded = service.start_loading()
    serving = asyncio.create_task(server.run(handler_factory))
    try:
        waiting: set[asyncio.Future[Any]] = {loaded, serving}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if loaded in done:
            if not _report_load(service):
                return 1
            await serving
        await service.wait_idle()
        return 0 if service.load_error is None else 1
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await server.stop()
            await serving
        _note_worker(service)
        service.shutdown()


def _note_worker(service: TtsService) -> None:
    if service.jobs_running:
        _LOGGER.info("Not waiting for the engine's worker thread (%d job(s) left)", service.jobs_running)


def run() -> None:
    settings = load_settings()
    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO, format=settings.log_format)
    _LOGGER.debug(settings)
    code = 130
    with contextlib.suppress(KeyboardInterrupt):
        if os.environ.get("Q3T_EVENT_LOOP") == "uvloop":  # measured against asyncio's own loop (kernels/device)
            import uvloop

            code = uvloop.run(main(settings))
        else:
            code = asyncio.run(main(settings))
    # Exit without the interpreter's teardown: with torch loaded it takes most of a second (and
    # Docker kills 10 s after SIGTERM, most of which drain_seconds may use), and it would wait
    # for the engine's worker thread, which may be busy with what it cannot abandon (a model
    # download, a long prefill).  Every connection is closed by now; only the logs need flushing.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # stdio:// may have closed stdout
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
