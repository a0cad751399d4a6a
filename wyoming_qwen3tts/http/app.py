"""The HTTP server: its routes, the API key, errors and metrics middleware, and its life in the Wyoming server's event loop.

Built on aiohttp rather than FastAPI on uvicorn because it is made to live inside an event loop
that someone else runs: AppRunner/TCPSite start, stop listening and close with three awaits and
install no signal handlers (uvicorn's Server.serve() takes over SIGINT/SIGTERM, which __main__
owns for the drain), StreamResponse.write waits for the socket (a slow reader holds up only its
own request), client_max_size refuses oversized bodies while reading them, and it is one
dependency where the other choice is three (FastAPI, Starlette, uvicorn).

Routes: the web page (/ and /static/), /healthz, /metrics, and the OpenAI-compatible /v1 API
(openai_speech.py).  With an API key set every route needs `Authorization: Bearer KEY` except
/healthz and the page's own files, which hold no data (the page asks for the key and sends it
with its API calls).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..metrics import METRICS, Metrics, model_state
from ..service import TtsService
from ..settings import Settings
from .errors import ApiError
from .openai_speech import SpeechApi, SpeechConfig
from .voice_uploads import VoiceUploads

_LOGGER = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# The page loads only its own files and plays audio it made itself (blob: URLs).
_PAGE_POLICY = "default-src 'self'; media-src 'self' blob:; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'; base-uri 'none'"


@dataclass(frozen=True)
class HttpConfig:
    uri: str = "tcp://127.0.0.1:0"
    api_key: str | None = None
    keepalive_timeout: float = 120.0  # seconds an idle keep-alive connection stays open
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    voices_dir: Path | None = None  # where the page's cloned voices go (None: it cannot add any)
    configured_voices: frozenset[str] = frozenset()  # the [[voices]] of the configuration, which the page cannot remove
    max_uploads: int = 2  # voice uploads received or checked at once
    upload_timeout: float = 120.0  # seconds to receive an upload's whole body

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpConfig:
        model = str(settings.model)
        return cls(
            uri=settings.http or "",
            api_key=settings.api_key.get_secret_value() if settings.api_key is not None else None,
            keepalive_timeout=settings.idle_timeout,
            voices_dir=settings.voice_folder(),
            configured_voices=frozenset(voice.name for voice in settings.voices),
            max_uploads=settings.max_uploads,
            upload_timeout=settings.upload_timeout,
            speech=SpeechConfig(
                # A local checkpoint is named by its folder, not by where it lies.
                model_id=Path(model).name if Path(model).is_dir() else model,
                max_body_bytes=settings.max_event_bytes,
                max_text_chars=settings.max_text_chars,
                max_sentence_chars=settings.max_sentence_chars,
                text_frontend=settings.text_frontend,
                body_timeout=settings.idle_timeout,
                write_timeout=settings.write_timeout,
                seed=settings.seed,
            ),
        )


def build_app(service: TtsService, config: HttpConfig, metrics: Metrics = METRICS) -> web.Application:
    api = SpeechApi(service, config.speech, metrics)
    uploads = VoiceUploads(
        service,
        config.voices_dir,
        configured=config.configured_voices,
        max_uploads=config.max_uploads,
        upload_timeout=config.upload_timeout,
    )
    api.uploads = uploads
    public: set[web.AbstractResource] = set()
    app = web.Application(
        client_max_size=config.speech.max_body_bytes,
        middlewares=[
            _count_requests(metrics),
            _errors_as_json,
            _require_key(config.api_key, public),
            *([] if config.api_key else [_same_origin_changes]),
        ],
    )

    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC_DIR / "index.html")

    async def health(request: web.Request) -> web.Response:
        status = "shutting-down" if service.draining else model_state(service)
        return web.json_response(
            {"status": status, "model": config.speech.model_id}, status=200 if status == "ready" else 503
        )

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    public.add(_resource_of(app.router.add_get("/", page)))
    public.add(app.router.add_static("/static/", STATIC_DIR, follow_symlinks=False))
    public.add(_resource_of(app.router.add_get("/healthz", health)))
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/v1/models", api.list_models)
    app.router.add_get("/v1/audio/voices", api.list_voices)
    app.router.add_post("/v1/audio/speech", api.create_speech)
    app.router.add_post("/v1/audio/voices", uploads.add)
    app.router.add_delete("/v1/audio/voices/{name}", uploads.remove)
    app.on_response_prepare.append(_security_headers)
    return app


def _resource_of(route: web.AbstractRoute) -> web.AbstractResource:
    assert route.resource is not None  # the router's add_* methods always add a route to a resource
    return route.resource


def _require_key(api_key: str | None, public: set[web.AbstractResource]) -> Middleware:
    expected = api_key.encode() if api_key else None

    @web.middleware
    async def require_key(request: web.Request, handler: _Handler) -> web.StreamResponse:
        # Decided by the matched route, not by the path text, so no spelling of a path slips through.
        if expected is None or request.match_info.route.resource in public:
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # aiohttp keeps a header's bytes that are not UTF-8 as surrogates: back to those bytes, never an error.
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), expected
        ):
            raise ApiError(
                401,
                "Missing or wrong API key: send 'Authorization: Bearer KEY'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    return require_key


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@web.middleware
async def _same_origin_changes(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Without an API key, refuse a browser's request that changes something when another site's page sent it.

    Any page a LAN user opens may post a form to this server (multipart forms need no CORS preflight), which would
    add voices. Browsers say where a request comes from: Sec-Fetch-Site (every current browser), else Origin, which
    must then name this server as the client reached it (Host). Clients that are no browser send neither and pass.
    """
    if request.method in _SAFE_METHODS:
        return await handler(request)
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        cross = site.lower() not in ("same-origin", "none")
    else:
        origin = request.headers.get("Origin")
        cross = origin is not None and (origin == "null" or urlsplit(origin).netloc.lower() != request.host.lower())
    if cross:
        raise ApiError(
            403,
            "Requests that change something must come from this server's own page (or carry the API key)",
            code="cross-site-request",
        )
    return await handler(request)


@web.middleware
async def _errors_as_json(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Every error answer in OpenAI's shape, aiohttp's own (404, 405, 413) included."""
    try:
        return await handler(request)
    except ApiError as err:
        return err.response()
    except (HttpProcessingError, web.RequestPayloadError) as exc:  # a body aiohttp could not parse (encodings)
        cause = exc.__cause__ if isinstance(exc, web.RequestPayloadError) else exc
        _LOGGER.warning(
            "HTTP %s %r from %s: malformed body (%s)",
            request.method,
            request.path[:200],
            request.remote,
            type(cause or exc).__name__,
        )
        return ApiError(400, "The request body is malformed", code="invalid-body").response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {name: exc.headers[name] for name in ("Allow",) if name in exc.headers}
        message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
        return ApiError(exc.status, message, headers=headers).response()
    except Exception:
        _LOGGER.exception("HTTP %s %r failed", request.method, request.path)
        return ApiError(500, "Internal server error").response()


def _count_requests(metrics: Metrics) -> Middleware:
    @web.middleware
    async def count_requests(request: web.Request, handler: _Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        status = "499"  # the client went away before an answer (nginx's code for it)
        try:
            response = await handler(request)
            status = str(response.status)
            return response
        except Exception:
            status = "500"
            raise
        finally:
            metrics.http_requests.labels(route, method, status).inc()

    return count_requests


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    if response.content_type == "text/html":
        response.headers.setdefault("Content-Security-Policy", _PAGE_POLICY)
        response.headers.setdefault("Referrer-Policy", "no-referrer")


class _ConnectionLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's per-connection logger: a request it cannot parse becomes one WARNING line without its bytes.

    aiohttp logs such a request at ERROR with a traceback whose message quotes the offending line, so any client
    could fill the log, and a malformed Authorization line would put the API key in it (at DEBUG too). Other
    records (the server's own failures) pass unchanged."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if exc is True:
            exc = sys.exc_info()[1]
        if isinstance(exc, web.RequestPayloadError):
            # A body left unread by a handler that answered already (the middleware said so when it read it):
            # aiohttp reads on to keep the connection alive, meets the error again, and closes.
            self.logger.debug("Dropped the connection after a malformed body (%s)", type(exc.__cause__ or exc).__name__)
            return
        if isinstance(exc, HttpProcessingError):
            remote = args[0] if args else "?"
            self.logger.log(
                min(level, logging.WARNING),
                "Malformed HTTP request from %s: %s, answered %d",
                remote,
                type(exc).__name__,
                exc.code or 400,
            )
            return
        super().log(level, msg, *args, **kwargs)


class HttpServer:
    """The aiohttp runner and its listening site, driven by __main__: start, stop_listening, close."""

    def __init__(self, app: web.Application, config: HttpConfig) -> None:
        self.config = config
        # handler_cancellation: a client that disconnects cancels its request at once, which stops
        # the engine after the frame group it is on.  shutdown_timeout: close() comes after the
        # service's drain, so only requests that never touch the engine can be left.
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            keepalive_timeout=config.keepalive_timeout,
            shutdown_timeout=1.0,
            logger=_ConnectionLog(logging.getLogger("aiohttp.server")),
        )
        self._site: web.BaseSite | None = None

    async def start(self) -> None:
        await self._runner.setup()
        parts = urlsplit(self.config.uri)
        if parts.scheme == "tcp" and parts.port is not None:
            self._site = web.TCPSite(self._runner, parts.hostname or "0.0.0.0", parts.port)
        elif parts.scheme == "unix" and (parts.netloc or parts.path):
            self._site = web.UnixSite(self._runner, parts.netloc + parts.path)
        else:
            await self._runner.cleanup()
            raise ValueError(f"http must be tcp://HOST:PORT or unix://PATH, not {self.config.uri!r}")
        await self._site.start()

    @property
    def url(self) -> str:
        """Where the server listens, as a URL (with the real port when the setting asked for port 0)."""
        address = self._runner.addresses[0]
        if isinstance(address, str):
            return f"unix://{address}"
        host, port = address[0], address[1]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def stop_listening(self) -> None:
        """Close the listening socket; requests in progress go on (the service's drain waits for them)."""
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def close(self) -> None:
        """Stop listening and close every connection (idle keep-alive ones at once)."""
        await self.stop_listening()
        await self._runner.cleanup()


async def start_http_server(settings: Settings, service: TtsService) -> HttpServer:
    """Start the HTTP server that the `http` setting asks for, sharing `service` with the Wyoming server."""
    config = HttpConfig.from_settings(settings)
    METRICS.watch(service)
    server = HttpServer(build_app(service, config), config)
    await server.start()
    _LOGGER.info("HTTP API and web page on %s", server.url)
    if config.api_key is None and not _loopback_only(config.uri):
        _LOGGER.warning(
            "HTTP listens beyond this machine (%s) without an API key: anyone who reaches it can use the GPU. "
            "Set api_key, or listen on 127.0.0.1",
            config.uri,
        )
    return server


def _loopback_only(uri: str) -> bool:
    parts = urlsplit(uri)
    if parts.scheme == "unix":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
