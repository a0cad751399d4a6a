"""wire.event_bytes: the bytes wyoming's own writer puts on the wire, in one piece, and read back by its reader."""

from __future__ import annotations

import asyncio

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_qwen3tts.wire import event_bytes

EVENTS = [
    AudioChunk(rate=24000, width=2, channels=1, audio=bytes(range(256)) * 15).event(),
    AudioStart(rate=24000, width=2, channels=1).event(),
    AudioStop().event(),
    Describe().event(),
    Error(text="Unknown voice «Ωmega» 声音", code="unknown-voice").event(),
    Synthesize(text='Grüße, "quoted" \\ and \n a newline', voice=SynthesizeVoice(name="vivian")).event(),
    Event(type="custom", data={}, payload=b"\x00\x01payload"),
]


class _Collect:
    """A StreamWriter's write side that keeps what it is given."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, lines: list[bytes]) -> None:
        for line in lines:
            self.data += line

    async def drain(self) -> None:
        pass


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type)
async def test_event_bytes_are_the_library_writers(event: Event) -> None:
    library = _Collect()
    await async_write_event(event, library)  # type: ignore[arg-type]
    assert event_bytes(event) == bytes(library.data)


async def test_event_bytes_read_back() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"".join(event_bytes(e) for e in EVENTS))
    reader.feed_eof()
    for event in EVENTS:
        back = await async_read_event(reader)
        assert back is not None
        assert (back.type, back.data, back.payload or None) == (event.type, event.data, event.payload or None)
    assert await async_read_event(reader) is None
