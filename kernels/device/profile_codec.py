"""Where a batched codec call's GPU time goes: one CodecSlots.decode of B streams by n frames (each stream 80 frames
in), on the full-size random codec, profiled with the torch profiler.

Prints the call's GPU ms (CUDA events, median of 5) and its kernels' time summed three ways: by stage of the decoder
(dequantize + pre_conv, the transformer, the two upsample stages, conv_in, each vocoder block, the output), by the
torch op that launched them (conv, cat, sin, mul, ...), and by kernel name (the 15 largest); once with the
activations on torch's ops and once on the library's fused SnakeBeta (CodecDecoder.use_fused_ops), with the ratio.

    python kernels/device/profile_codec.py [--batches 16,64] [--frames 12] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    dec = random_codec(getattr(torch, args.dtype))
    label_stages(dec)
    snake = Ops(library.load(0)).snake_beta
    n = args.frames
    with torch.inference_mode():
        for b, fused in ((int(x), fused) for x in args.batches.split(",") for fused in (False, True)):
            dec.use_fused_ops(snake if fused else None)
            slots = CodecSlots(dec, b)
            ids = [slots.open() for _ in range(b)]
            slots.decode(ids, rng.integers(0, 2048, (b, HISTORY, 16)))
            group = rng.integers(0, 2048, (b, n, 16))
            ms = gpu_ms(lambda: slots.decode(ids, group))
            if not fused:
                torch_ms = ms
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                slots.decode(ids, group)
                torch.cuda.synchronize()
            events = prof.key_averages()
            kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            print(
                f"\n## B = {b}, {n} frames, activations on {'the fused kernel' if fused else 'torch'}: {ms:.2f} GPU ms "
                f"a call (torch's / this {torch_ms / ms:.2f}x), kernels {kernel_us / 1000:.2f} ms, "
                f"{b * n / ms * 1000:.0f} frames/s"
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
