"""The Docker health check against live Wyoming servers: healthy, loading, wedged, dead."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from ports import free_port
from tiny_server import tiny_args
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncServer

from wyoming_qwen3tts.engine import Engine
from wyoming_qwen3tts.tools import health_check
from wyoming_qwen3tts.tools.health_check import UnhealthyError, check

MODULE = "wyoming_qwen3tts.tools.health_check"
ATTRIBUTION = Attribution(name="test", url="https://example.invalid")


def _voice(name: str, installed: bool = True) -> TtsVoice:
    return TtsVoice(
        name=name,
        description=name,
        attribution=ATTRIBUTION,
        installed=installed,
        version=None,
        languages=["en"],
    )


def _info(*, installed: bool = True, voices: list[TtsVoice] | None = None) -> Info:
    program = TtsProgram(
        name="qwen3tts",
        description="test program",
        attribution=ATTRIBUTION,
        installed=installed,
        version="9.9.9",
        voices=[_voice("ryan"), _voice("vivian")] if voices is None else voices,
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


class _DescribeHandler(AsyncEventHandler):
    """Answers describe with a fixed Info; `mode` makes it misbehave in the ways a server can."""

    def __init__(self, info: Info | None, mode: str, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._info = info
        self._mode = mode

    async def handle_event(self, event: Event) -> bool:
        if not Describe.is_type(event.type):
            return True
        if self._mode == "silent":  # a wedged server: accepts, reads, never answers
            await asyncio.sleep(3600)
        if self._mode == "close":  # a server that drops the connection
            return False
        if self._mode == "noise":  # something unrelated first, then the real answer
            await self.write_event(Event(type="ping"))
        assert self._info is not None
        await self.write_event(self._info.event())
        return True


@asynccontextmanager
async def _serve(info: Info | None, mode: str = "ok") -> AsyncIterator[str]:
    """A real wyoming AsyncServer on a free localhost port; yields its URI."""
    uri = f"tcp://127.0.0.1:{free_port()}"
    server = AsyncServer.from_uri(uri)

    def factory(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> AsyncEventHandler:
        return _DescribeHandler(info, mode, r, w)

    await server.start(factory)
    try:
        yield uri
    finally:
        await server.stop()


async def _run_cli(*args: str) -> tuple[int, str, str, float]:
    """Run the module the way the Docker HEALTHCHECK does; returns (rc, stdout, stderr, seconds)."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        MODULE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - started


async def test_healthy_server_passes_in_process() -> None:
    async with _serve(_info()) as uri:
        report = await check(uri, timeout=5)
    assert report.program == "qwen3tts"
    assert report.version == "9.9.9"
    assert report.voices == 2
    assert report.streaming is True
    assert "2 voice(s)" in report.summary()


async def test_healthy_server_cli_exits_zero() -> None:
    async with _serve(_info()) as uri:
        rc, out, err, _ = await _run_cli("--uri", uri, "--timeout", "10")
    assert rc == 0, err
    assert out.startswith("healthy: TTS program 'qwen3tts'")
    assert err == ""


async def test_unrelated_event_before_info_is_skipped() -> None:
    async with _serve(_info(), mode="noise") as uri:
        report = await check(uri, timeout=5)
    assert report.voices == 2


async def test_dead_port_fails_fast() -> None:
    uri = f"tcp://127.0.0.1:{free_port()}"  # bound then released: nothing listens there
    rc, out, err, seconds = await _run_cli("--uri", uri, "--timeout", "15")
    assert rc == 1
    assert out == ""
    assert "cannot connect" in err
    # Refused connections must not wait for the timeout: Docker runs this every 30 s.
    assert seconds < 10


async def test_wedged_server_times_out() -> None:
    async with _serve(_info(), mode="silent") as uri:
        started = time.monotonic()
        with pytest.raises(UnhealthyError, match="within 0.5 s"):
            await check(uri, timeout=0.5)
        assert time.monotonic() - started < 3


async def test_wedged_server_cli_exits_one() -> None:
    async with _serve(_info(), mode="silent") as uri:
        rc, _, err, _ = await _run_cli("--uri", uri, "--timeout", "1")
    assert rc == 1
    assert "no info" in err


async def test_connection_closed_without_info() -> None:
    async with _serve(_info(), mode="close") as uri:
        with pytest.raises(UnhealthyError, match="closed the connection"):
            await check(uri, timeout=5)


async def test_server_without_tts_program() -> None:
    async with _serve(Info()) as uri:
        with pytest.raises(UnhealthyError, match="no TTS program"):
            await check(uri, timeout=5)


async def test_program_not_installed_is_unhealthy() -> None:
    async with _serve(_info(installed=False)) as uri:
        with pytest.raises(UnhealthyError, match="no installed TTS program"):
            await check(uri, timeout=5)


async def test_program_without_installed_voice_is_unhealthy() -> None:
    async with _serve(_info(voices=[_voice("ryan", installed=False)])) as uri:
        with pytest.raises(UnhealthyError, match="no installed voice"):
            await check(uri, timeout=5)


async def test_bad_uri_is_reported_not_raised() -> None:
    rc, _, err, _ = await _run_cli("--uri", "http://127.0.0.1:10200")
    assert rc == 1
    assert "bad --uri" in err


def test_nonpositive_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        health_check.main(["--timeout", "0"])
    assert exc.value.code == 2
    assert "--timeout must be positive" in capsys.readouterr().err


def test_defaults_match_the_docker_port() -> None:
    # The image's HEALTHCHECK relies on these defaults matching the server's port 10200.
    assert health_check.DEFAULT_URI == "tcp://127.0.0.1:10200"
    assert health_check.DEFAULT_TIMEOUT_S == 15.0


# The server starts without a model (describe answers at once) but exits when the load fails; until
# the engine can load checkpoints this is an expected, reported failure rather than a skip.  The
# marker switches itself off once Engine.from_pretrained exists.
@pytest.mark.xfail(
    not hasattr(Engine, "from_pretrained"),
    reason="Engine.from_pretrained not implemented yet: the server exits when the model load fails",
    raises=pytest.fail.Exception,
    strict=True,
)
async def test_real_server_is_healthy(tiny_checkpoint: Path) -> None:
    """The real server (tiny random checkpoint, CPU) passes the same check the Docker image runs."""
    port = free_port()
    uri = f"tcp://127.0.0.1:{port}"
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "wyoming_qwen3tts",
        "--uri",
        uri,
        *tiny_args(tiny_checkpoint),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        # Poll like Docker does during the start period, until healthy or the server dies.
        deadline = time.monotonic() + 120
        rc, out, err = 1, "", ""
        while time.monotonic() < deadline and server.returncode is None:
            rc, out, err, _ = await _run_cli("--uri", uri, "--timeout", "5")
            if rc == 0:
                break
            await asyncio.sleep(0.5)
        if server.returncode is not None:
            assert server.stderr is not None
            log = (await server.stderr.read()).decode(errors="replace")
            pytest.fail(f"server exited with {server.returncode} before it was healthy:\n{log[-3000:]}")
        assert rc == 0, err
        assert "TTS program 'qwen3-tts'" in out
    finally:
        if server.returncode is None:
            server.terminate()
            try:
                await asyncio.wait_for(server.wait(), 20)
            except TimeoutError:
                server.kill()
                await server.wait()
