"""The batched GEMVs of one step as a chain, captured in one graph with PDL: the CodePredictor's 16 positions x 5
layers (qkv, o, gate_up, down) plus its 15 lm_heads, and the Talker's 28 layers, at 1.7B shapes and full-size
random bf16 weights; attention, draws and the rest of the step left out. Prints ms per chain at nb 4, 8 and 16.
Q3T_GEMV_CLUSTER=0 (KernelOptions.from_env) takes the scratch path instead of clusters: run once per setting.

    python kernels/device/bench_gemv_chain.py LABEL
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_batched import time_graph

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.ops import Ops
from wyoming_qwen3tts.backends.kernels.options import KernelOptions

STACKS = {  # name: (layers, passes, hidden, qkv rows, attention width, intermediate, lm_heads)
    "cp": (5, 16, 1024, 4096, 2048, 3072, 15),
    "talker": (28, 1, 2048, 4096, 2048, 6144, 0),
}


def time_stack(ops: Ops, g: torch.Generator, stack: tuple[int, int, int, int, int, int, int]) -> dict[int, float]:
    """ms per chain of one stack at nb 4, 8 and 16; its weights are freed when this returns."""
    n_layers, passes, h, nqkv, na, ni, heads = stack

    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()

    layers = [(w(nqkv, h), w(na and h, na), w(2 * ni, h), w(h, ni)) for _ in range(n_layers)]
    lm = [w(2048, h) for _ in range(heads)]
    norm = torch.rand(h, device="cuda", generator=g) + 0.5
    mats = [m for L in layers for m in L] + lm
    scratch = torch.zeros(max(ops.batched_gemv_scratch_floats(mats), 1), device="cuda")
    x = torch.randn(16, h, device="cuda", generator=g)
    qkv, attn = torch.zeros(16, nqkv, device="cuda"), torch.randn(16, na, device="cuda", generator=g)
    mlp, logits = torch.zeros(16, ni, device="cuda"), torch.zeros(16, 2048, device="cuda")

    def chain(nb: int) -> None:
        xs, q, a, m, lg = x[:nb], qkv[:nb], attn[:nb], mlp[:nb], logits[:nb]
        for p in range(passes):
            for wq, wo, wg, wd in layers:
                ops.batched_gemv(wq, xs, q, norm_w=norm, eps=1e-6, scratch=scratch)
                ops.batched_gemv(wo, a, xs, mode=library.GEMV_ADD, scratch=scratch)
                ops.batched_gemv(wg, xs, m, mode=library.GEMV_SWIGLU, norm_w=norm, eps=1e-6, scratch=scratch)
                ops.batched_gemv(wd, m, xs, mode=library.GEMV_ADD, scratch=scratch)
            if p < heads:
                ops.batched_gemv(lm[p], xs, lg, norm_w=norm, eps=1e-6, scratch=scratch)

    ms = {}
    for nb in (4, 8, 16):  # one chain per graph: time_graph's µs per launch is µs per chain
        ms[nb] = round(time_graph(lambda i, nb=nb: chain(nb), 1) / 1e3, 4)
        assert torch.isfinite(x).all()
    return ms


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "default"
    ops = Ops(library.load(0))
    assert ops.use_pdl(True)
    ops.set_gemv_clusters(KernelOptions.from_env().gemv_clusters)
    g = torch.Generator(device="cuda").manual_seed(0)
    out: dict[str, str | float] = {"label": label}
    for name, stack in STACKS.items():
        for nb, ms in time_stack(ops, g, stack).items():
            out[f"{name}_nb{nb}_ms"] = ms
        torch.cuda.empty_cache()  # the stack's weights are gone: the next one starts from a clean pool
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
