"""`python -m wyoming_qwen3tts`: settings -> engine (loading in the background) -> Wyoming server.

The server binds and answers describe at once; the model loads on the engine's worker thread
meanwhile (Home Assistant gives setup one second, a download can take minutes).  If the model
cannot be loaded the server logs why and exits with status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from functools import partial
from urllib.parse import urlparse

from wyoming.server import AsyncServer, AsyncTcpServer

from . import __version__
from .engine import Engine
from .handler import HandlerConfig, Qwen3TTSEventHandler
from .server import TtsService
from .settings import Settings, load_settings

_LOGGER = logging.getLogger("wyoming_qwen3tts")


def load_engine(settings: Settings) -> Engine:
    """The blocking model load (download + weights), run on the engine's worker thread."""
    _LOGGER.info("Loading %s (device=%s, dtype=%s, backend=%s)", settings.model, settings.device, settings.dtype, settings.backend)
    engine = Engine.from_pretrained(  # type: ignore[attr-defined]
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
    engine.warm_up()
    return engine


async def main(settings: Settings) -> int:
    service = TtsService(
        partial(load_engine, settings),
        settings.voices,
        streaming=settings.streaming,
        default_voice=settings.voice,
    )
    config = HandlerConfig(
        max_text_chars=settings.max_text_chars,
        max_sentence_chars=settings.max_sentence_chars,
        seed=settings.seed,
        sampling=settings.sampling(),
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

    loaded = service.start_loading()
    serving = asyncio.create_task(server.run(partial(Qwen3TTSEventHandler, service, config)))
    _LOGGER.info("Listening on %s (version %s)", settings.uri, __version__)
    try:
        done, _ = await asyncio.wait({loaded, serving}, return_when=asyncio.FIRST_COMPLETED)
        if loaded in done:
            if service.load_error is not None:
                _LOGGER.error("Could not load the model: %s", service.load_error)
                return 1
            _LOGGER.info("Ready")
            await serving
        # serve_forever only returns on SIGTERM or, for stdio://, at the end of the input,
        # whose requests are still to be answered.
        await service.wait_idle()
        return 0 if service.load_error is None else 1
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await server.stop()
            await serving
        service.shutdown()


def run() -> None:
    settings = load_settings()
    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO, format=settings.log_format)
    _LOGGER.debug(settings)
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main(settings)))


if __name__ == "__main__":
    run()
