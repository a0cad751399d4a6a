"""Where the time of one frame goes: every kernel of the replayed frame graph, with its duration and
the idle gap before it, from a CUDA trace (torch profiler / CUPTI; graph kernels are traced one by one).

Random full-size bf16 model, default sampling, the default backend options (Q3T_PDL=0 etc. override
them, kernels/README.md). Prints a per-kernel-name table (launches per frame, µs per frame busy, µs per frame
in the gaps before them) and the frame's busy/gap totals; writes the table and the raw per-launch rows
as JSON. Usage: python kernels/device/profile_frame.py [0.6b 1.7b] [--out DIR]
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

FRAMES = 12  # replays traced; the first two are dropped (allocator / clock warm-up)
SKIP = 2


def kernel_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The device kernels of a chrome trace, in start order: name, grid, ts (µs), dur (µs)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    return sorted(
        (
            {
                "name": e["name"],
                "grid": tuple(e.get("args", {}).get("grid", ())),
                "ts": float(e["ts"]),
                "dur": float(e["dur"]),
            }
            for e in events
        ),
        key=lambda e: e["ts"],
    )


def short_name(name: str) -> str:
    """k_gemv2<unsigned short, 2, true, 8>(...) -> k_gemv2<unsigned short, 2, true, 8>; namespaces dropped."""
    name = re.sub(r"\(anonymous namespace\)::|_GLOBAL__N__\w+::", "", name)
    name = re.sub(r"\(.*$", "", name)
    return name.replace("void ", "").strip()


def summarize(kernels: list[dict[str, Any]], frames: int) -> dict[str, Any]:
    """Per-name totals over `frames` equal frames: launches, busy µs and the gap µs before each launch
    (start minus the previous kernel's end; the first kernel of the window has no gap), per frame."""
    rows: dict[str, dict[str, float]] = defaultdict(lambda: {"launches": 0.0, "busy_us": 0.0, "gap_us": 0.0})
    prev_end: float | None = None
    for k in kernels:
        r = rows[short_name(k["name"])]
        r["launches"] += 1
        r["busy_us"] += k["dur"]
        if prev_end is not None:
            r["gap_us"] += max(0.0, k["ts"] - prev_end)
        prev_end = max(prev_end or 0.0, k["ts"] + k["dur"])
    table = [
        {"kernel": name, **{key: round(v / frames, 3) for key, v in r.items()}}
        for name, r in sorted(rows.items(), key=lambda kv: -(kv[1]["busy_us"] + kv[1]["gap_us"]))
    ]
    span = (kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]) if kernels else 0.0
    return {
        "frames": frames,
        "frame_us": round(span / frames, 2) if frames else 0.0,
        "busy_us_per_frame": round(sum(r["busy_us"] for r in rows.values()) / frames, 2) if frames else 0.0,
        "gap_us_per_frame": round(sum(r["gap_us"] for r in rows.values()) / frames, 2) if frames else 0.0,
        "launches_per_frame": round(sum(r["launches"] for r in rows.values()) / frames, 1) if frames else 0.0,
        "kernels": table,
    }


def sections(kernels: list[dict[str, Any]], frames: int) -> list[dict[str, Any]]:
    """Where a frame's time goes by part, each launch charged its end minus the latest end before it (PDL lets
    a kernel start, and wait, while its predecessor runs: this counts the overlap once and the idle time
    between kernels with the launch after it). The parts follow the frame's draws (k_sample): up to the first
    draw the codec head and code 0's draw, between draw j and j + 1 the CodePredictor's pass for code j + 1
    (its first pass runs positions 0 and 1 together), after the last draw the Talker's step (codes stored,
    embeddings summed, its layers). Per part per frame: µs charged, of which the draw's, and launches."""
    per_frame = len(kernels) // frames if frames else 0
    parts: dict[str, dict[str, float]] = {}
    prev_end: float | None = None
    for f in range(frames):
        draws = 0
        for k in kernels[f * per_frame : (f + 1) * per_frame]:
            name = short_name(k["name"])
            end = k["ts"] + k["dur"]
            charge = k["dur"] if prev_end is None else max(0.0, end - prev_end)
            prev_end = max(prev_end or 0.0, end)
            part = "codec head + code 0" if draws == 0 else "Talker step" if draws == 16 else f"CP pass {draws}"
            r = parts.setdefault(part, {"us": 0.0, "draw_us": 0.0, "launches": 0.0})
            r["us"] += charge
            r["launches"] += 1
            if name == "k_sample":
                r["draw_us"] += charge
                draws += 1
    return [{"part": part, **{key: round(v / frames, 2) for key, v in r.items()}} for part, r in parts.items()]


def profile(size: str) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import random_model, text_ids

    from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
    from wyoming_qwen3tts.model.prompt import build_prompt
    from wyoming_qwen3tts.request import SamplingParams

    model = random_model(size, torch.bfloat16)
    prompt = build_prompt(model, text_ids(20), "ryan", "english")
    kb = KernelBackend(model)
    sess = kb.start(prompt, SamplingParams(), 0, 1000)
    sess.next_frames(8)  # capture + warm-up
    graph = kb.frame_graph(SamplingParams())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(FRAMES):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        kernels = kernel_events(json.loads(path.read_text()))
    per_frame = len(kernels) // FRAMES
    window = kernels[SKIP * per_frame : FRAMES * per_frame]
    out = summarize(window, FRAMES - SKIP)
    out["sections"] = sections(window, FRAMES - SKIP)
    out.update(size=size, gpu=torch.cuda.get_device_name(), pdl=kb.pdl)
    del kb, sess, model
    torch.cuda.empty_cache()
    return out


def markdown(res: dict[str, Any], top: int = 25) -> str:
    lines = [
        f"### {res['size']} on {res['gpu']}: {res['frame_us']} µs per frame, {res['launches_per_frame']} launches, "
        f"busy {res['busy_us_per_frame']} µs, gaps {res['gap_us_per_frame']} µs",
        "",
        "| kernel | launches / frame | busy µs / frame | gap µs / frame (before it) |",
        "|---|---|---|---|",
    ]
    for r in res["kernels"][:top]:
        lines.append(f"| `{r['kernel']}` | {r['launches']:g} | {r['busy_us']:.1f} | {r['gap_us']:.1f} |")
    lines += [
        "",
        "| part | µs / frame (end minus the latest end before) | of which the draw | launches |",
        "|---|---|---|---|",
    ]
    for r in res.get("sections", []):
        lines.append(f"| {r['part']} | {r['us']:.1f} | {r['draw_us']:.1f} | {r['launches']:g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    out_dir = None
    if "--out" in argv:
        i = argv.index("--out")
        out_dir = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    results = [profile(size) for size in (argv or ["0.6b", "1.7b"])]
    text = "\n".join(markdown(r) for r in results)
    print(text, flush=True)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "profile_frame.json").write_text(json.dumps(results, indent=1))
        (out_dir / "profile_frame.md").write_text(text)


if __name__ == "__main__":
    main(sys.argv[1:])
