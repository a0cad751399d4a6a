"""CodecSlots checked against CodecStream in tests (CPU and GPU): a random codec decoder, streams decoded both ways,
and the bounds on their difference."""

from __future__ import annotations

import collections

import numpy as np
import torch

from wyoming_qwen3tts.model.codec import CodecDecoder
from wyoming_qwen3tts.model.codec_slots import CodecSlots
from wyoming_qwen3tts.model.config import CodecDecoderConfig
from wyoming_qwen3tts.tools.random_checkpoint import codec_config_dict, codec_tensor_shapes, random_tensor

SPF = 1920
# float32, largest difference of a stream's samples (full scale 1): measured on the CPU 8e-7 (tiny), 1.9e-5 (full
# size: wider sums, 8 transformer layers).
F32_BOUND = {"tiny": 1e-5, "1.7b": 1e-4}
# bf16: a rounding flip anywhere (batched kernels, the padded attention window) runs through ~30 layers.  Measured
# on the CPU, full size: max 0.14, rms 0.012-0.024, the size of bf16's own error (one pass against float32: max
# 0.14, rms 0.030) and of a bf16 stream's groups against one pass (max 0.12, rms 0.026); tiny: 0.
BF16_MAX, BF16_RMS = 0.3, 0.05


def random_decoder(dtype: torch.dtype = torch.float32, size: str = "tiny", device: str = "cpu") -> CodecDecoder:
    """A random codec as random_checkpoint writes it for `size`; tiny with one kv head for two query heads
    (grouped-query attention)."""
    config = codec_config_dict(size)
    tiny = size.startswith("tiny")
    if tiny:
        config["decoder_config"]["num_key_value_heads"] = 1
    shapes = {k: v for k, v in codec_tensor_shapes(config).items() if k.startswith("decoder.")}
    dev = torch.device(device)
    tensors = {k: random_tensor(k, s, seed=3, tiny=tiny, dtype=torch.float32, device=dev) for k, s in shapes.items()}
    return CodecDecoder.from_tensors(CodecDecoderConfig.from_dict(config), tensors, dtype=dtype, device=dev)


class SlotsCheck:
    """Streams decoded both ways: through the slots (any calls) and each through its own CodecStream."""

    def __init__(self, decoder: CodecDecoder, slots: CodecSlots, seed: int = 0) -> None:
        self.decoder, self.slots = decoder, slots
        self.rng = np.random.default_rng(seed)
        self.slot: dict[str, int] = {}
        self.alone: dict[str, object] = {}
        self.got: dict[str, list[torch.Tensor]] = collections.defaultdict(list)
        self.want: dict[str, list[torch.Tensor]] = collections.defaultdict(list)

    def open(self, name: str, start=None) -> None:
        self.slot[name] = self.slots.open(start)
        self.alone[name] = start.fork() if start is not None else self.decoder.new_stream()

    def close(self, name: str) -> None:
        self.slots.close(self.slot.pop(name))

    def call(self, names: list[str], n: int) -> None:
        codes = self.rng.integers(0, 2048, (len(names), n, 16))
        wav = self.slots.decode([self.slot[x] for x in names], codes)
        assert wav.shape == (len(names), n * SPF) and wav.dtype == torch.float32
        for row, name in enumerate(names):
            self.got[name].append(wav[row])
            self.want[name].append(self.alone[name].decode(torch.from_numpy(codes[row])))  # type: ignore[attr-defined]

    def worst(self, name: str) -> float:
        """The largest difference between the stream's audio both ways."""
        return self._diff(name).abs().max().item()

    def rms(self, name: str) -> float:
        """The root mean square of that difference."""
        return self._diff(name).pow(2).mean().sqrt().item()

    def _diff(self, name: str) -> torch.Tensor:
        got, want = torch.cat(self.got[name]), torch.cat(self.want[name])
        assert got.shape == want.shape
        assert want.std() > 0.02  # a real signal, not silence
        return got - want
