"""free_port: a TCP port of 127.0.0.1 for a test's server, never the same one twice in a process."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"
_given: set[int] = set()


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now, never one this process was given before: a server's Wyoming and
    HTTP ports are both picked before either binds, and the OS handed out the same free port twice (CI, `bd8d4d9`:
    the HTTP side failed to bind the Wyoming side's port)."""
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in _given:
            _given.add(port)
            return port
