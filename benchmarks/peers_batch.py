"""The batched peers side by side: qwen3-tts-triton 0.3.0's generate_batch() and faster-qwen3-tts-batch
0.2.0's generate_voice_clone_batch(), timed at the stream counts of benchmarks.streams on full-size random weights.

    python -m benchmarks.peers_batch --triton-path DIR[:DIR] --fqb-path DIR[:DIR] [--peers triton,fqb]
        [--streams 1,2,4,8,16] [--frames 200] [--runs 2] [--size 1.7b] [--triton-mode hybrid] [--timeout 300]
        [--ours STREAMS_JSON] [--out peers-batch.json]
    python -m benchmarks.peers_batch --from peers-batch.json --ours STREAMS_JSON   # the table again

Each peer runs in its own subprocess with its own PYTHONPATH and a timeout. Both are built on qwen-tts 0.1.1,
faster-qwen3-tts 0.2.4 and transformers 4.57.3 (their code calls the 4.57 cache and mask APIs that transformers 5.x
renamed), so their folders hide the box's transformers. A peer that fails or runs out of time gets an "error" in its
entry; the stream counts it finished are kept. The models are built in memory by qwen-tts's own classes with the
random-weight rules of tools.random_checkpoint (no checkpoint, no tokenizer: the prompt is a fixed run of
--text-tokens ids), and end of speech is masked, so every stream decodes exactly --frames frames. The triton peer
runs CustomVoice (speaker vivian); faster-qwen3-tts-batch can only clone a voice, so it runs a Base model of the same
size from a --ref-seconds reference clip, x-vector only (its default).

One row per stream count N, with benchmarks.streams's fields: aggregate_fps = N * frames / decode time, per_stream_fps,
step_ms and admit_ms_per_stream (their batched prefill / N); the decode time is the peer's generate loop minus its
prefill forward. Also: e2e_ms and e2e_aggregate_fps (the whole public call, codec decode of every stream included),
ttfa_ms (neither peer streams in its batched path, so first audio is the whole call), capture_s (the first call's
extra time: CUDA graph capture for N), peak_alloc_gib / peak_reserved_gib (during a timed call, weights included).
The first call for each N captures the graphs and warms up at full length; medians of --runs calls after it.
With --ours (a benchmarks.streams JSON): x_aggregate = our aggregate frames/s over theirs, x_ttfa = their TTFA over ours
(both read "times better than the peer"; none where a side has no number).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]  # holds benchmarks/ and wyoming_qwen3tts/
PEERS: dict[str, dict[str, str]] = {
    "triton": {"label": "qwen3-tts-triton 0.3.0", "model_type": "custom_voice"},
    "fqb": {"label": "faster-qwen3-tts-batch 0.2.0", "model_type": "base"},
}
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog while the kettle starts to sing."


def parse_streams(text: str) -> list[int]:
    try:
        counts = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--streams: {text!r} is not a comma-separated list of stream counts") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"--streams: {text!r}: give stream counts of at least 1")
    return sorted(set(counts))


def run_order(streams: Sequence[int]) -> list[int]:
    """1 and the largest count first: the issue's two ends are in even if the timeout cuts the sweep short."""
    ends = list(dict.fromkeys([min(streams), max(streams)]))
    return ends + [n for n in streams if n not in ends]


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def streams_row(
    n: int, frames: int, e2e_s: list[float], gen_s: list[float], prefill_s: list[float], first_s: float | None
) -> dict[str, Any]:
    """One stream count's row from its timed calls (each: whole call, generate loop, prefill forward), in seconds."""
    decode = _median([g - p for g, p in zip(gen_s, prefill_s)])
    pre = _median(prefill_s)
    e2e = _median(e2e_s)
    row: dict[str, Any] = {"streams": n, "ok": True}
    row["aggregate_fps"] = n * frames / decode if decode else None
    row["per_stream_fps"] = frames / decode if decode else None
    row["step_ms"] = decode / frames * 1e3 if decode else None
    row["admit_ms_per_stream"] = pre / n * 1e3 if pre is not None else None
    row["e2e_ms"] = e2e * 1e3 if e2e else None
    row["e2e_aggregate_fps"] = n * frames / e2e if e2e else None
    row["ttfa_ms"] = row["e2e_ms"]  # no streaming in the batched path: every stream's audio comes with the call
    row["capture_s"] = max(0.0, first_s - e2e) if first_s is not None and e2e else None
    row["raw"] = {"e2e_s": e2e_s, "gen_s": gen_s, "prefill_s": prefill_s, "first_call_s": first_s}
    return row


def _ratio(num: Any, den: Any) -> float | None:
    return num / den if num and den else None


def add_ratios(result: dict[str, Any], ours: dict[str, Any] | None) -> None:
    """x_aggregate = ours / theirs and x_ttfa = theirs / ours on every peer row whose stream count we also ran."""
    by_n = {r["streams"]: r for r in (ours or {}).get("rows", []) if "streams" in r}
    for entry in result["peers"].values():
        for row in entry.get("rows", []):
            o = by_n.get(row.get("streams"), {})
            row["x_aggregate"] = _ratio(o.get("aggregate_fps"), row.get("aggregate_fps"))
            row["x_ttfa"] = _ratio(row.get("ttfa_ms"), o.get("ttfa_ms"))


def _f(v: Any, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def markdown(result: dict[str, Any], ours: dict[str, Any] | None = None) -> str:
    meta = result.get("meta", {})
    lines = [
        f"{meta.get('date', '')}; commit {meta.get('commit', '?')}; {meta.get('frames', '?')} frames per stream, "
        f"median of {meta.get('runs', '?')} timed call(s) after a capture/warm-up call per stream count"
    ]
    for name, e in result["peers"].items():
        v = e.get("versions") or {}
        if v:
            lines.append(f"- {name}: {e.get('gpu', '?')}; " + ", ".join(f"{k} {x}" for k, x in v.items()))
    lines += [
        "",
        "| engine | streams | aggregate frames/s | per stream | ms/step | admit ms/stream | TTFA ms | "
        "e2e aggregate frames/s | capture s | peak alloc / reserved GiB | x aggregate (ours/theirs) | "
        "x TTFA (theirs/ours) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if ours:
        for r in ours.get("rows", []):
            lines.append(
                f"| ours ({ours.get('label', 'batched kernels')}) | {r.get('streams')} | "
                f"{_f(r.get('aggregate_fps'), ',.1f')} | {_f(r.get('per_stream_fps'), '.1f')} | "
                f"{_f(r.get('step_ms'), '.2f')} | {_f(r.get('admit_ms_per_stream'), '.1f')} | "
                f"{_f(r.get('ttfa_ms'), '.0f')} | | | | | |"
            )
    notes = []
    for name, e in result["peers"].items():
        label = e.get("label", name)
        for r in e.get("rows", []):
            if not r.get("ok"):
                lines.append(f"| {label} | {r.get('streams')} | failed: {r.get('error', '?')} | | | | | | | | | |")
                continue
            mem = f"{_f(r.get('peak_alloc_gib'), '.2f')} / {_f(r.get('peak_reserved_gib'), '.2f')}"
            lines.append(
                f"| {label} | {r['streams']} | {_f(r.get('aggregate_fps'), ',.1f')} | "
                f"{_f(r.get('per_stream_fps'), '.1f')} | {_f(r.get('step_ms'), '.2f')} | "
                f"{_f(r.get('admit_ms_per_stream'), '.1f')} | {_f(r.get('ttfa_ms'), ',.0f')} | "
                f"{_f(r.get('e2e_aggregate_fps'), ',.1f')} | {_f(r.get('capture_s'), '.1f')} | {mem} | "
                f"{_f(r.get('x_aggregate'), '.2f')} | {_f(r.get('x_ttfa'), '.1f')} |"
            )
        if e.get("error"):
            notes.append(f"- {label}: {e['error']}")
        if e.get("notes"):
            notes.append(f"- {label}: {e['notes']}")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _reason(stderr: str) -> str:
    from .cli import _reason as reason

    return reason(stderr)


def run_peer(peer: str, spec: dict[str, Any], path: str, timeout: float, log: Path | None) -> dict[str, Any]:
    """One peer's worker subprocess; its result, with "error" set when it failed or ran out of time."""
    env = dict(os.environ)
    # The peer's folders first: they must hide the box's transformers 5.x (and any other qwen_tts).
    env["PYTHONPATH"] = os.pathsep.join([p for p in path.split(os.pathsep) if p] + [str(REPO_ROOT)])
    env.setdefault("PYTHONUNBUFFERED", "1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.peers_batch",
            "--worker",
            peer,
            "--spec",
            json.dumps(spec),
            "--result",
            str(result_file),
        ]
        error = None
        try:
            proc = subprocess.run(cmd, env=env, cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=timeout)
            output = (proc.stdout or "") + (proc.stderr or "")
            if proc.returncode != 0:
                error = f"{_reason(proc.stderr)} (exit {proc.returncode})"
        except subprocess.TimeoutExpired as err:
            out, errs = err.stdout, err.stderr
            output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (out, errs))
            error = f"timed out after {timeout:.0f} s"
        # The worker rewrites its result after every stream count, so a crash or a timeout keeps what it measured.
        res: dict[str, Any] = json.loads(result_file.read_text()) if result_file.exists() else {"rows": []}
    done = {r.get("streams") for r in res.get("rows", [])}
    missing = [n for n in spec["streams"] if n not in done]
    if error is None and not res.get("complete"):
        error = "worker exited without a complete result"
    if error and missing:
        error += f"; not run: {', '.join(map(str, missing))} streams"
    res.update(ok=error is None and all(r.get("ok") for r in res.get("rows", [])), wall_s=time.perf_counter() - started)
    if error:
        res["error"] = error
    res["rows"] = sorted(res.get("rows", []), key=lambda r: r.get("streams", 0))
    if log is not None:  # one file for both workers (the device tool brings back few files)
        with log.open("a") as f:
            f.write(f"==== {peer} ({res['wall_s']:.1f} s) ====\n{output}\n")
    return res


def _git_commit() -> str:
    from .cli import _git_commit as commit

    return commit()


def worker_main(peer: str, spec_text: str, result: str) -> int:
    from . import peers_batch_workers as workers

    spec = json.loads(spec_text)
    path = Path(result)

    def save(partial: dict[str, Any]) -> None:
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(json.dumps(partial, indent=1))
        tmp.replace(path)  # never a half-written file for the parent to read after a kill

    run = {"triton": workers.run_triton, "fqb": workers.run_fqb}[peer]
    save(run(spec, save))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers_batch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--triton-path", default="", help="PYTHONPATH of qwen3-tts-triton (+ its common folder)")
    ap.add_argument("--fqb-path", default="", help="PYTHONPATH of faster-qwen3-tts-batch (+ its common folder)")
    ap.add_argument("--peers", default="triton,fqb", help="which peers (default triton,fqb)")
    ap.add_argument("--streams", default="1,2,4,8,16", help="stream counts (default 1,2,4,8,16)")
    ap.add_argument("--frames", type=int, default=200, help="frames per stream (default 200)")
    ap.add_argument("--runs", type=int, default=2, help="timed calls per stream count (default 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per stream count, the capture included")
    ap.add_argument("--size", default="1.7b", choices=("1.7b", "0.6b", "tiny", "tiny-0.6b"))
    ap.add_argument(
        "--triton-mode",
        default="hybrid",
        choices=("hybrid", "faster"),
        help="hybrid: Triton kernels inside the CUDA graphs (its ~14x claim); faster: graphs only",
    )
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--text-tokens", type=int, default=18, help="text ids in the fixed prompt (default 18)")
    ap.add_argument("--ref-seconds", type=float, default=10.0, help="reference clip of the Base model (fqb)")
    ap.add_argument("--max-seq-len", type=int, default=2048, help="static KV cache length (both peers' default)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per peer (default 300)")
    ap.add_argument("--ours", type=Path, help="a benchmarks.streams JSON: our rows, for the ratios")
    ap.add_argument("--out", type=Path, default=Path("peers-batch.json"), help="results JSON (+ .md, .log beside it)")
    ap.add_argument("--from", dest="from_", type=Path, help="only print the table of an earlier results JSON")
    ap.add_argument("--worker", choices=tuple(PEERS), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.worker:
        return worker_main(args.worker, args.spec, args.result)

    ours = json.loads(args.ours.read_text()) if args.ours else None
    if args.from_:
        result = json.loads(args.from_.read_text())
        add_ratios(result, ours)
        print(markdown(result, ours), end="", flush=True)
        return 0

    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise SystemExit(f"unknown peers {unknown}: choose from {', '.join(PEERS)}")
    streams = parse_streams(args.streams)
    if args.frames < 1 or args.runs < 1 or args.warmup < 1:
        raise SystemExit("--frames, --runs and --warmup must be at least 1 (the first call captures the graphs)")
    cmd = "python -m benchmarks.peers_batch " + " ".join(sys.argv[1:] if argv is None else list(argv))
    result: dict[str, Any] = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "commit": _git_commit(),
            "command": cmd,
            "frames": args.frames,
            "runs": args.runs,
            "warmup": args.warmup,
            "size": args.size,
            "streams": streams,
            "text_tokens": args.text_tokens,
            "max_seq_len": args.max_seq_len,
        },
        "peers": {},
    }
    if ours:
        result["ours"] = {"source": str(args.ours), "rows": ours.get("rows", [])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.out.with_suffix(".log")
    log.write_text("")
    paths = {"triton": args.triton_path, "fqb": args.fqb_path}
    for peer in peers:
        spec = dict(
            peer=peer,
            model_type=PEERS[peer]["model_type"],
            size=args.size,
            device=args.device,
            streams=run_order(streams),
            frames=args.frames,
            runs=args.runs,
            warmup=args.warmup,
            text=args.text,
            text_tokens=args.text_tokens,
            ref_seconds=args.ref_seconds,
            max_seq_len=args.max_seq_len,
            seed=args.seed,
            speaker="vivian",
            language="english",
            mode=args.triton_mode,
        )
        if not paths[peer]:
            entry: dict[str, Any] = {"ok": False, "error": f"no --{peer}-path given", "rows": []}
        else:
            entry = run_peer(peer, spec, paths[peer], args.timeout, log)
        entry["label"] = PEERS[peer]["label"] + (f" ({args.triton_mode})" if peer == "triton" else " (Base clone)")
        result["peers"][peer] = entry
        status = "ok" if entry["ok"] else f"error: {entry.get('error')}"
        print(f"[peers_batch] {peer}: {status} ({entry.get('wall_s', 0):.0f} s)", flush=True)
        add_ratios(result, ours)
        args.out.write_text(json.dumps(result, indent=1))  # after every peer: a later failure keeps what was measured
    table = markdown(result, ours)
    args.out.with_suffix(".md").write_text(table)
    print(table, end="", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
