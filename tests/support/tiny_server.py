"""The real server process on a tiny random checkpoint (tests/conftest.py's fixtures), on the CPU in float32, with the
arguments a test adds: `tiny_args` for a test that runs the server its own way, `start_tiny` to start it through
reliability_plugin.py (reliability_support.start), and with `http` also the HTTP API (http_server.start_http: a free
port and the ryan-calm preset)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, overload

from http_server import HttpServer, start_http
from reliability_support import Server, start


def tiny_args(checkpoint: Path, *args: str) -> list[str]:
    """The server's arguments for `checkpoint` on the CPU in float32, then `args`."""
    return ["--model", str(checkpoint), "--device", "cpu", "--dtype", "float32", *args]


@overload
def start_tiny(
    tmp: Path, checkpoint: Path, *args: str, name: str = "server", http: Literal[False] = False
) -> Server: ...


@overload
def start_tiny(tmp: Path, checkpoint: Path, *args: str, name: str = "server", http: Literal[True]) -> HttpServer: ...


def start_tiny(
    tmp: Path, checkpoint: Path, *args: str, name: str = "server", http: bool = False
) -> Server | HttpServer:
    """Started and ready (its log in tmp/<name>.log); the caller stops it (`.stop()`, `.server.stop()` with http)."""
    command = tiny_args(checkpoint, *args)
    if http:
        return start_http(tmp, command, fake=False, name=name)
    return start(tmp, command, fake=False, name=name)
