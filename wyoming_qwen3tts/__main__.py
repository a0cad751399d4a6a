"""`python -m wyoming_qwen3tts`: settings -> engine (loading in the background) -> Wyoming server.

The server binds and answers describe at once; the model loads on the engine's worker thread
meanwhile (Home Assistant gives setup one second, a download can take minutes).  If the model
cannot be loaded the server logs why and exits with status 1.

SIGTERM (and Ctrl-C) drain: the listening socket closes at once, requests in progress are
finished (up to drain_seconds, then cancelled with an error event), idle connections are closed,
and the process exits 0.  A second signal cancels what is left at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING

from wyoming.server import AsyncServer, AsyncStdioServer, AsyncTcpServer, AsyncUnixServer

from . import __version__
from .handler import HandlerConfig, Qwen3TTSEventHandler
from .server import TtsService
from .settings import Settings, load_settings

if TYPE_CHECKING:
    from .engine import Engine
    from .http.app import HttpServer

_LOGGER = logging.getLogger("wyoming_qwen3tts")
_worker_busy = False  # set when main() returns with a job still on the engine's worker thread


def load_engine(settings: Settings) -> "Engine":
    """The blocking model load (download + weights), run on the engine's worker thread."""
    _LOGGER.info("Loading %s (device=%s, dtype=%s, backend=%s)", settings.model, settings.device, settings.dtype, settings.backend)
    # Imported here, on the worker thread: torch takes a second or more to import, and the server
    # must already be answering describe by then (Home Assistant gives setup one second).
    from .engine import Engine

    engine = Engine.from_pretrained(
        settings.model,
        data_dir=settings.data_dir,
        device=settings.device,
        dtype=settings.dtype,
        backend=settings.backend,
        first_chunk_frames=settings.first_chunk_frames,
        chunk_frames=settings.chunk_frames,
        max_frames=settings.max_frames,
    )
    _LOGGER.info("Model loaded: %d speakers", len(engine.speakers))
    # Before "Ready": the first real request must not pay for graph capture or lazy init.
    warm_up = getattr(engine, "warm_up", None)  # test engines may have none
    if warm_up is not None:
        warm_up()
    return engine


async def main(settings: Settings) -> int:
    service = TtsService(
        partial(load_engine, settings),
        settings.voices,
        streaming=settings.streaming,
        default_voice=settings.voice,
        max_connections=settings.max_connections,
    )
    config = HandlerConfig(
        max_text_chars=settings.max_text_chars,
        max_sentence_chars=settings.max_sentence_chars,
        seed=settings.seed,
        sampling=settings.sampling(),
        max_event_bytes=settings.max_event_bytes,
        idle_timeout=settings.idle_timeout,
        write_timeout=settings.write_timeout,
    )
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
    try:
        loaded = service.start_loading()
        await server.start(handler_factory)
        _LOGGER.info("Listening on %s (version %s)", settings.uri, __version__)
        http_server = await _start_http(settings, service)
        signalled = asyncio.ensure_future(signals.get())
        done, _ = await asyncio.wait({loaded, signalled}, return_when=asyncio.FIRST_COMPLETED)
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
            await service.drain(0)
        again.cancel()
        _LOGGER.info("Stopped")
        return 0 if service.load_error is None else 1
    finally:
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


async def _serve_stdio(server: AsyncStdioServer, service: TtsService, handler_factory: partial) -> int:  # type: ignore[type-arg]
    """stdio://: one client on stdin/stdout; at the end of the input its requests are still answered."""
    loaded = service.start_loading()
    serving = asyncio.create_task(server.run(handler_factory))
    try:
        done, _ = await asyncio.wait({loaded, serving}, return_when=asyncio.FIRST_COMPLETED)
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
    global _worker_busy
    _worker_busy = service.jobs_running > 0
    if _worker_busy:
        _LOGGER.info("Not waiting for the engine's worker thread (%d job(s) left)", service.jobs_running)


def run() -> None:
    settings = load_settings()
    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO, format=settings.log_format)
    _LOGGER.debug(settings)
    code = 130
    with contextlib.suppress(KeyboardInterrupt):
        code = asyncio.run(main(settings))
    if _worker_busy:
        # The model load (or a cancelled synthesis) is still on the worker thread, which the
        # interpreter would wait for at exit; a download can take minutes.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)



if __name__ == "__main__":
    run()
