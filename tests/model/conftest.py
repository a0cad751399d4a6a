"""The model suites' CPU engines (torch backend, float32) on the tiny checkpoints, one of each kind per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from wyoming_qwen3tts.engine import Engine, EngineOptions


def _engine(path: Path) -> Engine:
    return Engine.from_pretrained(str(path), EngineOptions(device="cpu", backend="torch", max_streams=1))


@pytest.fixture(scope="module")
def custom(tiny_checkpoint: Path) -> Engine:
    return _engine(tiny_checkpoint)


@pytest.fixture(scope="module")
def design(tiny_voice_design_checkpoint: Path) -> Engine:
    return _engine(tiny_voice_design_checkpoint)


@pytest.fixture(scope="module")
def base(tiny_base_checkpoint: Path) -> Engine:
    return _engine(tiny_base_checkpoint)
