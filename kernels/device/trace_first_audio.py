"""Where a lone request's first audio goes on the GPU: the engine as the server runs it (batching backend,
`max_streams` auto, first chunk 1 frame), one request at a time on an idle GPU, traced with the torch profiler
(CUPTI). For each traced request, the GPU's work from the request's entry to its first chunk, as runs of kernels on
one CUDA stream (a run ends at a gap of more than 30 µs or a change of stream): start and end (ms after entry),
kernels, busy ms, the first kernel's name; the launches and busy ms of each kernel by name and stream; the busy ms
per stream and where the last GPU work ended. Beside it,
the codec worker's one-frame call timed alone on an idle GPU (CUDA events and host wall time, replays of the
captured call), and the engine's own debug line per request (prompt, queued, admission to first codes, codec).

    python kernels/device/trace_first_audio.py --model /tmp/ck/1.7b [--requests 8] [--traced 2] [--prefix-mb 0]

Prints the tables and writes them, with the raw runs as JSON, to $OUT/first_audio_trace.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wyoming_qwen3tts.engine import Engine
from wyoming_qwen3tts.options import EngineOptions
from wyoming_qwen3tts.request import SynthesisRequest

OUT = Path(os.environ.get("OUT") or "/tmp/q3t-out")
TEXT = "The quick brown fox jumps over the lazy dog, then rests in the shade of the old oak tree."
GAP_US = 30.0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def one_request(engine: Engine, frames: int) -> float:
    """One request of `frames` frames, read to its end; ms from entry to its first chunk."""
    speaker = engine.speakers[0] if engine.speakers else ""
    started = time.monotonic()
    first = None
    with torch.profiler.record_function("q3t_request"):
        for _chunk in engine.synthesize(SynthesisRequest(text=TEXT, speaker=speaker, max_frames=frames)):
            if first is None:
                first = time.monotonic()
                with torch.profiler.record_function("q3t_first_chunk"):
                    pass
    assert first is not None
    return (first - started) * 1000


def gpu_runs(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Each traced request's GPU work from its entry to its first chunk, as runs (see the module's docstring)."""
    events = trace.get("traceEvents", [])

    # The host's marks only: kineto also projects a range that enclosed GPU work onto the GPU's timeline
    # ("gpu_user_annotation"), which paired the second request's entry with the wrong first chunk.
    def marks(name: str) -> list[float]:
        return sorted(
            float(e["ts"])
            for e in events
            if e.get("name") == name and e.get("ph") == "X" and e.get("cat") == "user_annotation"
        )

    starts, firsts = marks("q3t_request"), marks("q3t_first_chunk")
    if len(starts) != len(firsts):
        raise RuntimeError(f"{len(starts)} request marks against {len(firsts)} first-chunk marks in the trace")
    gpu = sorted(
        (
            (float(e["ts"]), float(e["dur"]), e.get("args", {}).get("stream", -1), e["name"], e.get("cat"))
            for e in events
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        ),
        key=lambda g: g[0],
    )
    out = []
    for entry, first in zip(starts, firsts):
        window = [g for g in gpu if entry <= g[0] <= first]
        runs: list[dict[str, Any]] = []
        for ts, dur, stream, name, cat in window:
            run = runs[-1] if runs else None
            if run is None or run["stream"] != stream or ts - run["_end"] > GAP_US:
                short = re.sub(r"\(.*$", "", re.sub(r"\(anonymous namespace\)::", "", name)).replace("void ", "")
                run = {
                    "stream": stream,
                    "start_ms": (ts - entry) / 1000,
                    "kernels": 0,
                    "busy_ms": 0.0,
                    "first": short[:60],
                }
                run["_end"] = ts
                runs.append(run)
            run["kernels"] += 1
            run["busy_ms"] += dur / 1000
            run["_end"] = max(run["_end"], ts + dur)
            run["end_ms"] = (run["_end"] - entry) / 1000
            if cat == "gpu_memcpy":
                run["memcpy"] = run.get("memcpy", 0) + 1
        for run in runs:
            run.pop("_end")
            run["busy_ms"] = round(run["busy_ms"], 3)
            run["start_ms"] = round(run["start_ms"], 3)
            run["end_ms"] = round(run["end_ms"], 3)
        per_stream: dict[str, float] = {}
        for _ts, dur, stream, _name, _cat in window:
            per_stream[str(stream)] = per_stream.get(str(stream), 0.0) + dur / 1000
        names: dict[str, list[float]] = {}  # "stream: kernel" -> [launches, busy ms]
        for _ts, dur, stream, name, _cat in window:
            short = re.sub(r"\(.*$", "", re.sub(r"\(anonymous namespace\)::", "", name)).replace("void ", "")[:90]
            tally = names.setdefault(f"{stream}: {short}", [0, 0.0])
            tally[0] += 1
            tally[1] += dur / 1000
        out.append(
            {
                "kernels_by_name": sorted(([k, n, round(ms, 3)] for k, (n, ms) in names.items()), key=lambda r: -r[1]),
                "first_chunk_ms": round((first - entry) / 1000, 3),
                "last_gpu_end_ms": max((r["end_ms"] for r in runs), default=0.0),
                "busy_ms_per_stream": {k: round(v, 3) for k, v in per_stream.items()},
                "runs": runs,
            }
        )
    return out


def codec_alone(engine: Engine, calls: int = 30) -> dict[str, float]:
    """The codec worker's one-frame call for one stream, on its thread and CUDA stream, with the GPU otherwise
    idle: ms per call by CUDA events (GPU) and by the host's wall clock up to the synchronized result."""
    worker = engine._codec_worker
    assert worker is not None, "the codec worker runs with the batching backend only"

    def job() -> dict[str, float]:
        slots = worker.slots
        slot = slots.open(engine.codec.new_stream())
        codes = np.random.default_rng(0).integers(0, 2048, size=(1, 1, 16), dtype=np.int64)
        gpu, wall = [], []
        try:
            for i in range(calls + 3):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.monotonic()
                a.record()
                wav = slots.decode([slot], codes)
                b.record()
                wav.cpu()
                t1 = time.monotonic()
                if i >= 3:
                    gpu.append(a.elapsed_time(b))
                    wall.append((t1 - t0) * 1000)
        finally:
            slots.close(slot)
        return {"gpu_ms_p50": round(statistics.median(gpu), 3), "wall_ms_p50": round(statistics.median(wall), 3)}

    return worker._on_worker(job)


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# A lone request's first audio ({res['device']})", ""]
    lines.append(
        f"Untraced, {len(res['untraced_ms'])} requests: first chunk p50 {res['untraced_p50_ms']} ms "
        f"(min {min(res['untraced_ms']):.1f}, max {max(res['untraced_ms']):.1f})."
    )
    lines.append(
        f"Engine debug medians (total, prompt, queued, to codes, codec; text, build, start): {res['engine_medians']}"
    )
    lines.append(f"Codec one-frame call alone: {res['codec_alone']}")
    for i, req in enumerate(res["traced"]):
        lines += [
            "",
            f"## Traced request {i + 1}: first chunk at {req['first_chunk_ms']} ms, last GPU work ended "
            f"{req['last_gpu_end_ms']} ms; busy ms per stream {req['busy_ms_per_stream']}",
        ]
        lines += ["", "| stream: kernel | launches | busy ms |", "|---|---|---|"]
        lines += [f"| `{k}` | {n} | {ms} |" for k, n, ms in req["kernels_by_name"][:30]]
        lines += ["", "| stream | start ms | end ms | kernels | busy ms | first kernel |", "|---|---|---|---|---|---|"]
        for r in req["runs"]:
            lines.append(
                f"| {r['stream']} | {r['start_ms']} | {r['end_ms']} | {r['kernels']} | {r['busy_ms']} | `{r['first']}` |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--traced", type=int, default=2)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--prefix-mb", type=int, default=0)
    args = ap.parse_args()
    opts = EngineOptions(local_files_only=True, max_frames=150, first_chunk_frames=1, prefix_cache_mb=args.prefix_mb)
    engine = Engine.from_pretrained(args.model, opts)
    engine.warm_up()
    engine.warm_thread()
    lines = _Lines()
    log = logging.getLogger("wyoming_qwen3tts.engine")
    log.addHandler(lines)
    log.setLevel(logging.DEBUG)
    untraced = []
    for _ in range(args.requests):
        untraced.append(one_request(engine, args.frames))
        time.sleep(0.05)
    log.removeHandler(lines)
    rows = [
        list(map(float, m.groups()))
        for line in lines.lines
        if (
            m := re.search(
                r"after ([0-9.]+) ms: prompt ([0-9.]+), queued ([0-9.]+), admitted to first codes ([0-9.]+), "
                r"codec ([0-9.]+) \(prompt: text ([0-9.]+), build ([0-9.]+), start ([0-9.]+)",
                line,
            )
        )
    ]
    medians = [round(statistics.median(c), 2) for c in zip(*rows)] if rows else []
    with tempfile.TemporaryDirectory() as tmp:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            for _ in range(args.traced):
                one_request(engine, args.frames)
                time.sleep(0.05)
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        traced = gpu_runs(json.loads(path.read_text()))
    res = {
        "device": torch.cuda.get_device_name(),
        "untraced_ms": [round(v, 2) for v in untraced],
        "untraced_p50_ms": round(statistics.median(untraced), 2),
        "engine_medians": medians,
        "codec_alone": codec_alone(engine),
        "traced": traced,
    }
    text = markdown(res)
    print(text, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "first_audio_trace.md").write_text(text)
    (OUT / "first_audio_trace.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
