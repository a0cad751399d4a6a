"""Tiny random models on the GPU for the kernel tests: loaded from a checkpoint, prompt token ids, and the kernel
backend's greedy codes checked against the torch backend's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

DEV = "cuda"


def text_ids(n: int, seed: int = 0) -> list[int]:
    """A chat prompt's token ids around `n` random text tokens."""
    rng = np.random.default_rng(seed)
    body = [int(t) for t in rng.integers(300, 20000, size=n)]
    return [151644, 77091, 198, *body, 151645, 198, 151644, 77091, 198]


def load_model(path: Path, dtype: torch.dtype):
    from wyoming_qwen3tts.model.checkpoint import load_checkpoint
    from wyoming_qwen3tts.model.talker import Qwen3TTSModel

    ck = load_checkpoint(path, dtype=dtype, device=DEV)
    return Qwen3TTSModel.from_tensors(ck.config, ck.tensors, dtype=dtype, device=DEV)


def load_model_without_eos(path: Path, dtype: torch.dtype = torch.float32):
    """load_model, with the EOS code's row of the codec head zeroed: no stream ends early, every frame is compared."""
    model = load_model(path, dtype)
    with torch.no_grad():
        model.talker.codec_head.weight[2150].zero_()
    return model


def greedy_parity(model, n_frames: int, text_len: int = 12, streaming: bool = False, options=None) -> int:
    """The kernel backend's greedy codes equal the torch backend's, code for code; returns the frames compared.
    options: the kernel backend's KernelOptions (None: from the environment)."""
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.torch_backend import TorchBackend
    from wyoming_qwen3tts.model.prompt import build_prompt
    from wyoming_qwen3tts.request import SamplingParams

    prompt = build_prompt(model, text_ids(text_len), "ryan", "english", non_streaming_text=not streaming)
    greedy = SamplingParams.greedy()
    ref = TorchBackend(model).start(prompt, greedy, 0, n_frames).next_frames(n_frames)
    kb = KernelBackend(model, options)
    sess = kb.start(prompt, greedy, 0, n_frames)
    got = np.concatenate([sess.next_frames(37) for _ in range((n_frames + 36) // 37 + 1)])
    assert got.shape == ref.shape, (got.shape, ref.shape)
    mism = np.argwhere(got != ref)
    assert mism.size == 0, f"first mismatch at frame/code {mism[0].tolist()} of {len(ref)} frames"
    return len(ref)
