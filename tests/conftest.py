"""Shared test fixtures: tiny random checkpoints written once per session, and GPU-test skipping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from wyoming_qwen3tts.tools.random_checkpoint import write_random_checkpoint

# Tests of synthesis need every request synthesized: servers they start (subprocesses included, which inherit the
# environment) replay nothing unless a test turns the announcement cache on (tests/engine/test_announcements.py).
os.environ.setdefault("WYOMING_QWEN3TTS_ANNOUNCEMENT_CACHE", "false")


def has_gpu() -> bool:
    """True when torch sees a CUDA or ROCm device (ROCm builds report through torch.cuda too)."""
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CustomVoice checkpoint (size "tiny": 1b7-like, has small_to_mtp_projection), float32."""
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_checkpoint_06b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random CustomVoice checkpoint (size "tiny-0.6b": 0b6-like, no projection, no instruct), float32."""
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-0.6b", "tiny-0.6b", seed=0)


@pytest.fixture(scope="session")
def tiny_base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Base (voice clone) checkpoint, 1b7-like (has small_to_mtp_projection), float32."""
    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-base", "tiny", seed=0, model_type="base")


@pytest.fixture(scope="session")
def tiny_base_checkpoint_06b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Base checkpoint, 0b6-like (no projection), float32."""
    return write_random_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "tiny-0.6b-base", "tiny-0.6b", seed=0, model_type="base"
    )


@pytest.fixture(scope="session")
def tiny_voice_design_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random VoiceDesign checkpoint (1b7-like), float32."""
    return write_random_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "tiny-voice-design", "tiny", seed=0, model_type="voice_design"
    )


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module (pytestmark = pytest.mark.usefixtures("one_torch_thread")): the tiny
    codec runs thousands of small ops, and with several OpenMP threads on a busy 2-core machine the hand-offs
    cost far more than the work (measured: 300 ms vs 6 ms per streamed frame)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
