"""The HTTP app in-process, on the fake engine (tests/support/fake_engine.py: one frame per word, the word's index as
the sample value): what reaches the engine, every error status, the API key, limits and abuse,
draining, metrics.  The same app against the real server process and the official OpenAI client
is tests/http/test_http_server.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
from fake_engine import FakeEngine
from in_process_http import serve
from prometheus_text import metric_value

from wyoming_qwen3tts.decode_counters import DECODE
from wyoming_qwen3tts.errors import Qwen3TTSError
from wyoming_qwen3tts.metrics import Metrics
from wyoming_qwen3tts.request import SAMPLES_PER_FRAME

pytestmark = pytest.mark.timeout(60)

FRAME_BYTES = SAMPLES_PER_FRAME * 2


def samples(pcm: bytes) -> list[int]:
    """The fake engine's frames as their sample values (word index + 1)."""
    assert len(pcm) % FRAME_BYTES == 0
    return [int(np.frombuffer(pcm[i : i + FRAME_BYTES], "<i2")[0]) for i in range(0, len(pcm), FRAME_BYTES)]


async def error_of(response: aiohttp.ClientResponse) -> dict[str, object]:
    body = await response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]  # type: ignore[no-any-return]


# -- what reaches the engine ------------------------------------------------------------------------


async def test_sentences_in_order_as_one_stream() -> None:
    async with serve() as api:
        response = await api.speak(input="One two three. Four five!", voice="vivian", response_format="pcm")
        assert response.status == 200 and response.content_type == "audio/pcm"
        pcm = await response.read()
        assert [r.text for r in api.engine.requests] == ["One two three.", "Four five!"]
        assert samples(pcm) == [1, 2, 3, 1, 2]
        request = api.engine.requests[0]
        assert (request.speaker, request.language, request.instruct) == ("vivian", "auto", None)


async def test_voice_language_and_instructions_reach_the_engine() -> None:
    async with serve() as api:
        cases = [
            ({"voice": "ryan-calm"}, ("ryan", "english", "Speak slowly and calmly.")),
            ({"voice": "ryan-calm", "instructions": "Whisper."}, ("ryan", "english", "Whisper.")),
            ({"voice": {"id": "Sohee"}, "language": "de-DE"}, ("sohee", "german", None)),
            ({"voice": "aiden", "instructions": "   "}, ("aiden", "auto", None)),
            ({}, ("vivian", "auto", None)),  # no voice: the default (first speaker)
        ]
        for body, expected in cases:
            response = await api.speak(input="Hello there.", response_format="wav", **body)
            assert response.status == 200, await response.text()
            await response.read()
            request = api.engine.requests[-1]
            assert (request.speaker, request.language, request.instruct) == expected, body


async def test_sse_events() -> None:
    async with serve() as api:
        response = await api.speak(input="One two. Three.", voice="eric", response_format="pcm", stream_format="sse")
        assert response.status == 200 and response.content_type == "text/event-stream"
        text = await response.text()
    events = [json.loads(block.removeprefix("data: ")) for block in text.strip().split("\n\n")]
    assert all(block.startswith("data: ") for block in text.strip().split("\n\n"))
    deltas, done = events[:-1], events[-1]
    assert deltas and all(e["type"] == "speech.audio.delta" and set(e) == {"type", "audio"} for e in deltas)
    assert samples(b"".join(base64.b64decode(e["audio"]) for e in deltas)) == [1, 2, 1]
    assert done == {"type": "speech.audio.done", "usage": {"input_tokens": 15, "output_tokens": 3, "total_tokens": 18}}


async def test_models_voices_health() -> None:
    async with serve() as api:
        models = await (await api.http.get(f"{api.url}/v1/models")).json()
        assert models == {
            "object": "list",
            "data": [{"id": "tiny", "object": "model", "created": 0, "owned_by": "qwen"}],
        }
        voices = await (await api.http.get(f"{api.url}/v1/audio/voices")).json()
        by_id = {v["id"]: v for v in voices["data"]}
        assert list(by_id)[:9] == FakeEngine.speakers and by_id["vivian"]["kind"] == "speaker"
        assert by_id["ryan-calm"] | {"description": None} == {
            "id": "ryan-calm",
            "object": "voice",
            "name": "ryan-calm",
            "description": None,
            "languages": ["en"],
            "kind": "preset",
            "speaker": "ryan",
            "instruct": "Speak slowly and calmly.",
            "removable": False,
        }
        assert voices["can_add_voices"] is False  # a CustomVoice model: no cloned voices to add
        assert "Chinese" in by_id["vivian"]["description"] and "en" in by_id["vivian"]["languages"]
        assert voices["default_voice"] == "vivian" and voices["supports_instructions"] is True
        assert voices["languages"][0] == "auto" and "de" in voices["languages"]
        assert voices["response_formats"] == ["mp3", "opus", "aac", "flac", "wav", "pcm"]
        health = await api.http.get(f"{api.url}/healthz")
        assert health.status == 200 and (await health.json())["status"] == "ready"


# -- errors and their status codes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "Hi.", "voice": "nobody"}, "voice", "unknown-voice"),
        ({"input": "Hi.", "voice": "../../etc/passwd"}, "voice", "unknown-voice"),
        ({"input": "Hi.", "voice": "x" * 5000}, "voice", "unknown-voice"),
        ({"input": "Hi.", "voice": {"name": "ryan"}}, "voice", "invalid-request"),
        ({"input": ""}, "input", "empty-text"),
        ({"input": " \n\t "}, "input", "empty-text"),
        ({"input": "... ?!"}, "input", "empty-text"),  # nothing speakable
        ({"input": "\x00\x01\x02"}, "input", "empty-text"),  # control characters are cleaned away
        ({"input": "word " * 41}, "input", "text-too-long"),  # the limit here is 200 characters
        ({"input": 42}, "input", "invalid-request"),
        ({"voice": "ryan"}, "input", "invalid-request"),
        ({"input": "Hi.", "response_format": "ogg"}, "response_format", "unsupported-format"),
        ({"input": "Hi.", "stream_format": "chunks"}, "stream_format", "invalid-request"),
        ({"input": "Hi.", "speed": 0.1}, "speed", "invalid-request"),
        ({"input": "Hi.", "speed": 4.01}, "speed", "invalid-request"),
        ({"input": "Hi.", "speed": "fast"}, "speed", "invalid-request"),
        ({"input": "Hi.", "language": "klingon"}, "language", "unknown-language"),
        ({"input": "Hi.", "instructions": "x" * 1001}, "instructions", "text-too-long"),
    ],
)
async def test_bad_requests_are_400(body: dict[str, object], param: str, code: str) -> None:
    async with serve(max_text_chars=200) as api:
        response = await api.speak(**body)
        assert response.status == 400
        error = await error_of(response)
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code), error
        assert len(str(error["message"])) < 300  # nothing the client sent is echoed at length
        assert api.engine.requests == []


async def test_instructions_refused_when_the_model_has_none() -> None:
    engine = FakeEngine()
    engine.supports_instruct = False  # type: ignore[misc]
    async with serve(engine) as api:
        response = await api.speak(input="Hi.", instructions="Whisper.")
        assert response.status == 400 and (await error_of(response))["param"] == "instructions"
        voices = await (await api.http.get(f"{api.url}/v1/audio/voices")).json()
        assert voices["supports_instructions"] is False


async def test_503_while_the_model_loads_then_200() -> None:
    async with serve(load_delay=1.0) as api:
        response = await api.speak(input="Hi.")
        assert response.status == 503 and response.headers["Retry-After"]
        assert (await error_of(response))["code"] == "model-loading"
        health = await api.http.get(f"{api.url}/healthz")
        assert health.status == 503 and (await health.json())["status"] == "loading"
        assert await api.metric("qwen3tts_model_state", state="loading") == 1
        await api.service.loaded  # type: ignore[misc]
        assert (await api.speak(input="Hi.")).status == 200


async def test_503_when_the_model_failed() -> None:
    async with serve(load_error=True) as api:
        with contextlib.suppress(Qwen3TTSError):
            await api.service.loaded  # type: ignore[misc]
        response = await api.speak(input="Hi.")
        assert response.status == 503 and (await error_of(response))["code"] == "model-load-failed"
        assert (await api.http.get(f"{api.url}/healthz")).status == 503


async def test_429_when_full_then_served() -> None:
    async with serve(FakeEngine(frame_delay=0.05), max_connections=1) as api:
        busy = await api.speak(input="one two three four five six seven eight", response_format="pcm")
        await busy.content.readexactly(FRAME_BYTES)  # it is being answered
        refused = await api.speak(input="Hi.")
        assert refused.status == 429 and refused.headers["Retry-After"] == "1"
        error = await error_of(refused)
        assert (error["type"], error["code"]) == ("rate_limit_error", "server-busy")
        assert len(await busy.read()) == 7 * FRAME_BYTES
        assert (await api.speak(input="Hi.")).status == 200


async def test_engine_error_before_audio_gets_a_status() -> None:
    async with serve(FakeEngine(fail_on="explode")) as api:
        response = await api.speak(input="Please explode now.")
        assert response.status == 500 and (await error_of(response))["code"] == "synthesis-failed"
        assert await api.metric("qwen3tts_speech_requests_total", protocol="http", outcome="synthesis-failed") == 1
        assert (await api.speak(input="Still here?")).status == 200


async def test_engine_error_after_audio_cuts_audio_and_ends_sse_with_an_error() -> None:
    async with serve(FakeEngine(fail_on="explode")) as api:
        text = "First sentence is fine. Then explode."
        response = await api.speak(input=text, response_format="pcm")
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):  # the chunked body never ends properly
            await response.read()
        response = await api.speak(input=text, response_format="pcm", stream_format="sse")
        events = [json.loads(b.removeprefix("data: ")) for b in (await response.text()).strip().split("\n\n")]
        assert [e["type"] for e in events] == ["speech.audio.delta"] * 4 + ["error"]
        assert events[-1]["error"]["code"] == "synthesis-failed" and events[-1]["error"]["type"] == "server_error"
        assert (await api.speak(input="Still here?")).status == 200


# -- HTTP-level abuse -----------------------------------------------------------------------------


async def test_body_limits_and_content_types() -> None:
    async with serve(max_body_bytes=4096) as api:
        url = f"{api.url}/v1/audio/speech"
        big = json.dumps({"input": "word " * 2000})
        response = await api.http.post(url, data=big, headers={"Content-Type": "application/json"})
        assert response.status == 413 and (await error_of(response))["code"] == "body-too-large"

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: refused while reading
            for _ in range(20):
                yield b" " * 1000

        response = await api.http.post(url, data=chunked(), headers={"Content-Type": "application/json"})
        assert response.status == 413

        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            response = await api.http.post(url, data='{"input": "Hi."}', headers={"Content-Type": content_type})
            assert response.status == 415, content_type
        for raw in (b"{not json", b"\xff\xfe", b"[]", b"null", b"[" * 1500 + b"]" * 1500):
            response = await api.http.post(url, data=raw, headers={"Content-Type": "application/json"})
            assert response.status == 400, raw[:10]
            await error_of(response)
        assert api.engine.requests == []
        assert (await api.speak(input="Hi.")).status == 200


async def test_unknown_routes_and_methods_in_openai_shape() -> None:
    async with serve() as api:
        response = await api.http.get(f"{api.url}/v1/nothing")
        assert response.status == 404 and (await error_of(response))["type"] == "invalid_request_error"
        response = await api.http.get(f"{api.url}/v1/audio/speech")
        assert response.status == 405 and "POST" in response.headers["Allow"]
        await error_of(response)
        for path in ("/static/%2e%2e/%2e%2e/etc/passwd", "/static/..%2f..%2fetc/passwd", "/static/nothing.js"):
            response = await api.http.get(f"{api.url}{path}")
            assert response.status in (403, 404), path
            assert "root:" not in await response.text()


async def test_slow_body_is_408() -> None:
    async with serve(body_timeout=0.5) as api:
        host, port = api.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5)
        assert status.startswith(b"HTTP/1.1 408"), status
        writer.close()
        assert (await api.speak(input="Hi.")).status == 200


async def test_disconnect_mid_stream_stops_the_engine() -> None:
    async with serve(FakeEngine(frame_delay=0.02)) as api:
        text = " ".join(["word"] * 70) + "."  # one sentence of 70 frames, 20 ms each
        response = await api.speak(input=text, response_format="pcm")
        await response.content.readexactly(FRAME_BYTES)
        response.connection.transport.abort()  # type: ignore[union-attr]
        response.release()
        for _ in range(100):
            if api.engine.cancelled:
                break
            await asyncio.sleep(0.02)
        assert api.engine.cancelled == [text] and api.engine.frames_done < 40
        assert await api.metric("qwen3tts_speech_requests_total", protocol="http", outcome="client-gone") == 1
        assert await api.metric("qwen3tts_active_streams", protocol="http") == 0
        assert api.service.connections == set()
        assert (await api.speak(input="Still here?")).status == 200


async def test_client_that_stops_reading_is_dropped() -> None:
    async with serve(FakeEngine(), write_timeout=0.5) as api:
        host, port = api.url.removeprefix("http://").split(":")
        stuck = socket.socket()
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.setblocking(False)
        await asyncio.get_running_loop().sock_connect(stuck, (host, int(port)))
        body = json.dumps({"model": "x", "input": "word " * 900, "response_format": "pcm"}).encode()
        head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        await asyncio.get_running_loop().sock_sendall(stuck, head.encode() + body)
        # 900 frames are 3.5 MB: more than the socket buffers hold, so the server's writes stall.
        for _ in range(200):
            if await api.metric("qwen3tts_speech_requests_total", protocol="http", outcome="client-gone"):
                break
            await asyncio.sleep(0.05)
        assert await api.metric("qwen3tts_speech_requests_total", protocol="http", outcome="client-gone") == 1
        assert len(api.engine.requests) < 12  # of the text's 12 sentences, the rest were never spoken
        stuck.close()
        assert (await api.speak(input="Still here?")).status == 200


# -- the API key ------------------------------------------------------------------------------------


async def test_api_key() -> None:
    async with serve(api_key="s3cret") as api:
        good = {"Authorization": "Bearer s3cret"}
        for path in ("/healthz", "/", "/static/app.js", "/static/style.css"):
            assert (await api.http.get(f"{api.url}{path}")).status == 200, path
        for path in ("/v1/models", "/v1/audio/voices", "/metrics", "/v1/nothing", "/static/../v1/models"):
            response = await api.http.get(f"{api.url}{path}")
            assert response.status == 401, path
            assert response.headers["WWW-Authenticate"] == "Bearer"
            error = await error_of(response)
            assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
            assert (await api.http.get(f"{api.url}{path}", headers=good)).status in (200, 404), path
        # Raw request lines, not normalised by a client: no spelling of a path reaches a route unkeyed.
        host, port = api.url.removeprefix("http://").split(":")
        for path in (
            "/static/../v1/models",
            "/static/%2e%2e/v1/models",
            "//v1/models",
            "/./v1/models",
            "/static/..%2fv1/models",
        ):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert answer.split(b" ", 2)[1] in (b"401", b"404") and b'"object": "list"' not in answer, path
        for wrong in ("Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer"):
            assert (await api.speak(input="Hi.", headers={"Authorization": wrong})).status == 401, wrong
        assert api.engine.requests == []
        assert (await api.speak(input="Hi.", headers=good)).status == 200
        assert (await api.speak(input="Hi.", headers={"Authorization": "bearer  s3cret "})).status == 200


async def test_page_and_its_files() -> None:
    async with serve() as api:
        page = await api.http.get(f"{api.url}/")
        assert page.status == 200 and page.content_type == "text/html"
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        html = await page.text()
        for asset in ("/static/app.js", "/static/style.css", "/static/favicon.svg"):
            assert asset in html
            assert (await api.http.get(f"{api.url}{asset}")).status == 200


# -- metrics ----------------------------------------------------------------------------------------


async def test_metrics() -> None:
    async with serve(FakeEngine(frame_delay=0.01)) as api:
        assert await (await api.speak(input="One two three.", response_format="wav")).read()
        assert (await api.speak(input="Hi.", voice="nobody")).status == 400
        before = DECODE.snapshot()
        text = await (await api.http.get(f"{api.url}/metrics")).text()
        DECODE.steps += 3  # as the batching scheduler counts (FakeEngine runs none)
        DECODE.codec_wait_s += 0.25
        later = await (await api.http.get(f"{api.url}/metrics")).text()
    value = lambda name, **labels: metric_value(text, name, **labels)  # noqa: E731
    # The decode pipeline's counters (decode_counters.py), read at each scrape.
    assert value("qwen3tts_decode_steps_total") == before["steps"]
    assert metric_value(later, "qwen3tts_decode_steps_total") == before["steps"] + 3
    assert metric_value(later, "qwen3tts_codec_gpu_wait_seconds_total") == pytest.approx(before["codec_wait_s"] + 0.25)
    for name in (
        "decode_frames",
        "decode_admissions",
        "decode_admitted_streams",
        "decode_gpu_wait_seconds",
        "codec_calls",
        "codec_frames",
    ):
        assert value(f"qwen3tts_{name}_total") >= 0, name
    assert value("qwen3tts_speech_requests_total", protocol="http", outcome="ok") == 1
    assert value("qwen3tts_http_requests_total", route="/v1/audio/speech", method="POST", status="200") == 1
    assert value("qwen3tts_http_requests_total", route="/v1/audio/speech", method="POST", status="400") == 1
    assert value("qwen3tts_time_to_first_audio_seconds_count", protocol="http") == 1
    assert 0 < value("qwen3tts_time_to_first_audio_seconds_sum", protocol="http") < 5
    assert value("qwen3tts_speech_duration_seconds_count", protocol="http") == 1
    assert value("qwen3tts_audio_frames_total", protocol="http") == 3
    assert value("qwen3tts_synthesis_seconds_total", protocol="http") > 0.02
    assert value("qwen3tts_frames_per_second_count", protocol="http") == 1
    assert value("qwen3tts_active_streams", protocol="http") == 0
    assert value("qwen3tts_active_streams", protocol="wyoming") == 0
    assert value("qwen3tts_engine_jobs") == 0
    assert value("qwen3tts_model_state", state="ready") == 1
    assert "qwen3tts_gpu_memory_bytes" not in text  # no GPU here (tests/http/test_http_server.py has the GPU check)
    # The process's own, for the soak tool (wyoming_qwen3tts/tools/soak.py --metrics): RSS, open fds, OS threads.
    assert value("process_resident_memory_bytes") > 10_000_000 and value("process_open_fds") >= 3
    assert value("qwen3tts_process_threads") >= 1


def test_speech_meter_for_the_wyoming_handler() -> None:
    """The API the Wyoming handler calls: one meter per exchange, finished once."""
    metrics = Metrics()
    started = time.monotonic() - 0.05
    meter = metrics.speech("wyoming", started_at=started)
    assert metric_value(_scrape(metrics), "qwen3tts_active_streams", protocol="wyoming") == 1
    meter.audio(2)
    meter.audio(4)
    meter.synthesized(0.5)
    meter.finish("ok")
    meter.finish("client-gone")  # ignored: already finished
    text = _scrape(metrics)
    assert metric_value(text, "qwen3tts_speech_requests_total", protocol="wyoming", outcome="ok") == 1
    assert metric_value(text, "qwen3tts_speech_requests_total", protocol="wyoming", outcome="client-gone") == 0
    assert metric_value(text, "qwen3tts_active_streams", protocol="wyoming") == 0
    assert metric_value(text, "qwen3tts_audio_frames_total", protocol="wyoming") == 6
    assert 0.05 <= metric_value(text, "qwen3tts_time_to_first_audio_seconds_sum", protocol="wyoming") < 1
    assert metric_value(text, "qwen3tts_frames_per_second_sum", protocol="wyoming") == 12.0
    with pytest.raises(Qwen3TTSError), metrics.speech("wyoming"):
        raise Qwen3TTSError("engine exploded")
    assert (
        metric_value(_scrape(metrics), "qwen3tts_speech_requests_total", protocol="wyoming", outcome="synthesis-failed")
        == 1
    )


def _scrape(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


# -- draining (SIGTERM: __main__ calls service.drain) -----------------------------------------------


async def test_drain_finishes_streams_then_refuses() -> None:
    async with serve(FakeEngine(frame_delay=0.02)) as api:
        response = await api.speak(input="one two three four five six seven eight nine ten.", response_format="pcm")
        first = await response.content.readexactly(FRAME_BYTES)
        drained = asyncio.ensure_future(api.service.drain(5))
        await asyncio.sleep(0.05)
        refused = await api.speak(input="Too late.")
        assert refused.status == 503 and (await error_of(refused))["code"] == "shutting-down"
        assert samples(first + await response.read()) == list(range(1, 11))
        assert await drained is True


async def test_drain_timeout_aborts_with_an_error() -> None:
    async with serve(FakeEngine(frame_delay=0.05)) as api:
        text = " ".join(["word"] * 100) + "."
        sse = await api.speak(input=text, response_format="pcm", stream_format="sse")
        audio = await api.speak(input=text, response_format="pcm")
        await sse.content.readline()
        await audio.content.readexactly(FRAME_BYTES)
        assert await api.service.drain(0.2) is False
        body = (await sse.text()).strip().split("\n\n")
        assert json.loads(body[-1].removeprefix("data: "))["error"]["code"] == "shutting-down"
        with pytest.raises(aiohttp.ClientPayloadError):
            await audio.read()
        assert api.service.connections == set()
        assert await api.metric("qwen3tts_speech_requests_total", protocol="http", outcome="shutting-down") == 2
