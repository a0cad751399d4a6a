"""Bytes a frame reads, the machine's copy bandwidth, and the floor they set on frames per second."""

from __future__ import annotations

import statistics
from typing import Any

R9700_BW = 640e9  # AMD Radeon AI PRO R9700, bytes/s (datasheet)


def frame_bytes(config: dict[str, Any], dtype_bytes: int = 2, weights: str = "bf16") -> dict[str, int]:
    """Weight bytes read per frame at batch 1 (qwen3-tts-model.md §8.2) from a config.json dict.

    Talker: every layer, the final norm and codec_head. CodePredictor: 15 passes, each reading every layer, the norm,
    the small_to_mtp projection (when the widths differ) and one lm_head. Embedding rows are not counted (a few KB).
    `weights` "int8" (model/quant.py): the matrices one byte an element plus a float32 scale a row; norms and the
    projection's bias stay `dtype_bytes` an element. `kv_per_token`: Talker K+V bytes read per context position per
    frame.
    """
    tc = config["talker_config"]
    cc = tc["code_predictor_config"]
    int8 = weights == "int8"

    def matrix(elements: int, rows: int) -> int:
        return elements + 4 * rows if int8 else elements * dtype_bytes

    def layer(c: dict[str, Any]) -> int:
        h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        qkv, o = matrix(h * (q + 2 * kv), q + 2 * kv), matrix(q * h, h)
        gate_up, down = matrix(2 * h * i, 2 * i), matrix(i * h, h)
        return qkv + o + gate_up + down + (2 * h + 2 * hd) * dtype_bytes  # + the four norms

    th, ch = tc["hidden_size"], cc["hidden_size"]
    talker = tc["num_hidden_layers"] * layer(tc) + th * dtype_bytes + matrix(tc["vocab_size"] * th, tc["vocab_size"])
    proj = matrix(th * ch, ch) + ch * dtype_bytes if th != ch else 0
    cp_pass = (
        cc["num_hidden_layers"] * layer(cc) + ch * dtype_bytes + proj + matrix(cc["vocab_size"] * ch, cc["vocab_size"])
    )
    groups = tc.get("num_code_groups", 16)
    kv = tc["num_hidden_layers"] * 2 * tc["num_key_value_heads"] * tc["head_dim"] * dtype_bytes
    return {
        "talker": talker,
        "cp_pass": cp_pass,
        "cp_passes": groups - 1,
        "weights": talker + (groups - 1) * cp_pass,
        "kv_per_token": kv,
    }


def copy_bandwidth(nbytes: int = 2 << 30, reps: int = 20) -> float | None:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), median of `reps` copies."""
    import torch

    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def roofline(rows: list[dict[str, Any]], configs: dict[str, dict[str, Any]], bw: float | None) -> list[dict[str, Any]]:
    out = []
    for size, cfg in configs.items():
        k = next((r for r in rows if r["size"] == size and r["engine"] == "kernels" and r.get("ok")), None)
        weights = k.get("weights", "bf16") if k else "bf16"  # what the kernel row's matrices were
        fb = frame_bytes(cfg, weights=weights)
        frames = k["frames"] if k else 200
        ctx = (k.get("prompt_positions", 40) if k else 40) + frames / 2  # mean Talker context over the run
        kv = int(fb["kv_per_token"] * ctx)
        total = fb["weights"] + kv
        x: dict[str, Any] = {
            "size": size,
            "weights": weights,
            "weight_bytes": fb["weights"],
            "kv_bytes": kv,
            "bytes": total,
            "r9700_floor_fps": R9700_BW / total,
        }
        if bw:
            x["floor_ms"] = total / bw * 1e3
            x["floor_fps"] = bw / total
        if k and k.get("decode_fps"):
            x["kernels_fps"] = k["decode_fps"]
            if bw:
                x["fraction"] = k["decode_fps"] / x["floor_fps"]
                x["r9700_projected_fps"] = x["r9700_floor_fps"] * x["fraction"]
        out.append(x)
    return out
