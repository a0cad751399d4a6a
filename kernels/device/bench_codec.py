"""The codec decoder for many streams: per-stream calls (a CodecStream each, as the batch-1 engine decodes) against
one batched call (CodecSlots) and the codec worker, on the full-size random codec, alone on the GPU.

For B streams (each 80 frames in, so the attention window is full) and groups of n frames:
  per-stream  one round = each stream decodes its group, to int16 and to the host (the engine's samples_to_pcm),
              one after the other: ms per round and audio seconds per second (B * n * 0.08 s / round);
  batched     one CodecSlots.decode of all B groups, to int16, copied to pinned host memory: ms per call, the host
              ms to issue it (before the GPU is waited for: above the call's ms, the host bounds it), audio s/s;
  worker      B threads, each a WorkerStream decoding its groups through one CodecWorker (smallest groups first),
              each thread sending its next group as soon as it has the last one's PCM: audio s/s over all of them,
              with DEPTH = 2 calls in flight (as the server runs) and with 1 (does overlapping the host's issue of
              a call with the GPU's run of the last pay, or does it split the streams into two smaller calls?);
then CUDA kernels per call (torch profiler): one stream's call, and a batched call at B = 1, 4, 16 (n = 12).
Medians of --rounds timed rounds after two warm-up rounds.  Prints JSON lines and a markdown table (also written to
$OUT/codec_bench.md).

    python kernels/device/bench_codec.py [--dtype bfloat16|float32] [--batches 1,4,8,16] [--groups 1,4,12]
        [--rounds 10] [--cudnn-benchmark]

--cudnn-benchmark lets cuDNN time its algorithms for each conv shape at its first call (torch.backends.cudnn.benchmark)
instead of its heuristic pick.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import random_codec

from wyoming_qwen3tts import codec_worker
from wyoming_qwen3tts.model.codec import CodecDecoder, int16_samples, samples_to_pcm
from wyoming_qwen3tts.model.codec_slots import CodecSlots

HISTORY = 80  # frames each stream has decoded before the timing
FRAME_S = 0.08
rng = np.random.default_rng(0)


def codes(*shape: int) -> np.ndarray:
    return rng.integers(0, 2048, (*shape, 16))


def median_ms(fn, rounds: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def per_stream(dec: CodecDecoder, b: int, n: int, rounds: int) -> float:
    streams = [dec.new_stream(torch.from_numpy(codes(HISTORY)).cuda()) for _ in range(b)]

    def round_() -> None:
        for s in streams:
            samples_to_pcm(int16_samples(s.decode(torch.from_numpy(codes(n)).cuda())))

    return median_ms(round_, rounds)


def batched(dec: CodecDecoder, b: int, n: int, rounds: int) -> tuple[float, float]:
    """(ms per call, host ms to issue it)."""
    slots = CodecSlots(dec, b)
    ids = [slots.open() for _ in range(b)]
    slots.decode(ids, codes(b, HISTORY))
    issue: list[float] = []

    def call() -> None:
        group = codes(b, n)
        t0 = time.perf_counter()
        samples = int16_samples(slots.decode(ids, group))
        host = torch.empty(samples.shape, dtype=torch.int16, pin_memory=True)
        host.copy_(samples, non_blocking=True)
        issue.append(time.perf_counter() - t0)

    ms = median_ms(call, rounds)
    return ms, statistics.median(issue[2:]) * 1000


def worker(dec: CodecDecoder, b: int, n: int, rounds: int, depth: int) -> float:
    """Audio seconds per second through one CodecWorker with `depth` calls in flight, B request threads at once."""
    codec_worker.DEPTH = depth  # read by the worker thread at every turn
    w = codec_worker.CodecWorker(dec, torch.cuda.Stream(), b)
    streams = [w.open(dec.new_stream()) for _ in range(b)]
    groups = [codes(2 + rounds, n) for _ in range(b)]
    for s, g in zip(streams, groups):  # warm-up: each stream's first two groups
        s.decode(g[0])
        s.decode(g[1])

    def run(i: int) -> None:
        for k in range(2, 2 + rounds):
            streams[i].decode(groups[i][k])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(b)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for s in streams:
        s.close()
    return b * n * rounds * FRAME_S / wall


def kernels_per_call(fn) -> int:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def launches(dec: CodecDecoder) -> dict[str, int]:
    n = 12
    stream = dec.new_stream(torch.from_numpy(codes(HISTORY)).cuda())
    out = {"per-stream call": kernels_per_call(lambda: stream.decode(torch.from_numpy(codes(n)).cuda()))}
    for b in (1, 4, 16):
        slots = CodecSlots(dec, b)
        ids = [slots.open() for _ in range(b)]
        slots.decode(ids, codes(b, HISTORY))
        out[f"batched call, B = {b}"] = kernels_per_call(lambda: slots.decode(ids, codes(b, n)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--groups", default="1,4,12")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cudnn-benchmark", action="store_true")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    dtype = getattr(torch, args.dtype)
    dec = random_codec(dtype)
    print(
        f"# {torch.cuda.get_device_name()}, codec {args.dtype}, torch {torch.__version__}, "
        f"cudnn benchmark {args.cudnn_benchmark}",
        flush=True,
    )
    lines = [
        f"codec decode, {torch.cuda.get_device_name()}, {args.dtype}, {HISTORY} frames of history, "
        f"medians of {args.rounds} rounds",
        "",
        "| frames/group | streams | per-stream ms/round | per-stream audio s/s | batched ms/call | "
        "batched issue ms | batched audio s/s | worker audio s/s | worker, 1 in flight | batched / per-stream |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with torch.inference_mode():
        for n in (int(x) for x in args.groups.split(",")):
            for b in (int(x) for x in args.batches.split(",")):
                one = per_stream(dec, b, n, args.rounds)
                ms, issue = batched(dec, b, n, args.rounds)
                through = worker(dec, b, n, args.rounds, 2)
                through1 = worker(dec, b, n, args.rounds, 1)
                audio = b * n * FRAME_S
                rec = dict(
                    frames=n,
                    streams=b,
                    per_stream_ms=round(one, 3),
                    per_stream_audio_s_per_s=round(audio / one * 1000, 1),
                    batched_ms=round(ms, 3),
                    batched_issue_ms=round(issue, 3),
                    batched_audio_s_per_s=round(audio / ms * 1000, 1),
                    worker_audio_s_per_s=round(through, 1),
                    worker_depth1_audio_s_per_s=round(through1, 1),
                )
                print(json.dumps(rec), flush=True)
                lines.append(
                    f"| {n} | {b} | {one:.2f} | {audio / one * 1000:.1f} | {ms:.2f} | {issue:.2f} | "
                    f"{audio / ms * 1000:.1f} | {through:.1f} | {through1:.1f} | "
                    f"{one / ms:.2f}x |"
                )
        counts = launches(dec)
    print(json.dumps({"cuda_kernels_per_call": counts}))
    lines += ["", "CUDA kernels per call (12 frames): " + ", ".join(f"{k}: {v}" for k, v in counts.items())]
    table = "\n".join(lines)
    print(table)
    out = Path(os.environ.get("OUT") or "/tmp/q3t-out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "codec_bench.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
