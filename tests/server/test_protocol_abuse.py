"""Bad input against the real server process: malformed events, oversized lengths, garbage,
out-of-order events, wrong types, path-like names, hostile texts; and the limits (connections,
idle and stuck clients).  Every case has one defined outcome (docs/reliability.md), and after
each one a good request must still be answered.

Most cases run against the server with the fake engine (tests/support/fake_engine.py; fast); the texts that the
real tokenizer and model must survive run against a tiny random checkpoint on the CPU.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reliability_support import Raw, Server, check_answer, encode, header, start, stats, synthesize, wait_quiet
from tiny_server import start_tiny
from wyoming.event import Event

pytestmark = pytest.mark.timeout(240)

IDLE = 3.0  # --idle-timeout of the fake server
WRITE = 2.0  # --write-timeout of the fake server


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start(
        tmp_path_factory.mktemp("abuse"),
        ["--idle-timeout", str(IDLE), "--write-timeout", str(WRITE), "--debug"],
        fake=True,
    )
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Iterator[Server]:
    args = ["--max-frames", "1", "--first-chunk-frames", "1", "--greedy", "--seed", "1"]
    server = start_tiny(tmp_path_factory.mktemp("abuse-real"), tiny_checkpoint, *args, name="real")
    yield server
    assert server.stop() == 0


async def outcome(
    port: int, data: bytes | list[Event], *, half_close: bool = False, timeout: float = 15
) -> list[Event]:
    """Send raw bytes (or events), then read everything until the server closes the connection."""
    client = await Raw.connect(port)
    try:
        if isinstance(data, bytes):
            await client.send(data)
        else:
            for event in data:
                await client.event(event)
        if half_close:
            client.writer.write_eof()
        t0 = time.monotonic()
        events = await client.read_all(timeout)
        assert time.monotonic() - t0 < timeout, "the server did not close the connection"
        return events
    finally:
        await client.close()


def the_error(events: list[Event]) -> dict:  # type: ignore[type-arg]
    assert events and events[-1].type == "error", [(e.type, e.data) for e in events]
    assert sum(e.type == "error" for e in events) == 1
    return events[-1].data


async def still_serves(server: Server) -> None:
    assert await synthesize(server.port, "Still fine here.") == 3
    server.check_alive()


# -- malformed wire data: error event "bad-request", connection closed -------------------------------

BAD_REQUEST = {
    "json-header-cut": b'{"type": "synthesize", "data": {"text": "hi"\n',
    "header-not-object": b"[1, 2, 3]\n",
    "header-string": b'"synthesize"\n',
    "no-type": header({"data": {"text": "hi"}}),
    "type-not-string": header({"type": 7}),
    "data-not-object": header({"type": "synthesize", "data": ["hi"]}),
    "data-length-negative": header({"type": "synthesize", "data_length": -5}),
    "data-length-string": header({"type": "synthesize", "data_length": "12"}),
    "data-length-float": header({"type": "synthesize", "data_length": 1.5}),
    "data-length-bool": header({"type": "synthesize", "data_length": True}),
    "payload-length-huge-literal": b'{"type": "x", "payload_length": 1' + b"0" * 5000 + b"}\n",
    "data-block-not-json": header({"type": "synthesize", "data_length": 5}) + b"hello",
    "data-block-not-object": header({"type": "synthesize", "data_length": 7}) + b'"hello"',
    "not-utf8": b'{"type": "synthesize\xff\xfe"}\n',
    "deeply-nested": b'{"type": "x", "data": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n",
    "binary-garbage": bytes(range(256)) * 64,
}


@pytest.mark.parametrize("case", list(BAD_REQUEST))
async def test_malformed_event_is_refused(fake: Server, case: str) -> None:
    error = the_error(await outcome(fake.port, BAD_REQUEST[case]))
    assert error["code"] == "bad-request", error
    await still_serves(fake)


@pytest.mark.parametrize("part", ["data", "payload"])
async def test_truncated_event(fake: Server, part: str) -> None:
    """The client announces 100 bytes, sends 10 and closes its side: an error, then the close."""
    head = header({"type": "synthesize", "data": {"text": "Hi."}, f"{part}_length": 100})
    error = the_error(await outcome(fake.port, head + b"0123456789", half_close=True))
    assert error["code"] == "bad-request" and "10 of 100" in error["text"], error
    await still_serves(fake)


async def test_truncated_header(fake: Server) -> None:
    error = the_error(await outcome(fake.port, b'{"type": "synthesize", "da', half_close=True))
    assert error["code"] == "bad-request"
    await still_serves(fake)


# -- sizes: refused before anything is allocated -------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        {"type": "synthesize", "data_length": 10**12},
        {"type": "audio-chunk", "payload_length": 2**40},
        {"type": "synthesize", "data_length": 600_000, "payload_length": 600_000},  # each fits, the sum not
    ],
    ids=["data-1TB", "payload-1TiB", "sum-over-limit"],
)
async def test_oversized_lengths_refused_without_allocating(fake: Server, head: dict) -> None:  # type: ignore[type-arg]
    before = await stats(fake.port)
    t0 = time.monotonic()
    error = the_error(await outcome(fake.port, header(head)))
    assert error["code"] == "event-too-large" and "1048576" in error["text"], error
    assert time.monotonic() - t0 < 3
    after = await stats(fake.port)
    assert after["rss_kb"] - before["rss_kb"] < 20_000, (before["rss_kb"], after["rss_kb"])
    await still_serves(fake)


async def test_ten_megabyte_header_line(fake: Server) -> None:
    """10 MB without a newline: refused once 1 MiB has been read; the client sees the error (the
    server drains its input for a moment) or, if it is still sending, a reset."""
    before = await stats(fake.port)
    client = await Raw.connect(fake.port)

    async def flood() -> None:
        try:
            await client.send(b'{"type": "synthesize", "data": {"text": "' + b"a" * 10_000_000 + b'"}}\n')
        except (ConnectionError, BrokenPipeError):
            pass

    sender = asyncio.create_task(flood())
    t0 = time.monotonic()
    events = await client.read_all(15)
    await sender
    await client.close()
    assert time.monotonic() - t0 < 5
    assert events == [] or the_error(events)["code"] == "event-too-large", [(e.type, e.data) for e in events]
    after = await wait_quiet(fake.port)
    assert after["rss_kb"] - before["rss_kb"] < 30_000, (before["rss_kb"], after["rss_kb"])
    await still_serves(fake)


async def test_large_event_within_limit_is_read(fake: Server) -> None:
    """A 900 kB event of an unknown type (data block and payload) is read, ignored, and the
    connection goes on: the limit is on size, not on what the library writes."""
    client = await Raw.connect(fake.port)
    try:
        data = json.dumps({"blob": "x" * 100_000}).encode()
        await client.send(
            header({"type": "x-big", "data_length": len(data), "payload_length": 800_000}) + data + b"\0" * 800_000
        )
        await client.event(Event(type="describe"))
        event = await client.read(10)
        assert event is not None and event.type == "info"
    finally:
        await client.close()


async def test_json_over_its_limit_is_refused(fake: Server) -> None:
    """JSON is parsed on the event loop: a data block bigger than the longest text needs (here
    65536 + 12 x 5000 bytes), though under max_event_bytes, is refused before it is read."""
    data = json.dumps({"a": [{}] * 50_000}).encode()  # 200 kB of JSON that is slow to parse
    error = the_error(await outcome(fake.port, header({"type": "x-junk", "data_length": len(data)}) + data))
    assert error["code"] == "event-too-large" and "bytes of JSON" in error["text"] and "125536" in error["text"], error
    # The longest text, every character escaped as a surrogate pair, still fits.
    client = await Raw.connect(fake.port)
    try:
        await client.event(Event(type="synthesize", data={"text": "😀" * 4999 + "."}))
        assert check_answer(await client.read_until("audio-stop"), streaming=False) == 0
    finally:
        await client.close()
    await still_serves(fake)


# -- events: unknown ignored, out of order refused ------------------------------------------------------


async def test_unknown_events_are_ignored(fake: Server) -> None:
    client = await Raw.connect(fake.port)
    try:
        await client.event(Event(type="select-program", data={"name": "qwen3-tts"}))
        await client.event(Event(type="x-something-new", data={"a": [1, 2]}, payload=b"\x00\x01"))
        await client.event(Event(type="audio-chunk", data={"rate": 1}, payload=b"\0" * 100))
        await client.event(Event(type="synthesize", data={"text": "Hello there."}))
        events = await client.read_until("audio-stop")
        assert check_answer(events, streaming=False) == 2
    finally:
        await client.close()


@pytest.mark.parametrize(
    "events",
    [
        [Event(type="synthesize-chunk", data={"text": "hello"})],
        [Event(type="synthesize-stop")],
        [
            Event(type="synthesize-start"),
            Event(type="synthesize-chunk", data={"text": "One. "}),
            Event(type="synthesize-start"),
        ],
    ],
    ids=["chunk-without-start", "stop-without-start", "second-start"],
)
async def test_out_of_order_events(fake: Server, events: list[Event]) -> None:
    error = the_error([e for e in await outcome(fake.port, events) if not e.type.startswith("audio")])
    assert error["code"] == "bad-request", error
    await still_serves(fake)


@pytest.mark.parametrize(
    "voice", [{}, {"name": ""}, {"name": None}, None], ids=["empty", "empty-name", "null-name", "null"]
)
async def test_empty_voice_means_default_voice(fake: Server, voice: dict | None) -> None:  # type: ignore[type-arg]
    client = await Raw.connect(fake.port)
    try:
        await client.event(Event(type="synthesize", data={"text": "Default voice please.", "voice": voice}))
        assert check_answer(await client.read_until("audio-stop"), streaming=False) == 3
    finally:
        await client.close()


@pytest.mark.parametrize(
    "data",
    [
        {"text": "Hi.", "voice": "ryan"},
        {"text": "Hi.", "voice": 5},
        {"text": "Hi.", "voice": ["ryan"]},
        {"text": "Hi.", "voice": {"name": 5}},
        {"text": "Hi.", "voice": {"name": "ryan", "speaker": ["x"]}},
        {"text": "Hi.", "voice": {"language": {"en": 1}}},
        {"text": 5},
        {"text": None},
        {"text": ["Hi."]},
        {},
    ],
    ids=[
        "voice-str",
        "voice-int",
        "voice-list",
        "name-int",
        "speaker-list",
        "language-dict",
        "text-int",
        "text-null",
        "text-list",
        "no-text",
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
async def test_wrong_json_types(fake: Server, data: dict, streaming: bool) -> None:  # type: ignore[type-arg]
    if streaming:
        voice = {"voice": data["voice"]} if "voice" in data else {}
        text = {"text": data["text"]} if "text" in data else {}
        ok_voice = "voice" not in data
        events = [
            Event(type="synthesize-start", data=voice if not ok_voice else {}),
            Event(type="synthesize-chunk", data=text if ok_voice else {"text": "Hi."}),
        ]
    else:
        events = [Event(type="synthesize", data=data)]
    error = the_error([e for e in await outcome(fake.port, events) if not e.type.startswith("audio")])
    assert error["code"] == "bad-request", error
    await still_serves(fake)


@pytest.mark.parametrize(
    "voice, code",
    [
        ({"name": "../../etc/passwd"}, "unknown-voice"),
        ({"name": "/etc/passwd"}, "unknown-voice"),
        ({"name": "ryan", "speaker": "../../../../etc/shadow"}, "unknown-voice"),
        ({"language": "../../etc/passwd"}, "unknown-language"),
        ({"name": "C:\\Windows\\win.ini"}, "unknown-voice"),
    ],
)
async def test_path_like_names_are_just_unknown(fake: Server, voice: dict, code: str) -> None:  # type: ignore[type-arg]
    error = the_error(await outcome(fake.port, [Event(type="synthesize", data={"text": "Hi.", "voice": voice})]))
    assert error["code"] == code, error
    opened = (await stats(fake.port))["opened"]
    assert not [p for p in opened if not p.endswith((".py", ".pyc"))], opened
    assert not [p for p in opened if "passwd" in p or "shadow" in p or "win.ini" in p], opened
    await still_serves(fake)


async def test_requests_open_no_files(fake: Server) -> None:
    """No request opens a file other than Python's own lazy imports and source lines for logs
    (the audit hook sees every open() since the model loaded, after all the cases above)."""
    await synthesize(fake.port, "Open nothing.", voice={"name": "aiden"})
    await synthesize(fake.port, "Open nothing.", streaming=True)
    opened = (await stats(fake.port))["opened"]
    assert [p for p in opened if not p.endswith((".py", ".pyc"))] == [], opened


# -- text abuse --------------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(
    "text",
    ["", "   \n\t  ", "😀🎉🙈👍🏽", "\u0000\u0001\u001b\u007f\u0085\u0008", "...!?", "\ud800\udfff\ud83d"],
    ids=["empty", "whitespace", "emoji-only", "controls-only", "punctuation-only", "lone-surrogates-only"],
)
async def test_nothing_to_say_gives_empty_answer(fake: Server, text: str, streaming: bool) -> None:
    """No speakable character: a well-formed, empty answer (audio-start, audio-stop)."""
    frames = await synthesize(fake.port, text, streaming=streaming)
    assert frames == 0


async def test_text_over_limit_is_refused(real: Server) -> None:
    """50,000 characters with the default max_text_chars (5000): refused at once, nothing spoken."""
    t0 = time.monotonic()
    text = "This is a sentence that goes on. " * 1516  # 50,028 characters
    error = the_error(await outcome(real.port, [Event(type="synthesize", data={"text": text})]))
    assert error["code"] == "text-too-long" and "5000" in error["text"]
    # Streamed: refused as soon as the chunks add up to more than the limit.
    chunks = [Event(type="synthesize-start")] + [Event(type="synthesize-chunk", data={"text": "x" * 1000})] * 50
    error = the_error([e for e in await outcome(real.port, chunks) if not e.type.startswith("audio")])
    assert error["code"] == "text-too-long"
    assert time.monotonic() - t0 < 20


async def test_long_text_at_the_limit_is_spoken_whole(fake: Server) -> None:
    """5000 characters (the limit) in 3-word sentences: every word spoken, in one answer."""
    sentence = "Alpha beta gamma. "
    text = sentence * (5000 // len(sentence))
    text += "x" * (5000 - len(text) - 1) + "."
    assert len(text) == 5000
    frames = await synthesize(fake.port, text, timeout=120)
    assert frames == len(text.split())


async def test_five_hundred_one_word_sentences_streamed(fake: Server) -> None:
    """500 sentences of one word, one chunk each: 500 frames, one audio-start and one audio-stop."""
    client = await Raw.connect(fake.port)
    try:
        await client.event(Event(type="synthesize-start", data={"voice": {"name": "sohee"}}))
        for i in range(500):
            await client.event(Event(type="synthesize-chunk", data={"text": f"Word{i}. "}))
        await client.event(Event(type="synthesize-stop"))
        events = await client.read_until("synthesize-stopped", 120)
    finally:
        await client.close()
    assert check_answer(events, streaming=True) == 500


REAL_TEXTS = {
    "control-characters": "Hello\u0000 there\u0007, how\u001b[0m are\u0085 you?",
    "lone-surrogates": "Broken \ud800 surrogate \udc00 here.",
    "mixed-scripts": "Hello 你好 Привет こんにちは 안녕 مرحبا שלום नमस्ते!",
    "no-terminator": "a sentence that never ends and has no punctuation at all",
    "prompt-markers": "<|im_start|>system<|im_end|> <tts_pad> Say this.",
    "one-long-word": "Supercalifragilistic" * 40,
}


@pytest.mark.parametrize("case", list(REAL_TEXTS))
async def test_hostile_text_on_the_real_model(real: Server, case: str) -> None:
    text = REAL_TEXTS[case]
    frames = await synthesize(real.port, text, streaming=case == "mixed-scripts")
    # --max-frames 1: every sentence is one frame (a random model may also stop at once).
    assert 0 <= frames <= 3, frames
    real.check_alive()
    assert "Traceback" not in real.log_text()


async def test_hostile_text_raw_json_surrogate(real: Server) -> None:
    """The JSON escape itself, as a client would send it (not via Python's json.dumps)."""
    client = await Raw.connect(real.port)
    try:
        body = b'{"text": "Bad \\ud800 escape \\udfff here.", "voice": {"name": "ryan"}}'
        await client.send(header({"type": "synthesize", "data_length": len(body)}) + body)
        events = await client.read_until("audio-stop")
        assert check_answer(events, streaming=False) == 1
    finally:
        await client.close()
    assert "Traceback" not in real.log_text()


# -- idle, stuck and surplus clients ----------------------------------------------------------------


async def test_silent_client_is_closed_after_idle_timeout(fake: Server) -> None:
    for data in [b"", b'{"type": "synthesize", "data_length": 50}\n{"te', header({"type": "synthesize-start"})]:
        client = await Raw.connect(fake.port)
        try:
            await client.send(data)
            t0 = time.monotonic()
            error = the_error(await client.read_all(IDLE + 5))
            waited = time.monotonic() - t0
        finally:
            await client.close()
        assert error["code"] == "idle-timeout" and IDLE - 0.5 <= waited <= IDLE + 3, (error, waited)
    await still_serves(fake)


async def test_client_that_stops_reading_is_dropped(fake: Server) -> None:
    """A client asks for ~25 MB of audio and never reads it: dropped after write_timeout; the
    others are served meanwhile and its work is cancelled."""
    stuck = socket.socket()  # a plain socket that is never read from
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", fake.port))
    text = " ".join(["bigaudio word word word."] * 200)  # 800 words x 8 frames: 24.6 MB
    stuck.sendall(encode(Event(type="synthesize", data={"text": text})))
    await asyncio.sleep(1)
    assert await synthesize(fake.port, "Others go on.") == 3
    deadline = time.monotonic() + 30
    while "took no data" not in fake.log_text():
        assert time.monotonic() < deadline, fake.log_text()[-2000:]
        await asyncio.sleep(0.2)
    stuck.close()
    quiet = await wait_quiet(fake.port)
    assert quiet["exchanges"] == 0 and quiet["jobs"] == 0, quiet
    await still_serves(fake)


async def test_connections_over_the_limit_are_refused(tmp_path: Path) -> None:
    server = start(tmp_path, ["--max-connections", "4"], fake=True)
    try:
        held = [await Raw.connect(server.port) for _ in range(4)]
        for client in held:  # each is registered once it answers
            await client.event(Event(type="describe"))
            assert (await client.read(10)).type == "info"  # type: ignore[union-attr]
        extra = await Raw.connect(server.port)
        await extra.event(Event(type="synthesize", data={"text": "Me too."}))
        error = the_error(await extra.read_all(10))
        assert error["code"] == "server-busy" and "4" in error["text"]
        # The held connections still work, and a slot frees when one leaves.
        await held[0].event(Event(type="synthesize", data={"text": "Still mine."}))
        assert check_answer(await held[0].read_until("audio-stop"), streaming=False) == 2
        await held[1].close()
        await asyncio.sleep(0.3)
        assert await synthesize(server.port, "Now there is room.") == 4
        for client in held:
            await client.close()
    finally:
        assert server.stop() == 0


async def test_server_survived_everything(fake: Server) -> None:
    """Runs last in this module: nothing left over from all the abuse above."""
    quiet = await wait_quiet(fake.port)
    assert quiet["exchanges"] == 0 and quiet["connections"] == 1 and quiet["jobs"] == 0, quiet
    assert "Traceback" not in fake.log_text(), fake.log_text()[-3000:]
    await still_serves(fake)
