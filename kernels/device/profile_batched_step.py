"""Where a batched step's time goes: the captured step graph of --nb streams (16) replayed under CUPTI (graph kernels
are traced one by one), each kernel charged the time it adds to the step: its end minus the previous kernel's
end. With PDL a kernel starts early and waits, so its own duration overlaps its predecessor's; what it adds
at the end is what removing it would save at most. Kernels are grouped by name and grid, so the GEMVs of
different shapes and the attention kernels show apart.

Random full-size bf16 model built in memory, a 16-slot decoder as the server builds it, every stream's end of
speech masked. The step is traced at the contexts given (positions of each stream's Talker cache; the prompt
is 27 positions), and the step time of the graph at each of them is printed.

    python kernels/device/profile_batched_step.py [--size 0.6b] [--nb 16] [--at 127,227] [--splits 4,8] [--out DIR]

--splits: the Talker attention's chunks per head, one decoder each (default: the decoder's own choice for the
step's bucket, BatchedDecoder.bucket_splits).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_frame import kernel_events, short_name

REPLAYS = 6  # steps traced at each context; the first is dropped


def charge(kernels: list[dict[str, Any]], steps: int) -> tuple[float, list[dict[str, Any]]]:
    """Per (name, grid): launches, own µs and added µs (end minus the previous end) per step; the step's µs."""
    rows: dict[tuple[str, tuple], dict[str, float]] = defaultdict(lambda: dict(launches=0.0, own_us=0.0, added_us=0.0))
    prev_end = None
    for k in kernels:
        end = k["ts"] + k["dur"]
        r = rows[(short_name(k["name"]), k["grid"])]
        r["launches"] += 1
        r["own_us"] += k["dur"]
        r["added_us"] += max(0.0, end - (prev_end if prev_end is not None else k["ts"]))
        prev_end = end if prev_end is None else max(prev_end, end)
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    table = [
        dict(kernel=n, grid=list(g), **{key: round(v / steps, 2) for key, v in r.items()})
        for (n, g), r in sorted(rows.items(), key=lambda kv: -kv[1]["added_us"])
    ]
    return span / steps, table


def main() -> None:
    import torch
    from common import random_model, text_ids
    from torch.profiler import ProfilerActivity, profile

    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder, bucket_for
    from wyoming_qwen3tts.model.prompt import build_prompt
    from wyoming_qwen3tts.request import SamplingParams

    p = argparse.ArgumentParser()
    p.add_argument("--size", default="0.6b")
    p.add_argument("--nb", type=int, default=16)
    p.add_argument("--at", default="127,227", help="contexts (positions) at which the step is traced")
    p.add_argument("--splits", default="", help="Talker attention chunks per head, one decoder each")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    at = sorted(int(a) for a in args.at.split(","))

    model = random_model(args.size, torch.bfloat16)
    prompt = build_prompt(model, text_ids(14), "ryan", "english")
    kb = KernelBackend(model)
    sampling = replace(SamplingParams(), suppress_eos=True)
    results = []
    for splits in [int(x) for x in args.splits.split(",") if x.strip()] or [None]:
        dec = BatchedDecoder(
            model,
            kb.ops,
            kb.weights,
            slots=max(16, args.nb),
            max_seq=prompt.length + at[-1] + 64,
            max_trailing=max(prompt.trailing.shape[0], 1),
            pdl=kb.pdl,
            attn_splits=splits,
            blas_rows=kb.options.blas_rows,
        )
        dec.admit_all([Admission(s, prompt, sampling, s) for s in range(args.nb)])
        step_splits = dec.bucket_splits[bucket_for(args.nb)]  # the chunks a head this step's attention runs
        ctx = prompt.length
        for target in at:
            torch.cuda.synchronize()
            t0, n0 = time.perf_counter(), ctx
            while ctx < target:
                dec.step()
                ctx += 1
            torch.cuda.synchronize()
            if ctx > n0:
                print(
                    f"splits {step_splits}: steps {n0}..{ctx}: {(time.perf_counter() - t0) / (ctx - n0) * 1e3:.3f} "
                    "ms/step",
                    flush=True,
                )
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(REPLAYS):
                    dec.step()
                torch.cuda.synchronize()
            ctx += REPLAYS
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(path))
                kernels = kernel_events(json.loads(path.read_text()))
            per = len(kernels) // REPLAYS
            step_us, table = charge(kernels[per:], REPLAYS - 1)
            results.append(
                dict(
                    size=args.size,
                    nb=args.nb,
                    splits=step_splits,
                    context=target,
                    step_us=round(step_us, 1),
                    launches=per,
                    kernels=table,
                )
            )
            print(
                f"\n{args.size} nb={args.nb} splits {step_splits} context {target}: {step_us:.1f} µs per step, "
                f"{per} launches",
                flush=True,
            )
            print(f"{'added us':>9} {'own us':>8} {'n':>4}  kernel [grid]")
            for r in table[:12]:
                print(f"{r['added_us']:9.1f} {r['own_us']:8.1f} {r['launches']:4.0f}  {r['kernel'][:80]} {r['grid']}")
        del dec
        torch.cuda.empty_cache()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"profile-{args.size}-nb{args.nb}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
