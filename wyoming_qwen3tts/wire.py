"""Wyoming events off the wire, bounded (nothing is allocated on the client's word), and onto it in one piece.

The same wire format as wyoming.event.async_read_event (a JSON header line, then data_length
bytes of JSON data, then payload_length bytes of payload), but the library would allocate
whatever data_length or payload_length a header claims and returns None for malformed input,
which looks like a clean disconnect.  Here the header line is read in pieces of at most the
stream's buffer limit and refused past the limit, both lengths are checked against the limits
before anything is read, and anything malformed raises ProtocolError.

Written, an event is the same bytes as wyoming.event.async_write_event's, made into one bytes object
(event_bytes): the library writes them in three pieces, each a send() of its own while the socket
takes them, and waits for the transport (drain) after every event; a 1-frame audio chunk of a burst
of 64 then cost the event loop three system calls instead of one.
"""

from __future__ import annotations

import asyncio
import json

from wyoming.event import Event
from wyoming.version import __version__ as WYOMING_VERSION

from .errors import EventTooLargeError, ProtocolError


def event_bytes(event: Event) -> bytes:
    """The event as async_write_event puts it on the wire: the header line (type, version, data_length,
    payload_length, in that order), the data as JSON, the payload."""
    header: dict[str, object] = {"type": event.type, "version": WYOMING_VERSION}
    data = json.dumps(event.data, ensure_ascii=False).encode() if event.data else b""
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return b"".join((json.dumps(header, ensure_ascii=False).encode(), b"\n", data, event.payload or b""))


async def read_event(reader: asyncio.StreamReader, max_bytes: int, max_json_bytes: int | None = None) -> Event | None:
    """One Wyoming event, or None at a clean end of the connection.

    `max_bytes` bounds the whole event; `max_json_bytes` (default: the same) bounds its JSON, the
    header line and the data block, which is parsed where this runs (the event loop).
    """
    max_json_bytes = max_bytes if max_json_bytes is None else min(max_json_bytes, max_bytes)
    line = await _read_line(reader, max_json_bytes)
    if line is None:
        return None
    try:
        header = json.loads(line)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"Event header is not JSON: {short(err)}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("Event header must be a JSON object with a string 'type'")
    data = header.get("data")
    if data is None:
        data = {}
    elif not isinstance(data, dict):
        raise ProtocolError("Event 'data' must be a JSON object")
    data_length = _length(header, "data_length")
    payload_length = _length(header, "payload_length")
    total = len(line) + data_length + payload_length
    if total > max_bytes:
        raise EventTooLargeError(f"Event {header['type']!r} of {total} bytes is over the limit of {max_bytes} bytes")
    if len(line) + data_length > max_json_bytes:
        raise EventTooLargeError(
            f"Event {header['type']!r} has {len(line) + data_length} bytes of JSON (header and data), "
            f"over the limit of {max_json_bytes} bytes"
        )
    if data_length:
        raw = await _read_exactly(reader, data_length, "data")
        try:
            extra = json.loads(raw)
        except (ValueError, RecursionError) as err:
            raise ProtocolError(f"Event data is not JSON: {short(err)}") from None
        if not isinstance(extra, dict):
            raise ProtocolError("Event data must be a JSON object")
        data = {**data, **extra}
    payload = await _read_exactly(reader, payload_length, "payload") if payload_length else None
    return Event(type=header["type"], data=data, payload=payload)


async def _read_line(reader: asyncio.StreamReader, max_bytes: int) -> bytes | None:
    pieces: list[bytes] = []
    size = 0
    while True:
        try:
            piece = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as err:
            if not err.partial and not pieces:
                return None
            raise ProtocolError("Connection closed inside an event header") from None
        except asyncio.LimitOverrunError as err:
            # The line is longer than the stream's buffer: take what is buffered and go on.
            if size + err.consumed > max_bytes:
                raise EventTooLargeError(f"Event header line longer than the limit of {max_bytes} bytes") from None
            piece = await reader.readexactly(err.consumed)
            pieces.append(piece)
            size += len(piece)
            continue
        size += len(piece)
        if size > max_bytes:
            raise EventTooLargeError(f"Event header line longer than the limit of {max_bytes} bytes")
        pieces.append(piece)
        return b"".join(pieces)


async def _read_exactly(reader: asyncio.StreamReader, n: int, what: str) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as err:
        raise ProtocolError(f"Connection closed after {len(err.partial)} of {n} {what} bytes") from None


def _length(header: dict[str, object], key: str) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ProtocolError(f"Event {key!r} must be a non-negative integer, not {short(value)}")
    return value


def short(value: object, limit: int = 80) -> str:
    """A client value (or an error) cut to a length fit for an error message or a log line."""
    text = repr(value) if not isinstance(value, BaseException) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."
