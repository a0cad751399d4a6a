"""Weight-only int8 for the Talker's and the CodePredictor's matrices (the `weights = "int8"` setting).

A frame on the cards we serve is bound by memory bandwidth: it reads every matrix once. Storing the
matrices as int8 halves those bytes (and their memory) against bf16. Activations stay in the model's
dtype; only the weights are quantized, once at load, from the release's bf16 weights.

Scheme: symmetric, one float32 scale per output row (per output channel):

    scale[r] = max_k |w[r, k]| / 127        q[r, k] = round_half_even(w[r, k] / scale[r]) in [-127, 127]

computed in float32 from the loaded weights. A row of zeros gets scale 1 (any scale gives q = 0 there; 1 keeps
the division finite). Every element is then within half a step of the original, |w - q * scale| <= scale / 2.
-128 is never used, so the grid is symmetric around 0.

What is quantized (quantize_model): in every layer of both stacks `self_attn.qkv_proj`, `self_attn.o_proj`,
`mlp.gate_up_proj` and `mlp.down_proj`; the Talker's `codec_head`; the CodePredictor's 15 `lm_head`s; and
`small_to_mtp_projection` where it is a Linear (1.7B): 2.85 GiB -> 1.43 GiB on the 1.7B, 1.03 GiB -> 0.52 GiB
on the 0.6B, nearly every byte a frame reads. The embedding tables (a frame reads one row of each), the norms,
the text projection (prompt time only) and the codec stay as they are.

Why per row and not in groups along k (64 or 128 inputs per scale, as GGUF Q8_0 does with 32): the kernels
then compute one dot product of the integer weights with x and apply one scale per output, and int8 converts
exactly to bf16 for the tensor cores. Measured (relative error ||W x - W_q x|| / ||W x|| on the 1.7B's matrix
shapes, bf16 weights, x with 1 % outlier channels at 10x; docs/int8.md has the script and every shape):

    weights                                       per row      group 128    group 64
    Gaussian N(0, 0.02) (random_checkpoint's)     0.79-0.89 %  0.64-0.65 %  0.59-0.60 %
    Student-t, nu = 5 (heavy tails)               1.50-2.15 %  0.94-0.97 %  0.80-0.82 %
    Gaussian + 1 % input columns at 4x
      + 1e-4 of elements at 10-30 sigma           2.12-3.43 %  0.89-1.13 %  0.69-0.91 %

Groups cut the error to about 3/4 (Gaussian rows) down to 1/3 (rows with single far-out weights); every figure
stays within a few percent. Per-row int8 weight-only is the common W8A16 scheme (torchao's int8 weight-only;
its README reports Llama-3-8B wikitext perplexity 7.345 against bf16's 7.332). Whether it holds for this model
is measured on the real weights by `python -m wyoming_qwen3tts.tools.quant_check` (README, "8-bit weights"),
which is why "bf16" stays the default; should it fall short, groups of 128 are the measured next step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:  # model/talker.py imports this module for LinearLayer
    from .talker import Qwen3TTSModel

QMAX = 127


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] (any float dtype) -> (q int8 [N, K] contiguous, scale float32 [N]), on w's device.

    Symmetric per-row int8 as the module docstring states; torch.round rounds half to even.
    """
    if w.dim() != 2:
        raise ValueError(f"quantize_rows takes a matrix, not a tensor of shape {tuple(w.shape)}")
    wf = w.detach().to(torch.float32)
    amax = wf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    # The clamp only catches a quotient that float32 rounds just past 127 at the row's largest element.
    q = torch.round(wf / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8).contiguous()
    return q, scale.contiguous()


def dequantize_rows(q: Tensor, scale: Tensor) -> Tensor:
    """q * scale per row, float32 [N, K]."""
    return q.to(torch.float32) * scale[:, None]


class QuantLinear(nn.Module):
    """A drop-in for a bias-or-not nn.Linear whose weight is stored as per-row int8 (quantize_rows).

    `weight` (int8 [out, in]) and `scale` (float32 [out]) are non-trainable Parameters, so they move with
    .to(), appear in state_dict() and parameters(), and `module.weight` is found where nn.Linear's is;
    `bias` keeps its original dtype. forward() is the torch reference of these quantized weights:
    F.linear(x, (weight * scale[:, None]).to(x.dtype), bias), the weights dequantized in float32 and cast to
    x's dtype. The fused kernels compute scale[r] * sum_k q[r, k] x[k]: the same function of the same
    integers, rounded differently (the scale applied after the sum, no cast of the product to bf16).
    """

    def __init__(self, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2 or scale.shape != weight.shape[:1]:
            raise ValueError(
                f"want int8 [out, in] and a scale [out]; got {weight.dtype} {tuple(weight.shape)}, "
                f"scale {tuple(scale.shape)}"
            )
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.scale = nn.Parameter(scale.to(torch.float32), requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> QuantLinear:
        q, scale = quantize_rows(linear.weight)
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls(q, scale, bias)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight these integers stand for, [out, in] in dtype (computed in float32)."""
        return dequantize_rows(self.weight, self.scale).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.dequantized(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


# A matrix as the model holds it: nn.Linear as loaded, QuantLinear after quantize_model.
LinearLayer: TypeAlias = nn.Linear | QuantLinear


@dataclass(frozen=True)
class QuantReport:
    """What quantize_model replaced: how many matrices, and their bytes before and after (bias and scales included)."""

    modules: int
    bytes_before: int
    bytes_after: int

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def __str__(self) -> str:
        return (
            f"Talker and CodePredictor matrices {_size(self.bytes_before)} -> {_size(self.bytes_after)} "
            f"({_size(self.bytes_saved)} saved, {self.modules} matrices)"
        )


def _size(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def quantized_names(model: Qwen3TTSModel) -> list[str]:
    """The qualified names of the Linear modules quantize_model replaces, in a Qwen3TTSModel (model/talker.py)."""
    talker = model.talker
    cp = talker.code_predictor
    names: list[str] = []
    for stack, prefix in ((talker.model, "talker.model"), (cp.model, "talker.code_predictor.model")):
        for i in range(len(stack.layers)):
            names += [
                f"{prefix}.layers.{i}.{part}"
                for part in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
            ]
    names.append("talker.codec_head")
    names += [f"talker.code_predictor.lm_head.{j}" for j in range(len(cp.lm_head))]
    if isinstance(cp.small_to_mtp_projection, LinearLayer):
        names.append("talker.code_predictor.small_to_mtp_projection")
    return names


def _tensor_bytes(*tensors: Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@torch.no_grad()
def quantize_model(model: Qwen3TTSModel) -> QuantReport:
    """Replace, in place, the matrices named by quantized_names with QuantLinear (on their own device).

    One matrix at a time, so the extra memory is one float32 copy of the largest; each bf16 weight is freed
    when its module is replaced (unless something else holds it). A model already quantized is left as it is.
    """
    count = before = after = 0
    for name in quantized_names(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = parent.get_submodule(child)
        if isinstance(linear, QuantLinear):
            continue
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{name} is a {type(linear).__name__}, not the Linear quantize_model replaces")
        quant = QuantLinear.from_linear(linear)
        before += _tensor_bytes(linear.weight, linear.bias)
        after += _tensor_bytes(quant.weight, quant.scale, quant.bias)
        count += 1
        setattr(parent, child, quant)  # ModuleList children are set by their index name too
    return QuantReport(count, before, after)


def is_quantized(model: nn.Module) -> bool:
    """Whether any of the model's matrices are int8 (quantize_model ran on it)."""
    return any(isinstance(m, QuantLinear) for m in model.modules())


__all__ = [
    "LinearLayer",
    "QuantLinear",
    "QuantReport",
    "dequantize_rows",
    "is_quantized",
    "quantize_model",
    "quantize_rows",
    "quantized_names",
]
