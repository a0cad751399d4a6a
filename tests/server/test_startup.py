"""First start: the server answers describe within one second of its process starting, while the
model is still loading (Home Assistant's setup gives describe one second), and logs what it runs on."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from ports import free_port
from tiny_server import tiny_args
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info


async def _describe(port: int) -> Info | None:
    try:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), timeout=1.0)
    except (TimeoutError, OSError):
        return None
    return Info.from_event(event) if event is not None and Info.is_type(event.type) else None


def test_describe_within_one_second_while_the_model_loads(tiny_checkpoint) -> None:
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "wyoming_qwen3tts", "--uri", f"tcp://127.0.0.1:{port}", *tiny_args(tiny_checkpoint)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        info = None
        while info is None and time.monotonic() - started < 10:
            info = asyncio.run(_describe(port))
            if info is None:
                time.sleep(0.02)
        answered = time.monotonic() - started
        assert info is not None, "no describe answer within 10 s"
        print(f"describe answered {answered:.3f} s after the process started")
        assert answered < 1.0, f"describe first answered {answered:.2f} s after start"
        assert {v.name for v in info.tts[0].voices} >= {"vivian", "ryan", "ono_anna", "sohee"}

        # The model was still loading then: "Ready" comes later, after the load and the warm-up.
        log: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            if "Ready" in line:
                break
        ready = time.monotonic() - started
        text = "".join(log)
        assert "Ready" in text, text
        assert ready > answered
        assert "Loading " in text
        assert "backend=torch" in text and "no GPU" in text, "the log must say which backend runs and why"
        assert "Warm-up synthesis took" in text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
