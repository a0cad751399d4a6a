"""Health check: does a Wyoming TTS server answer ``describe`` with a usable TTS program?

``python -m wyoming_qwen3tts.tools.health_check [--uri tcp://127.0.0.1:10200] [--timeout 15]``

Used by the Docker ``HEALTHCHECK`` and by people checking a running server.  It does a real
``describe`` -> ``info`` round-trip instead of a bare TCP connect because a bound port stays open even
when the event loop is wedged or the server never finished starting; Home Assistant does exactly this
round-trip (with a 1 s timeout) when it sets the integration up, so "healthy" here means "Home
Assistant can add it".

Exit status: 0 when healthy (one line on stdout saying what answered), 1 otherwise (one line on
stderr saying why).  Docker reserves exit status 2 for health checks, so every failure is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from wyoming.client import AsyncClient
from wyoming.info import Describe, Info

DEFAULT_URI = "tcp://127.0.0.1:10200"
DEFAULT_TIMEOUT_S = 15.0

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1


class UnhealthyError(Exception):
    """The server was reached (or not) but is not usable; the message says why."""


@dataclass(frozen=True)
class HealthReport:
    """What a healthy server advertised."""

    program: str
    version: str | None
    voices: int
    streaming: bool
    seconds: float

    def summary(self) -> str:
        streaming = "streaming" if self.streaming else "non-streaming"
        version = f" {self.version}" if self.version else ""
        return (
            f"healthy: TTS program '{self.program}'{version}, {self.voices} voice(s), "
            f"{streaming}, answered in {self.seconds * 1000:.0f} ms"
        )


def _report_from_info(info: Info, started: float) -> HealthReport:
    """Pick the program Home Assistant would use and check that it can speak."""
    if not info.tts:
        raise UnhealthyError("server answered describe but advertises no TTS program")
    # Home Assistant uses the first *installed* TTS program and skips uninstalled voices (see
    # docs on the HA wyoming integration), so anything less is unusable from HA.
    program = next((p for p in info.tts if p.installed), None)
    if program is None:
        names = ", ".join(p.name for p in info.tts)
        raise UnhealthyError(f"no installed TTS program (advertised: {names}); still loading?")
    voices = [v for v in program.voices if v.installed]
    if not voices:
        raise UnhealthyError(f"TTS program '{program.name}' has no installed voice")
    return HealthReport(
        program=program.name,
        version=program.version,
        voices=len(voices),
        streaming=bool(program.supports_synthesize_streaming),
        seconds=time.monotonic() - started,
    )


async def _round_trip(uri: str, timeout: float) -> HealthReport:
    started = time.monotonic()
    try:
        client = AsyncClient.from_uri(uri, connect_timeout=timeout, read_timeout=timeout)
    except ValueError as err:  # unsupported scheme, missing port, ...
        raise UnhealthyError(f"bad --uri {uri!r}: {err}") from err
    try:
        async with client:
            await client.write_event(Describe().event())
            while True:
                event = await client.read_event()
                if event is None:
                    raise UnhealthyError("server closed the connection before sending info")
                # Servers may send unrelated events first (nothing we know of does); skip them.
                if Info.is_type(event.type):
                    return _report_from_info(Info.from_event(event), started)
    except TimeoutError:
        # TimeoutError is an OSError; let check() report it as a timeout, not a connect failure.
        raise
    except OSError as err:  # refused, unreachable, no such socket file, reset, ...
        raise UnhealthyError(f"cannot connect to {uri}: {err}") from err


async def check(uri: str = DEFAULT_URI, timeout: float = DEFAULT_TIMEOUT_S) -> HealthReport:
    """Run one describe round-trip; raise UnhealthyError with the reason when it fails.

    ``timeout`` bounds the whole exchange (connect + describe + info), not each step, so the
    Docker HEALTHCHECK's own timeout can be set just above it.
    """
    try:
        return await asyncio.wait_for(_round_trip(uri, timeout), timeout)
    except TimeoutError as err:  # asyncio.TimeoutError is TimeoutError since Python 3.11
        raise UnhealthyError(f"no info from {uri} within {timeout:g} s") from err


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_qwen3tts.tools.health_check",
        description="Exit 0 if a Wyoming TTS server answers describe with an installed TTS program.",
    )
    parser.add_argument("--uri", default=DEFAULT_URI, help=f"server address (default {DEFAULT_URI})")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds for the whole round-trip (default {DEFAULT_TIMEOUT_S:g})",
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        report = asyncio.run(check(args.uri, args.timeout))
    except UnhealthyError as err:
        print(f"unhealthy: {err}", file=sys.stderr)
        return EXIT_UNHEALTHY
    print(report.summary())
    return EXIT_HEALTHY


if __name__ == "__main__":
    sys.exit(main())
