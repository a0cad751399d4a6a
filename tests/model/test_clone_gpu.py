"""The fused-kernel decode loop on Base (cloned voices) and VoiceDesign prompts: float32 greedy codes equal the torch
backend's frame for frame. The Talker and CodePredictor have the same shapes in all three model types, so the same
backend must serve them unchanged; only the prompts differ (an x-vector in the voice slot, the clip's codes and
transcript in context, a description in front).

Tiny checkpoints always; Q3T_FULL=1 adds full-size random Base 1.7B, Base 0.6B and VoiceDesign 1.7B weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.model.prompt import ClonePrompt, build_prompt, chat_instruct, chat_ref_text, chat_text

pytestmark = pytest.mark.gpu

DEV = "cuda"
ALL_TYPES = ("custom_voice", "base", "voice_design")
TEXT = "The kernels speak this sentence in a cloned voice, and then another one after it."
DESCRIPTION = "A calm, warm voice of an older man, speaking slowly."


def _tiny(path: Path):
    from wyoming_qwen3tts.model.checkpoint import load_checkpoint
    from wyoming_qwen3tts.model.talker import Qwen3TTSModel
    from wyoming_qwen3tts.model.tokenizer import TextTokenizer

    ckpt = load_checkpoint(path, dtype=torch.float32, device="cpu", model_types=ALL_TYPES)
    model = Qwen3TTSModel.from_tensors(ckpt.config, ckpt.tensors, dtype=torch.float32, device=DEV)
    return ckpt, TextTokenizer.from_dir(path), model


def _clip(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    rng = np.random.default_rng(7)
    return (0.3 * np.sin(2 * np.pi * (150 + 250 * t) * t) + 0.03 * rng.standard_normal(t.size)).astype(np.float32)


def _random_voice(hidden: int, frames: int, text_ids: list[int] | None) -> ClonePrompt:
    """A clone prompt without the encoders: an x-vector of codec-embedding scale and random clip codes."""
    g = torch.Generator().manual_seed(frames)
    x = torch.randn(hidden, generator=g) * 0.02
    if not frames:
        return ClonePrompt(speaker_embedding=x)
    return ClonePrompt(x, torch.randint(0, 2048, (frames, 16), generator=g), text_ids)


def _kernels_equal_torch(model, prompt, frames: int) -> int:
    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.torch_backend import TorchBackend
    from wyoming_qwen3tts.request import SamplingParams

    greedy = SamplingParams.greedy()
    ref = TorchBackend(model).start(prompt, greedy, 0, frames).next_frames(frames)
    session = KernelBackend(model).start(prompt, greedy, 0, frames)
    got = np.concatenate([session.next_frames(29) for _ in range(frames // 29 + 2)])
    assert got.shape == ref.shape, (got.shape, ref.shape)
    bad = np.argwhere(got != ref)
    assert bad.size == 0, f"first mismatch at frame/code {bad[0].tolist()} of {len(ref)} frames"
    return len(ref)


def _no_eos(model) -> None:
    with torch.no_grad():
        model.talker.codec_head.weight[model.cfg.talker.codec_eos_token_id].zero_()  # every frame is compared


@pytest.mark.parametrize("non_streaming", [False, True])
@pytest.mark.parametrize("x_vector_only", [True, False])
@pytest.mark.parametrize("fixture", ["tiny_base_checkpoint", "tiny_base_checkpoint_06b"])
def test_tiny_clone_prompts_kernels_equal_torch(
    fixture: str, x_vector_only: bool, non_streaming: bool, request: pytest.FixtureRequest
) -> None:
    from wyoming_qwen3tts.model.clone import VoiceCloner
    from wyoming_qwen3tts.model.reference_audio import reference_audio_from_array

    ckpt, tok, model = _tiny(request.getfixturevalue(fixture))
    voice = VoiceCloner.from_checkpoint(ckpt, tok).clone(
        reference_audio_from_array(_clip(4.0), 24000), "A short sentence read aloud.", x_vector_only=x_vector_only
    )
    _no_eos(model)
    prompt = build_prompt(model, tok.encode(chat_text(TEXT)), voice, "english", non_streaming_text=non_streaming)
    assert _kernels_equal_torch(model, prompt, 120) == 120


def test_tiny_clone_with_a_30s_clip_kernels_equal_torch(tiny_base_checkpoint: Path) -> None:
    """The longest clone prompt the defaults allow (a 30 s clip: 375 codec frames in the prompt), past the largest
    captured prefill bucket."""
    _, tok, model = _tiny(tiny_base_checkpoint)
    _no_eos(model)
    voice = _random_voice(model.cfg.talker.hidden_size, 375, tok.encode(chat_ref_text("Thirty seconds of speech.")))
    prompt = build_prompt(model, tok.encode(chat_text(TEXT)), voice, "german", non_streaming_text=False)
    assert prompt.length > 380
    assert _kernels_equal_torch(model, prompt, 80) == 80


@pytest.mark.parametrize("description", [DESCRIPTION, ""])
@pytest.mark.parametrize("non_streaming", [True, False])
def test_tiny_voice_design_kernels_equal_torch(
    tiny_voice_design_checkpoint: Path, non_streaming: bool, description: str
) -> None:
    _, tok, model = _tiny(tiny_voice_design_checkpoint)
    _no_eos(model)
    instruct = tok.encode(chat_instruct(description)) if description else None
    prompt = build_prompt(model, tok.encode(chat_text(TEXT)), None, "auto", instruct, non_streaming_text=non_streaming)
    assert _kernels_equal_torch(model, prompt, 120) == 120


@pytest.mark.skipif(os.environ.get("Q3T_FULL") != "1", reason="full-size check: set Q3T_FULL=1 (minutes, ~20 GB)")
@pytest.mark.parametrize(("size", "model_type"), [("1.7b", "base"), ("0.6b", "base"), ("1.7b", "voice_design")])
def test_full_size_kernels_equal_torch(size: str, model_type: str) -> None:
    """Full-size random weights (drawn as bf16, as released, widened to float32): float32 greedy codes of the
    kernels equal the torch backend's for every prompt kind of the model type."""
    from wyoming_qwen3tts.model.checkpoint import talker_tensor_shapes
    from wyoming_qwen3tts.model.config import Qwen3TTSConfig
    from wyoming_qwen3tts.model.talker import Qwen3TTSModel
    from wyoming_qwen3tts.tools.random_checkpoint import model_config_dict, random_tensor

    cfg = Qwen3TTSConfig.from_dict(model_config_dict(size, model_type))
    tensors = {
        n: random_tensor(n, s, seed=0, tiny=False, dtype=torch.bfloat16, device=torch.device(DEV)).float()
        for n, s in talker_tensor_shapes(cfg).items()
    }
    model = Qwen3TTSModel.from_tensors(cfg, tensors, dtype=torch.float32, device=DEV)
    del tensors
    _no_eos(model)
    body = [int(t) for t in np.random.default_rng(0).integers(300, 20000, size=14)]
    text_ids = [151644, 77091, 198, *body, 151645, 198, 151644, 77091, 198]
    transcript = [151644, 77091, 198, *body[:9], 151645, 198]
    hidden = cfg.talker.hidden_size
    if model_type == "base":
        prompts = [
            build_prompt(model, text_ids, _random_voice(hidden, 0, None), "english", non_streaming_text=False),
            build_prompt(model, text_ids, _random_voice(hidden, 125, transcript), "english", non_streaming_text=False),
            build_prompt(model, text_ids, _random_voice(hidden, 125, transcript), "chinese", non_streaming_text=True),
        ]
    else:
        description = [151644, 872, 198, *body[5:], 151645, 198]
        prompts = [
            build_prompt(model, text_ids, None, "english", description),
            build_prompt(model, text_ids, None, "auto", None, non_streaming_text=False),
        ]
    for prompt in prompts:
        assert _kernels_equal_torch(model, prompt, 60) == 60
