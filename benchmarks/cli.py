"""Side-by-side speed benchmark: our kernels and torch backends, the reference qwen-tts, faster-qwen3-tts and
qwentts.cpp.

    python -m benchmarks [--sizes 0.6b,1.7b | --model DIR] [--backends kernels,torch,ref,fq]
        [--frames 200] [--frames-for torch=60,ref=40] [--runs 5] [--runs-for ref=3] [--out DIR]
        [--ref-path DIR[:DIR]] [--fq-path DIR[:DIR]]
        [--qcpp-runtime DIR] [--qcpp-gguf-root DIR] [--qcpp-streams 4,16]   (backends qcpp-bf16, qcpp-q8_0)

Without --model, full-size random checkpoints are written by tools.random_checkpoint under --ckpt-root (reused when
present). Per-frame cost does not depend on weight values, only the number of frames does, so end of speech is masked
(code-0 EOS never sampled) and every run decodes a fixed number of frames.

Every (size, engine) pair runs in its own subprocess (`--worker`): clean peak-memory numbers, its own PYTHONPATH for
the peers (the reference needs transformers 4.57, faster-qwen3-tts transformers 5.x), and a crash or a missing
package becomes a "cannot run: reason" row instead of ending the run. qwentts.cpp (qcpp-bf16, qcpp-q8_0; named in
--backends only) runs the realtimetts-qwen-native wheel from --qcpp-runtime on GGUF files of the same checkpoint
(benchmarks/qwentts_cpp.py), and also at --qcpp-streams concurrent streams where its C API batches them. Measured per engine:
- decode frames/s: Talker + CodePredictor only (ours: backend session after prefill; peers: their generate loop);
- end-to-end RTF: wall time of the whole public call (prompt, decode, codec, PCM) over the audio duration;
- time to first audio (TTFA): a one-sentence request (--sentence-frames frames), from the call to the first chunk
  yielded, with each engine's default first-chunk size (the reference does not stream: its whole call);
- peak GPU memory, allocated and reserved, over the worker's life (weights included). Our decode sessions are opened
  with room for --context frames, so the KV cache of a --context-frame utterance is in the peak.
Warm-up runs come first; numbers are medians of the timed runs. Writes results.json, results.md and results.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .common import DEFAULT_ENGINES, ENGINES, LABELS, OURS, QCPP, WorkerArgs, gpu_name, memory
from .report import add_ratios, merge, print_table, write_outputs
from .roofline import copy_bandwidth, roofline

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog while the kettle starts to sing in the kitchen."
REPO_ROOT = Path(__file__).resolve().parents[1]  # holds benchmarks/ and wyoming_qwen3tts/


def worker_main(args: argparse.Namespace) -> int:
    import torch

    w = WorkerArgs(
        engine=args.worker,
        model=args.model,
        device=args.device,
        frames=args.frames,
        sentence_frames=args.sentence_frames,
        runs=args.runs,
        warmup=args.warmup,
        context=args.context,
        text=args.text,
        speaker=args.speaker,
        language=args.language,
        seed=args.seed,
        ref_seconds=args.ref_seconds,
        weights=args.weights,
        qcpp_runtime=args.qcpp_runtime,
        qcpp_gguf=args.qcpp_gguf or "",
        qcpp_streams=args.qcpp_streams,
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result: dict[str, Any] = {"ok": True}
    if w.engine in OURS:
        from .ours import run_ours as run
    elif w.engine in QCPP:
        from .qwentts_cpp import run_qcpp as run
    else:
        from . import peers

        run = peers.run_ref if w.engine == "ref" else peers.run_fq
    result.update(run(w))
    if w.engine not in QCPP:  # qwentts.cpp allocates outside torch and reports its own GPU memory
        result.update(memory())
    result.update(frames=w.frames, runs=w.runs, warmup=w.warmup, gpu=gpu_name(), torch=torch.__version__)
    Path(args.result).write_text(json.dumps(result, indent=1))
    return 0


def _parse_map(text: str, cast: Callable[[str], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = item.partition("=")
        if key not in ENGINES or not value:
            raise SystemExit(f"bad per-engine setting {item!r}: use ENGINE=VALUE with ENGINE in {', '.join(ENGINES)}")
        out[key] = cast(value)
    return out


def _last_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def _reason(stderr: str) -> str:
    """The most telling line of a failed worker's stderr: the exception, else the last lines."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.split(":")[0].endswith(("Error", "Exception", "Unavailable", "NativeUnavailable")):
            return ln[:400]
    return _last_lines(stderr)[:400] or "worker exited without a result"


def run_worker(
    engine: str, model: str, args: argparse.Namespace, frames: int, runs: int, timeout: float, log_file: Path | None
) -> dict[str, Any]:
    """Run one worker subprocess; its result dict, or {"ok": False, "reason": ...}."""
    import tempfile

    env = dict(os.environ)
    extra = {"ref": args.ref_path, "fq": args.fq_path}.get(engine)
    if engine in QCPP:  # the wheel's qwentts_cpp and the gguf package travel in the runtime folder
        extra = str(Path(args.qcpp_runtime) / "site")
    root = str(REPO_ROOT)
    # Peers get their own site folders first (they hide the system transformers); ours keep the caller's path.
    paths = [p for p in (extra or "").split(os.pathsep) if p] + [root]
    if engine in OURS and env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks",
            "--worker",
            engine,
            "--model",
            model,
            "--result",
            str(result_file),
            "--device",
            args.device,
            "--frames",
            str(frames),
            "--sentence-frames",
            str(args.sentence_frames),
            "--runs",
            str(runs),
            "--warmup",
            str(args.warmup),
            "--context",
            str(args.context),
            "--text",
            args.text,
            "--speaker",
            args.speaker,
            "--language",
            args.language,
            "--seed",
            str(args.seed),
            "--ref-seconds",
            str(args.ref_seconds),
            "--weights",
            args.weights,
        ]
        if engine in QCPP:
            gguf = Path(args.qcpp_gguf_root) / Path(model).name
            cmd += ["--qcpp-runtime", args.qcpp_runtime, "--qcpp-gguf", str(gguf), "--qcpp-streams", args.qcpp_streams]
        started = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else (err.stderr or "")
            res = {"ok": False, "reason": f"timed out after {timeout:.0f} s", "stderr_tail": _last_lines(stderr)}
        else:
            stderr = proc.stderr
            if proc.returncode == 0 and result_file.exists():
                res = json.loads(result_file.read_text())
            else:
                res = {"ok": False, "reason": _reason(stderr) + f" (exit {proc.returncode})"}
        res["wall_s"] = time.perf_counter() - started
        if log_file is not None:  # one file for all workers (the device tool brings back few files)
            with log_file.open("a") as f:
                f.write(f"==== {engine} {model} ({res['wall_s']:.1f} s) ====\n{stderr or ''}\n")
    return res


# Random checkpoints of the other model types are timed under these row labels ("1.7b-base").
TYPE_SUFFIX = {"custom_voice": "", "base": "-base", "voice_design": "-voicedesign"}


def ensure_checkpoint(size: str, root: Path, device: str, model_type: str = "custom_voice") -> Path:
    from wyoming_qwen3tts.tools.random_checkpoint import write_random_checkpoint

    out = root / (size + TYPE_SUFFIX[model_type])
    if (out / "model.safetensors").exists() and (out / "speech_tokenizer" / "model.safetensors").exists():
        return out
    started = time.perf_counter()
    write_random_checkpoint(
        out, size, seed=0, device="cuda" if device.startswith("cuda") else None, model_type=model_type
    )
    print(f"[bench] wrote random {size} checkpoint to {out} in {time.perf_counter() - started:.1f} s", flush=True)
    return out


def _git_commit() -> str:
    # Q3T_COMMIT first: a copy of the working tree sent to another machine may carry stale git metadata.
    if os.environ.get("Q3T_COMMIT"):
        return os.environ["Q3T_COMMIT"]
    root = REPO_ROOT
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("Q3T_COMMIT", "unknown")


def _sizes_and_models(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.model:
        cfg = json.loads((Path(args.model) / "config.json").read_text())
        size = cfg.get("tts_model_size", Path(args.model).name)
        size = {"1b7": "1.7b", "0b6": "0.6b"}.get(size, size)
        return [(size, args.model)]
    types = [t for t in args.model_types.split(",") if t]
    unknown = set(types) - set(TYPE_SUFFIX)
    if unknown:
        raise SystemExit(f"--model-types: unknown {sorted(unknown)}; use {', '.join(TYPE_SUFFIX)}")
    # VoiceDesign is released at 1.7B only.
    return [
        (s + TYPE_SUFFIX[t], "")
        for s in args.sizes.split(",")
        if s
        for t in types
        if not (t == "voice_design" and s == "0.6b")
    ]


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1.7b,0.6b", help="random full-size checkpoints to write and time")
    ap.add_argument("--model", default="", help="an existing checkpoint directory instead of --sizes")
    ap.add_argument(
        "--model-types",
        default="custom_voice",
        help="random checkpoints of these types per size: custom_voice, base (a cloned voice from a "
        "--ref-seconds clip, in context), voice_design (1.7B); ours only",
    )
    ap.add_argument("--ref-seconds", type=float, default=10.0, help="length of a Base row's reference clip")
    ap.add_argument("--ckpt-root", type=Path, default=Path("/tmp/q3t-bench-ckpt"))
    ap.add_argument(
        "--backends", default=",".join(DEFAULT_ENGINES), help=f"any of {', '.join(ENGINES)} (qcpp-* only when named)"
    )
    ap.add_argument("--frames", type=int, default=200, help="frames per timed run (EOS masked)")
    ap.add_argument("--frames-for", default="", help="per-engine frames, e.g. torch=60,ref=40")
    ap.add_argument("--sentence-frames", type=int, default=40, help="length of the one-sentence TTFA request")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runs-for", default="", help="per-engine timed runs, e.g. ref=3")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--context", type=int, default=2000, help="frames our decode sessions are sized for")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--speaker", default="vivian")
    ap.add_argument("--language", default="english")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--weights",
        choices=("bf16", "int8"),
        default="bf16",
        help="our engines' matrices: bf16, or int8 quantized at load (the weights setting); peers as released",
    )
    ap.add_argument("--ref-path", default=None, help="PYTHONPATH for the reference (qwen-tts + transformers 4.57)")
    ap.add_argument("--fq-path", default=None, help="PYTHONPATH for faster-qwen3-tts (+ qwen-tts-hf)")
    ap.add_argument(
        "--qcpp-runtime", default="/tmp/qcpp", help="qwentts.cpp: from python -m benchmarks.qwentts_cpp_prepare runtime"
    )
    ap.add_argument(
        "--qcpp-gguf-root",
        default="/tmp/qcpp-gguf",
        help="qwentts.cpp: GGUF folders, one per checkpoint folder name (converted on first use when missing)",
    )
    ap.add_argument(
        "--qcpp-streams", default="4,16", help="qwentts.cpp: also time these concurrent stream counts ('' for none)"
    )
    ap.add_argument("--worker-timeout", type=float, default=300.0)
    ap.add_argument("--budget-s", type=float, default=0.0, help="skip workers once this much time has passed (0: none)")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--no-copy-bw", action="store_true", help="skip the device-to-device copy measurement")
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="RESULTS_JSON",
        help="only combine earlier results.json files (later ones win) into --out",
    )
    # worker mode (internal)
    ap.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--qcpp-gguf", help=argparse.SUPPRESS)
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.worker:
        return worker_main(args)
    if args.merge:
        merged = merge(args.merge)
        write_outputs(merged, args.out)
        print_table(merged)
        return 0

    started = time.perf_counter()
    import torch

    engines = [e for e in args.backends.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"unknown backends {unknown}: choose from {', '.join(ENGINES)}")
    if args.qcpp_streams and any(e in QCPP for e in engines):
        from .qwentts_cpp import parse_streams

        parse_streams(args.qcpp_streams)  # a bad list ends the run here, not in every worker
    frames_for = _parse_map(args.frames_for, int)
    runs_for = _parse_map(args.runs_for, int)
    bw = None if args.no_copy_bw or not args.device.startswith("cuda") else copy_bandwidth()
    if bw:
        print(f"[bench] device-to-device copy: {bw / 1e9:.0f} GB/s", flush=True)
    cmd = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else list(argv))
    results: dict[str, Any] = {
        "meta": {
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda or getattr(torch.version, "hip", None),
            "commit": _git_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": cmd,
            "copy_bw_gbps": bw / 1e9 if bw else None,
            "text": args.text,
            "speaker": args.speaker,
            "language": args.language,
            "context": args.context,
            "sentence_frames": args.sentence_frames,
            "warmup": args.warmup,
            "weights": args.weights,
        },
        "rows": [],
        "roofline": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = args.out / "workers.log"
    log_file.write_text("")
    configs: dict[str, dict[str, Any]] = {}
    for size, model in _sizes_and_models(args):
        if not model:
            base_size, _, kind = size.partition("-")
            model_type = {"": "custom_voice", "base": "base", "voicedesign": "voice_design"}[kind]
            model = str(ensure_checkpoint(base_size, args.ckpt_root, args.device, model_type))
        configs[size] = json.loads((Path(model) / "config.json").read_text())
        for engine in engines:
            frames = frames_for.get(engine, args.frames)
            runs = runs_for.get(engine, args.runs)
            if args.budget_s and time.perf_counter() - started > args.budget_s:
                res: dict[str, Any] = {
                    "ok": False,
                    "reason": f"skipped: the run's time budget ({args.budget_s:.0f} s) was spent",
                }
            else:
                remaining = args.worker_timeout
                if args.budget_s:
                    remaining = max(30.0, min(remaining, args.budget_s + 60 - (time.perf_counter() - started)))
                res = run_worker(engine, model, args, frames, runs, remaining, log_file)
            res.update(size=size, engine=engine, label=LABELS[engine])
            res.setdefault("frames", frames)
            results["rows"].append(res)
            status = "ok" if res.get("ok") else f"cannot run: {res['reason']}"
            fps = res.get("decode_fps")
            line = f"[bench] {size} {engine}: {status}"
            if fps:
                line += f", decode {fps:.1f} frames/s"
            if "wall_s" in res:
                line += f" ({res['wall_s']:.0f} s)"
            print(line, flush=True)
            add_ratios(results["rows"])
            results["roofline"] = roofline(results["rows"], configs, bw)
            results["configs"] = configs
            write_outputs(results, args.out)  # after every worker: a later failure keeps what was measured
    results["meta"]["total_s"] = time.perf_counter() - started
    write_outputs(results, args.out)
    print_table(results)
    return 0
