"""Helpers for the reliability, protocol-abuse and load tests: a server subprocess started through
tests/support/reliability_plugin.py, raw-socket clients, and the plugin's stats event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import HOST, free_port
from wyoming.audio import AudioChunk
from wyoming.event import Event, async_read_event

from wyoming_qwen3tts.engine import SAMPLES_PER_FRAME

PLUGIN = Path(__file__).resolve().parent / "reliability_plugin.py"
FRAME_BYTES = SAMPLES_PER_FRAME * 2


class Server:
    """The real server command line (through the plugin) on a free port of 127.0.0.1."""

    def __init__(
        self, tmp: Path, args: list[str], *, fake: bool, frame_delay: float = 0.002, name: str = "server"
    ) -> None:
        self.port = free_port()
        self.log = tmp / f"{name}.log"
        self._log_file = self.log.open("wb")
        env = dict(os.environ)
        env.pop("Q3T_TEST_ENGINE", None)
        if fake:
            env["Q3T_TEST_ENGINE"] = "fake"
            env["Q3T_TEST_FRAME_DELAY"] = str(frame_delay)
            args = ["--model", "fake", *args]
        self.proc = subprocess.Popen(
            [sys.executable, str(PLUGIN), *args, "--uri", f"tcp://{HOST}:{self.port}"],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if "INFO:wyoming_qwen3tts:Ready" in self.log_text():
                return
            time.sleep(0.1)
        pytest.fail(f"server not ready in {timeout} s:\n{self.log_text()[-3000:]}")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log_file.close()
        return code


def start(tmp: Path, args: list[str], **kw: object) -> Server:
    server = Server(tmp, args, **kw)  # type: ignore[arg-type]
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


# -- raw clients ---------------------------------------------------------------------------------


class Raw:
    """A client that writes arbitrary bytes and reads events (EOF and resets reported as such)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, rcvbuf: int | None = None) -> Raw:
        if rcvbuf is None:
            reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 24)
        else:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (HOST, port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 24)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def event(self, e: Event) -> None:
        await self.send(encode(e))

    async def read(self, timeout: float = 30) -> Event | None:
        """The next event; None at EOF or when the server reset the connection."""
        try:
            return await asyncio.wait_for(async_read_event(self.reader), timeout)
        except (ConnectionResetError, BrokenPipeError):
            return None

    async def read_all(self, timeout: float = 30) -> list[Event]:
        """Events until the server closes the connection (fails if it does not within timeout)."""
        events = []
        deadline = time.monotonic() + timeout
        while (event := await self.read(max(deadline - time.monotonic(), 0.01))) is not None:
            events.append(event)
        return events

    async def read_until(self, last: str, timeout: float = 60) -> list[Event]:
        events = []
        deadline = time.monotonic() + timeout
        while True:
            event = await self.read(max(deadline - time.monotonic(), 0.01))
            assert event is not None, f"connection closed early after {[e.type for e in events]}"
            assert event.type != "error", event.data
            events.append(event)
            if event.type == last:
                return events

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    def reset(self) -> None:
        """Close with RST (SO_LINGER 0), as a crashed or killed client does."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.writer.transport.abort()


def encode(e: Event) -> bytes:
    """The library's wire format, but JSON with ASCII escapes: a lone surrogate goes out as
    "\\ud800", as a JavaScript or C# client would send it (the library cannot encode it)."""
    data = json.dumps(e.data).encode() if e.data else b""
    head: dict[str, object] = {"type": e.type}
    if data:
        head["data_length"] = len(data)
    if e.payload:
        head["payload_length"] = len(e.payload)
    return header(head) + data + (e.payload or b"")


def header(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


async def stats(port: int) -> dict:  # type: ignore[type-arg]
    client = await Raw.connect(port)
    try:
        await client.event(Event(type="x-test-stats"))
        event = await client.read(10)
        assert event is not None and event.type == "x-test-stats"
        return event.data
    finally:
        await client.close()


async def wait_quiet(port: int, timeout: float = 20) -> dict:  # type: ignore[type-arg]
    """Stats once no exchange runs and only the stats connection is open."""
    deadline = time.monotonic() + timeout
    while True:
        s = await stats(port)
        if (s["exchanges"] == 0 and s["connections"] <= 1 and s["jobs"] == 0) or time.monotonic() > deadline:
            return s
        await asyncio.sleep(0.1)


def audio_bytes(events: list[Event]) -> int:
    return sum(len(AudioChunk.from_event(e).audio) for e in events if AudioChunk.is_type(e.type))


def check_answer(events: list[Event], streaming: bool) -> int:
    """The answer order is audio-start, audio-chunk*, audio-stop[, synthesize-stopped]; returns frames."""
    types = [e.type for e in events]
    tail = ["audio-stop", "synthesize-stopped"] if streaming else ["audio-stop"]
    assert types[0] == "audio-start" and types[-len(tail) :] == tail, types
    assert all(t == "audio-chunk" for t in types[1 : -len(tail)]), types
    start = events[0].data
    assert (start["rate"], start["width"], start["channels"]) == (24000, 2, 1)
    size = audio_bytes(events)
    assert size % FRAME_BYTES == 0, f"{size} bytes is not a whole number of frames"
    return size // FRAME_BYTES


async def synthesize(
    port: int, text: str, voice: dict | None = None, streaming: bool = False, timeout: float = 120
) -> int:  # type: ignore[type-arg]
    """One good request on a new connection; returns the frames of audio."""
    client = await Raw.connect(port)
    try:
        data: dict = {"voice": voice or {"name": "ryan"}}  # type: ignore[type-arg]
        if streaming:
            await client.event(Event(type="synthesize-start", data=data))
            await client.event(Event(type="synthesize-chunk", data={"text": text}))
            await client.event(Event(type="synthesize-stop"))
            events = await client.read_until("synthesize-stopped", timeout)
        else:
            await client.event(Event(type="synthesize", data={"text": text, **data}))
            events = await client.read_until("audio-stop", timeout)
        return check_answer(events, streaming)
    finally:
        await client.close()
