"""The README's shell commands, copied as written.

Every command in a ```sh block is either run here exactly as written, or listed below with the
reason it cannot run on a CI machine (no GPU, no Docker engine, no internet). A new command in
the README fails this test until it is placed in one of the two lists.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
import wave
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

CHECKPOINT = ".venv/bin/python -m wyoming_qwen3tts.tools.random_checkpoint --size tiny --out /tmp/tiny"
SAY_TINY = (
    '.venv/bin/python -m wyoming_qwen3tts.say --model /tmp/tiny --device cpu --voice ryan --text "Hello." '
    "--out /tmp/hello.wav"
)
SERVE_TINY = "script/run --model /tmp/tiny --device cpu"
HEALTH = ".venv/bin/python -m wyoming_qwen3tts.tools.health_check --uri tcp://127.0.0.1:10200 --timeout 15"
# script/test is what CI runs (.ci/run), so it is run as written too, just not from inside itself.
RUN_HERE = {CHECKPOINT, SAY_TINY, SERVE_TINY, HEALTH, "script/test"}

# Command prefixes that cannot run here, and why.
NOT_HERE = {
    "docker ": "needs a Docker engine",
    "cp config.example.toml docker/config.toml": "part of the Docker quick start (no Docker engine here)",
    "mkdir -p docker/data": "part of the Docker quick start (no Docker engine here)",
    "printf 'VIDEO_GID": "reads the group of /dev/kfd, which only a ROCm host has",
    "echo 'Q3T_GPU_ARCHS": "configures a Docker image build (no Docker engine here)",
    "python3 -m venv .venv": "the first line of the AMD set-up; the next one needs download.pytorch.org",
    ".venv/bin/pip install torch --index-url": "needs download.pytorch.org (not reachable from CI)",
    ".venv/bin/python -m wyoming_qwen3tts.backends.kernels.build --arch gfx1201": "gfx1201 needs ROCm >= 6.3's hipcc "
    "(CI has ROCm 5.2's; tests/kernels/test_native_build.py compiles gfx1030/gfx90a and sm_90 instead)",
    "script/setup": "run by every script/run and script/test below",
    "script/run": "without --model /tmp/tiny it downloads the 1.7B model from the Hugging Face hub",
    ".venv/bin/python -m wyoming_qwen3tts.say --voice ryan": "downloads the 1.7B model from the Hugging Face hub",
    ".venv/bin/python -m wyoming_qwen3tts.say --model Qwen/": "downloads a model from the Hugging Face hub; "
    "tests/engine/test_say.py speaks cloned and designed voices with tiny checkpoints",
    "curl http://127.0.0.1:8000/v1/audio/speech": "needs a server with --http and a model; tests/http/test_http_server.py "
    "sends the same request to one, with the OpenAI client",
    "python -m wyoming_qwen3tts.voices --data-dir DATA_DIR ": "names the user's data dir and a model from the Hugging "
    "Face hub; tests/voices/test_voices_cli.py runs add, list, remove and design on tiny checkpoints",
    ".venv/bin/python -m wyoming_qwen3tts.tools.quant_check --model Qwen/": "needs the real model from the Hugging "
    "Face hub; tests/model/test_quant.py runs the tool on tiny checkpoints",
    ".venv/bin/wyoming-bench tts 127.0.0.1:10200": "times a server with the real model (minutes on CPU with the "
    "random checkpoint); tests/server/test_server.py runs wyoming-bench against the server",
}


def readme_commands() -> list[str]:
    """Shell commands of the README's ```sh blocks, continuation lines joined, comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def test_every_readme_command_is_run_here_or_explained() -> None:
    commands = readme_commands()
    assert SERVE_TINY in commands and HEALTH in commands
    for command in commands:
        if command in RUN_HERE:
            continue
        reasons = [why for prefix, why in NOT_HERE.items() if command.startswith(prefix) and why]
        assert reasons, f"README command neither run by the tests nor explained: {command}"


def _run(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(shlex.split(command), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_readme_trial_commands_work_as_written() -> None:
    """The "Try it without downloading" commands, then the README's health check against that server."""
    made = _run(CHECKPOINT, 300)
    assert made.returncode == 0, made.stderr
    said = _run(SAY_TINY, 300)
    assert said.returncode == 0, said.stderr
    with wave.open("/tmp/hello.wav") as w:
        assert w.getframerate() == 24000 and w.getnframes() > 0 and w.getnframes() % 1920 == 0

    server = subprocess.Popen(
        shlex.split(SERVE_TINY),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # script/run execs the server: one process group to stop
    )
    try:
        deadline = time.monotonic() + 240  # script/run first re-runs script/setup
        healthy = None
        while time.monotonic() < deadline and server.poll() is None:
            healthy = _run(HEALTH, 30)
            if healthy.returncode == 0:
                break
            time.sleep(1.0)
        assert server.poll() is None, server.stdout.read() if server.stdout else ""
        assert healthy is not None and healthy.returncode == 0, healthy.stdout + healthy.stderr if healthy else ""
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
    # Stopped by SIGTERM: the health check now fails, with a non-zero exit.
    assert _run(HEALTH.replace("--timeout 15", "--timeout 2"), 30).returncode != 0
