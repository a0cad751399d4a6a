"""Where a batched codec call's GPU time goes: one CodecSlots.decode of B streams by n frames (each stream 80 frames
in), on the full-size random codec, profiled with the torch profiler.

Prints the call's GPU ms (CUDA events, median of 5) and its kernels' time summed three ways: by stage of the decoder
(dequantize + pre_conv, the transformer, the two upsample stages, conv_in, each vocoder block, the output), by the
torch op that launched them (conv, cat, sin, mul, ...), and by kernel name (the 15 largest); for each variant of
--variants, with the ratio to the first: `torch` (the activations on torch's ops), `fused` (on the library's fused
SnakeBeta, CodecDecoder.use_fused_ops), `gemmN` (fused, and the convs of >= N channels in as GEMMs,
CodecDecoder.use_gemm_convs), `timedN` (fused, and those convs as GEMMs at the shapes where timed faster: the
kernel backend's default, timedN with N = 1). --convs first times each conv of kernel > 1 alone at the call's shapes: cuDNN's
heuristic pick, cuDNN's timed pick (torch.backends.cudnn.benchmark) and conv_as_gemm.

    python kernels/device/profile_codec.py [--batches 16,64] [--frames 12] [--dtype bfloat16] [--convs]
        [--variants torch,fused,gemm96,timed1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import random_codec

from wyoming_qwen3tts.backends.kernels import library
from wyoming_qwen3tts.backends.kernels.ops import Ops
from wyoming_qwen3tts.model import codec
from wyoming_qwen3tts.model.codec_slots import CodecSlots

HISTORY = 80
rng = np.random.default_rng(0)


def _label(cls: type, name: str) -> None:
    """Wrap cls.__call__ in a profiler range named `name` (with the instance's index where it has one)."""
    call = cls.__call__

    def wrapped(self, *args, **kwargs):
        with record_function(f"stage:{getattr(self, '_stage', name)}"):
            return call(self, *args, **kwargs)

    cls.__call__ = wrapped


def label_stages(dec: codec.CodecDecoder) -> None:
    for i, blk in enumerate(dec.blocks):
        blk._stage = f"block{i} ({blk.up.weight.shape[1]} ch, x{blk.up.stride})"
    for i, (_, block) in enumerate(dec.upsample):
        block._stage = f"upsample{i} convnext"
    _label(codec._DecoderBlock, "block")
    _label(codec._ConvNeXtBlock, "convnext")
    for name in ("_dequantize", "_upsample_and_vocode"):
        fn = getattr(codec.CodecDecoder, name)

        def wrapped(self, *args, _fn=fn, _name=name, **kwargs):
            with record_function(f"stage:{_name}"):
                return _fn(self, *args, **kwargs)

        setattr(codec.CodecDecoder, name, wrapped)


def gpu_ms(fn, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def time_convs(dec: codec.CodecDecoder, b: int, n: int) -> None:
    """Each conv of kernel > 1 alone at the shapes a call of b streams by n frames gives it: GPU ms of cuDNN's
    heuristic pick, its timed pick and conv_as_gemm, and how far the GEMM's output is from cuDNN's."""
    shapes: dict[object, tuple[int, ...]] = {}
    call = codec._CausalConv.__call__

    def record(self, x, st, act=None):
        y = call(self, x, st, act)
        shapes.setdefault(self, (x.shape[0], x.shape[1], x.shape[2] + self.keep))
        return y

    codec._CausalConv.__call__ = record
    try:
        slots = CodecSlots(dec, b)
        ids = [slots.open() for _ in range(b)]
        slots.decode(ids, rng.integers(0, 2048, (b, n, 16)))
    finally:
        codec._CausalConv.__call__ = call
    print(f"\n## each conv of kernel > 1 alone, B = {b}, {n} frames (GPU ms; cuDNN heuristic / timed / GEMM)")
    totals = [0.0, 0.0, 0.0]
    for conv, (rows, ch, length) in shapes.items():
        out_ch, _, k = conv.weight.shape
        if conv.groups != 1 or k == 1 or out_ch < 8:
            continue
        x = torch.randn(rows, ch, length, device="cuda", dtype=dec.dtype)
        w2d = conv.weight.permute(0, 2, 1).reshape(out_ch, -1).contiguous()
        heuristic = gpu_ms(lambda: F.conv1d(x, conv.weight, conv.bias, dilation=conv.dilation))
        torch.backends.cudnn.benchmark = True
        try:
            timed = gpu_ms(lambda: F.conv1d(x, conv.weight, conv.bias, dilation=conv.dilation))
        finally:
            torch.backends.cudnn.benchmark = False
        gemm = gpu_ms(lambda: codec.conv_as_gemm(x, w2d, conv.bias, k, conv.dilation))
        want = F.conv1d(x, conv.weight, conv.bias, dilation=conv.dilation).float()
        got = codec.conv_as_gemm(x, w2d, conv.bias, k, conv.dilation).float()
        rel = ((got - want).norm() / want.norm()).item()
        for i, ms in enumerate((heuristic, timed, gemm)):
            totals[i] += ms
        print(
            f"  {ch:5d}->{out_ch:<5d} k{k} d{conv.dilation:<2d} T {length:7d}: {heuristic:7.3f} {timed:7.3f} "
            f"{gemm:7.3f}  (GEMM / heuristic {heuristic / gemm:5.2f}x, rel. diff {rel:.1e})"
        )
    print(f"  all: {totals[0]:.2f} / {totals[1]:.2f} / {totals[2]:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--variants", default="torch,fused")
    parser.add_argument("--convs", action="store_true")
    args = parser.parse_args()
    dec = random_codec(getattr(torch, args.dtype))
    snake = Ops(library.load(0)).snake_beta
    n = args.frames
    variants = args.variants.split(",")
    with torch.inference_mode():
        if args.convs:
            for b in (int(x) for x in args.batches.split(",")):
                time_convs(dec, b, n)
        label_stages(dec)
        for b, variant in ((int(x), v) for x in args.batches.split(",") for v in variants):
            dec.use_fused_ops(None if variant == "torch" else snake)
            gemm = variant.startswith(("gemm", "timed"))
            dec.use_gemm_convs(int(variant.lstrip("gemtid")) if gemm else 0, timed=variant.startswith("timed"))
            slots = CodecSlots(dec, b)
            ids = [slots.open() for _ in range(b)]
            slots.decode(ids, rng.integers(0, 2048, (b, HISTORY, 16)))
            group = rng.integers(0, 2048, (b, n, 16))
            ms = gpu_ms(lambda: slots.decode(ids, group))
            if variant == variants[0]:
                first_ms = ms
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                slots.decode(ids, group)
                torch.cuda.synchronize()
            events = prof.key_averages()
            kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            print(
                f"\n## B = {b}, {n} frames, {variant}: {ms:.2f} GPU ms a call ({variants[0]}'s / this "
                f"{first_ms / ms:.2f}x), kernels {kernel_us / 1000:.2f} ms, {b * n / ms * 1000:.0f} frames/s"
            )
            stages = {e.key: e.device_time_total for e in events if e.key.startswith("stage:")}
            print("by stage (ms, nested ranges overlap: blocks hold their convs):")
            for key, us in sorted(stages.items(), key=lambda kv: -kv[1]):
                print(f"  {us / 1000:8.2f}  {key[6:]}")
            ops: dict[str, float] = defaultdict(float)
            for e in events:
                if e.device_type != torch.autograd.DeviceType.CUDA and e.key.startswith("aten::"):
                    ops[e.key] += e.self_device_time_total
            print("by op (self GPU ms):")
            for key, us in sorted(ops.items(), key=lambda kv: -kv[1])[:16]:
                print(f"  {us / 1000:8.2f}  {us / kernel_us * 100:5.1f} %  {key}")
            print("by kernel (ms, calls):")
            kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:15]:
                print(f"  {e.self_device_time_total / 1000:8.2f}  {e.count:5d}  {e.key[:110]}")


if __name__ == "__main__":
    main()
