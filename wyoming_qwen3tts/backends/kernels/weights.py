"""The model's weights as the kernels read them, gathered once when the backend is built.

The matrices are the model's own tensors (the model already holds q/k/v fused and gate/up
interleaved, model/talker.py), so nothing large is copied; small vectors (norm weights, the
projection bias) get float32 copies, and on the 1.7B the CodePredictor's input tables are projected
once through small_to_mtp_projection (float32, +130 MB), so a drawn code's row goes straight into
the CodePredictor stream instead of through a projection GEMV per position and frame.

Each matrix is an ops.Matrix: the module's weight, and for a model quantized at load (model/quant.py,
`weights = "int8"`) its int8 weight with the QuantLinear's float32 row scales, which the GEMVs apply
to each row's sum (q3t.h, Q3T_I8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...model.config import TransformerConfig
from ...model.quant import LinearLayer, QuantLinear
from ...model.talker import Block, ModuleListOf, Qwen3TTSModel
from .ops import Matrix


def _f32(t: Tensor) -> Tensor:
    return t.detach().to(torch.float32).contiguous()


def _mat(t: Tensor) -> Tensor:
    return t.detach().contiguous()  # the model's own tensor (already contiguous)


def _matrix(linear: LinearLayer) -> Matrix:
    """A Linear's or QuantLinear's weight as the GEMVs read it (the module's own tensors)."""
    if isinstance(linear, QuantLinear):
        return Matrix(_mat(linear.weight), _mat(linear.scale))
    return Matrix(_mat(linear.weight))


@dataclass(frozen=True)
class LayerWeights:
    qkv: Matrix  # rows q, k, v
    o: Matrix
    gate_up: Matrix  # rows interleaved: gate_0, up_0, gate_1, up_1, ... (int8: a scale for each)
    down: Matrix
    in_norm: Tensor  # float32 from here on
    post_norm: Tensor
    q_norm: Tensor
    k_norm: Tensor


@dataclass(frozen=True)
class StackWeights:
    """One transformer stack (Talker or CodePredictor)."""

    cfg: TransformerConfig
    layers: tuple[LayerWeights, ...]

    @classmethod
    def from_layers(cls, cfg: TransformerConfig, layers: ModuleListOf[Block]) -> StackWeights:
        return cls(
            cfg,
            tuple(
                LayerWeights(
                    qkv=_matrix(blk.self_attn.qkv_proj),
                    o=_matrix(blk.self_attn.o_proj),
                    gate_up=_matrix(blk.mlp.gate_up_proj),
                    down=_matrix(blk.mlp.down_proj),
                    in_norm=_f32(blk.input_layernorm.weight),
                    post_norm=_f32(blk.post_attention_layernorm.weight),
                    q_norm=_f32(blk.self_attn.q_norm.weight),
                    k_norm=_f32(blk.self_attn.k_norm.weight),
                )
                for blk in layers
            ),
        )


@dataclass(frozen=True)
class ModelWeights:
    talker: StackWeights
    code_predictor: StackWeights
    final_norm: Tensor  # float32
    cp_norm: Tensor  # float32
    codec_head: Matrix
    lm_heads: tuple[Matrix, ...]  # one per code 1..15
    # The 16 tables summed into the next Talker input (codec embedding, then the CodePredictor's 15),
    # and their data pointers as the device array q3t_embed_sum reads.
    embeddings: tuple[Tensor, ...]
    embedding_ptrs: Tensor
    # CodePredictor position j's input row comes from cp_inputs[j - 1] (j = 1..15): the embedding
    # tables at the CodePredictor's width (projected, float32, where the widths differ).
    cp_inputs: tuple[Tensor, ...]
    proj_w: Matrix | None  # small_to_mtp_projection (None: the widths are equal), for the Talker's hn
    proj_b: Tensor | None  # float32

    @classmethod
    def from_model(cls, model: Qwen3TTSModel) -> ModelWeights:
        talker = model.talker
        cp = talker.code_predictor
        with torch.no_grad():
            embeddings = (
                _mat(talker.model.codec_embedding.weight),
                *(_mat(e.weight) for e in cp.model.codec_embedding),
            )
            proj = cp.small_to_mtp_projection
            proj_w: Matrix | None = None
            proj_b: Tensor | None = None
            cp_inputs = embeddings[:-1]
            if isinstance(proj, LinearLayer):
                if proj.bias is None:  # built with bias=True (model/talker.py): a checkpoint without one does not load
                    raise ValueError("small_to_mtp_projection has no bias")
                proj_w, proj_b = _matrix(proj), _f32(proj.bias)
                # The matrix the projection stands for (int8: q * scale per row, QuantLinear's own dequantization).
                w32 = proj.dequantized() if isinstance(proj, QuantLinear) else proj_w.data.float()
                cp_inputs = tuple(torch.addmm(proj_b, t.float(), w32.t()).contiguous() for t in embeddings[:-1])
        return cls(
            talker=StackWeights.from_layers(model.cfg.talker, talker.model.layers),
            code_predictor=StackWeights.from_layers(model.cfg.code_predictor, cp.model.layers),
            final_norm=_f32(talker.model.norm.weight),
            cp_norm=_f32(cp.model.norm.weight),
            codec_head=_matrix(talker.codec_head),
            lm_heads=tuple(_matrix(h) for h in cp.lm_head),
            embeddings=embeddings,
            embedding_ptrs=torch.tensor([t.data_ptr() for t in embeddings], dtype=torch.int64, device=model.device),
            cp_inputs=cp_inputs,
            proj_w=proj_w,
            proj_b=proj_b,
        )
