"""One attention step of the q3t kernels (one stream, or a row of the batched kernel) checked against torch."""

from __future__ import annotations

import torch
from kernel_ops import rel

F32_TOL = 1e-5  # float32 against float64 (relative)


def check_attention_step(qkv, qn, kn, cos, sin, kc0, vc0, kc, vc, out, pos: int, hq: int, scale: float) -> None:
    """A q3t attention step at `pos` against torch: q and k RMS-normed and rotated (the model's own
    functions, in float64), k and v appended at row pos in the cache dtype (bf16 rounds to 8 bits),
    no other row touched, and out = softmax(q K^T * scale) V over the rows 0..pos the kernel left."""
    from wyoming_qwen3tts.model.layers import rms_norm
    from wyoming_qwen3tts.model.talker import apply_rope

    _, hkv, d = kc0.shape
    qr, kr, vr = qkv.double().split([hq * d, hkv * d, hkv * d])
    c, s = cos[pos : pos + 1].double(), sin[pos : pos + 1].double()
    q = apply_rope(rms_norm(qr.view(1, hq, d), qn.double(), 1e-6), c, s)[0]  # [hq, d]
    k = apply_rope(rms_norm(kr.view(1, hkv, d), kn.double(), 1e-6), c, s).reshape(-1)
    tol = F32_TOL if kc0.dtype == torch.float32 else 4e-3  # bf16 cache storage rounds to 8 bits
    assert rel(kc[pos].reshape(-1), k) <= tol and rel(vc[pos].reshape(-1), vr) <= tol
    others = [t for t in range(kc0.shape[0]) if t != pos]
    assert torch.equal(kc[others], kc0[others]) and torch.equal(vc[others], vc0[others]), "wrote outside row pos"
    keys = kc[: pos + 1].double().repeat_interleave(hq // hkv, dim=1)  # [L, hq, d]
    values = vc[: pos + 1].double().repeat_interleave(hq // hkv, dim=1)
    probs = torch.softmax(torch.einsum("hd,lhd->hl", q, keys) * scale, dim=-1)
    assert rel(out, torch.einsum("hl,lhd->hd", probs, values).reshape(-1)) <= F32_TOL
