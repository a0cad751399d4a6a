"""Helpers for the device scripts: random models built in memory (no checkpoint files)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.model.codec import CodecDecoder
from wyoming_qwen3tts.model.config import CodecDecoderConfig, Qwen3TTSConfig
from wyoming_qwen3tts.model.talker import Qwen3TTSModel
from wyoming_qwen3tts.tools.random_checkpoint import (
    TINY_SIZES,
    codec_config_dict,
    codec_tensor_shapes,
    model_config_dict,
    model_tensor_shapes,
    random_tensor,
)

T = TypeVar("T")


_natives: dict[str, library.Native] = {}


def native_library(path: str | None = None) -> library.Native:
    """The kernel library built at `path`, or at $GEMV_LIB without one (another build, e.g. an older commit's, for
    an A/B in one process; the same ABI), initialised for device 0 and loaded once per file; with neither, this
    tree's own (library.load)."""
    path = path or os.environ.get("GEMV_LIB")
    if not path:
        return library.load(0)
    if path not in _natives:
        _natives[path] = library.Native(Path(path))
        _natives[path].init(0)
    return _natives[path]


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """fn()'s result and its wall seconds, the GPU drained before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def random_model(size: str, dtype: torch.dtype, *, no_eos: bool = True, seed: int = 0) -> Qwen3TTSModel:
    """The same tensors `python -m wyoming_qwen3tts.tools.random_checkpoint --size SIZE` writes,
    made on the GPU. no_eos zeroes the EOS row of codec_head so runs have a fixed length."""
    config = model_config_dict(size)
    tensors = {
        n: random_tensor(n, s, seed=seed, tiny=size in TINY_SIZES, dtype=dtype, device=torch.device("cuda"))
        for n, s in model_tensor_shapes(config).items()
    }
    if no_eos:
        tensors["talker.codec_head.weight"][2150].zero_()
    return Qwen3TTSModel.from_tensors(Qwen3TTSConfig.from_dict(config), tensors, dtype=dtype, device="cuda")


def random_codec(dtype: torch.dtype, *, seed: int = 0) -> CodecDecoder:
    """The full-size codec decoder (the same for 0.6B and 1.7B) that random_checkpoint writes, made on the GPU."""
    config = codec_config_dict("1.7b")
    tensors = {
        n: random_tensor(n, s, seed=seed, tiny=False, dtype=torch.float32, device=torch.device("cuda"))
        for n, s in codec_tensor_shapes(config).items()
        if n.startswith("decoder.")
    }
    return CodecDecoder.from_tensors(CodecDecoderConfig.from_dict(config), tensors, dtype=dtype, device="cuda")


def text_ids(n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [151644, 77091, 198, *[int(t) for t in rng.integers(300, 20000, size=n)], 151645, 198, 151644, 77091, 198]
