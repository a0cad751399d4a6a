"""HTTP errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the matching status code."""

from __future__ import annotations

from aiohttp import web

from ..errors import Qwen3TTSError


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


class ApiError(Exception):
    """An error answer; raise it anywhere in a handler, the app's middleware turns it into the response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {
            "error": {"message": self.message, "type": _error_type(self.status), "param": self.param, "code": self.code}
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)

    @classmethod
    def from_service(cls, err: Qwen3TTSError, param: str | None = None) -> ApiError:
        """The HTTP answer for an error the service, the catalog or the engine raised."""
        status = err.http_status
        headers = {"Retry-After": "1"} if status in (429, 503) else None
        return cls(status, str(err), param=param, code=err.code, headers=headers)
