"""Side-by-side speed benchmark: our kernels and torch backends, the reference qwen-tts and faster-qwen3-tts.

    python -m wyoming_qwen3tts.bench [--sizes 0.6b,1.7b | --model DIR] [--backends kernels,torch,ref,fq]
        [--frames 200] [--frames-for torch=60,ref=40] [--runs 5] [--runs-for ref=3] [--out DIR]
        [--ref-path DIR[:DIR]] [--fq-path DIR[:DIR]]

Without --model, full-size random checkpoints are written by tools.random_checkpoint under --ckpt-root (reused when
present). Per-frame cost does not depend on weight values, only the number of frames does, so end of speech is masked
(code-0 EOS never sampled) and every run decodes a fixed number of frames.

Every (size, engine) pair runs in its own subprocess (`--worker`): clean peak-memory numbers, its own PYTHONPATH for
the peers (the reference needs transformers 4.57, faster-qwen3-tts transformers 5.x), and a crash or a missing
package becomes a "cannot run: reason" row instead of ending the run. Measured per engine:
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
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FRAME_RATE = 12.5  # codec frames per second of audio
SAMPLES_PER_FRAME = 1920
OURS = ("kernels", "torch")
PEERS = ("ref", "fq")
ENGINES = (*OURS, *PEERS)
LABELS = {
    "kernels": "ours (kernels)",
    "torch": "ours (torch)",
    "ref": "qwen-tts 0.1.1 (reference)",
    "fq": "faster-qwen3-tts 0.5.4",
}
DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog while the kettle starts to sing in the kitchen."

# Target numbers of issue 5 (docs/performance.md reports them).
TARGET_DECODE_FPS = {"1.7b": 300.0, "0.6b": 400.0}
TARGET_TTFA_MS = 40.0
TARGET_E2E_OVER_DECODE = 1.15
TARGET_X_REF = 10.0
TARGET_X_FQ = 4.0
TARGET_PEAK_GIB_17B = 6.0
R9700_BW = 640e9  # AMD Radeon AI PRO R9700, bytes/s (datasheet)


# ---------------------------------------------------------------------------------------------- byte counts


def frame_bytes(config: dict[str, Any], dtype_bytes: int = 2) -> dict[str, int]:
    """Weight bytes read per frame at batch 1 (qwen3-tts-model.md §8.2) from a config.json dict.

    Talker: every layer, the final norm and codec_head. CodePredictor: 15 passes, each reading every layer, the norm,
    the small_to_mtp projection (when the widths differ) and one lm_head. Embedding rows are not counted (a few KB).
    `kv_per_token`: Talker K+V bytes read per context position per frame.
    """
    tc = config["talker_config"]
    cc = tc["code_predictor_config"]

    def layer(c: dict[str, Any]) -> int:
        h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        return h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * hd

    th, ch = tc["hidden_size"], cc["hidden_size"]
    talker = (tc["num_hidden_layers"] * layer(tc) + th + tc["vocab_size"] * th) * dtype_bytes
    proj = (th * ch + ch) if th != ch else 0
    cp_pass = (cc["num_hidden_layers"] * layer(cc) + ch + proj + cc["vocab_size"] * ch) * dtype_bytes
    groups = tc.get("num_code_groups", 16)
    kv = tc["num_hidden_layers"] * 2 * tc["num_key_value_heads"] * tc["head_dim"] * dtype_bytes
    return {
        "talker": talker,
        "cp_pass": cp_pass,
        "cp_passes": groups - 1,
        "weights": talker + (groups - 1) * cp_pass,
        "kv_per_token": kv,
    }


# ---------------------------------------------------------------------------------------------- helpers


def median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _memory() -> dict[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return {"peak_alloc_gib": None, "peak_reserved_gib": None}
    gib = 1024**3
    return {
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / gib,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib,
    }


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


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


@dataclass
class WorkerArgs:
    engine: str
    model: str
    device: str
    frames: int
    sentence_frames: int
    runs: int
    warmup: int
    context: int
    text: str
    speaker: str
    language: str
    seed: int


def _summary(decode_s: list[float], e2e_s: list[float], ttfa_s: list[float], frames: int) -> dict[str, Any]:
    d, e, t = median(decode_s), median(e2e_s), median(ttfa_s)
    audio = frames / FRAME_RATE
    return {
        "decode_fps": frames / d if d else None,
        "decode_rtf": d / audio if d else None,
        "e2e_rtf": e / audio if e else None,
        "ttfa_ms": t * 1e3 if t is not None else None,
        "raw": {"decode_s": decode_s, "e2e_s": e2e_s, "ttfa_s": ttfa_s},
    }


# ---------------------------------------------------------------------------------------------- our backends


def run_ours(w: WorkerArgs) -> dict[str, Any]:
    from .engine import Engine
    from .request import SamplingParams, SynthesisRequest

    t0 = time.perf_counter()
    engine = Engine.from_pretrained(
        w.model, device=w.device, backend=w.engine, max_frames=max(w.context, w.frames), local_files_only=True
    )
    if engine.backend.name != w.engine:
        raise RuntimeError(f"engine chose backend {engine.backend.name!r}: {engine.info.backend_reason}")
    load_s = time.perf_counter() - t0
    # Fixed-length timing: code-0 EOS is never sampled (random weights end at random).
    sampling = SamplingParams(suppress_eos=True)

    def request(frames: int, seed: int) -> SynthesisRequest:
        return SynthesisRequest(text=w.text, speaker=w.speaker, language=w.language, seed=seed, max_frames=frames,
                                sampling=sampling)  # fmt: skip

    prompt = engine.prepare(request(w.frames, w.seed))

    def decode_once(seed: int) -> tuple[float, float]:
        _sync()
        a = time.perf_counter()
        session = engine.backend.start(prompt, sampling, seed, w.context)
        _sync()
        b = time.perf_counter()
        codes = session.next_frames(w.frames)  # returns host codes: synchronised
        c = time.perf_counter()
        if len(codes) != w.frames:
            raise RuntimeError(f"decoded {len(codes)} frames, asked for {w.frames}: EOS was not suppressed")
        return b - a, c - b

    def synth_once(frames: int, seed: int, first_only: bool = False) -> tuple[float, float, int]:
        a = time.perf_counter()
        first = None
        n = 0
        stream = engine.synthesize(request(frames, seed))
        for chunk in stream:
            if first is None:
                first = time.perf_counter() - a
                if first_only:
                    stream.close()
                    return first, first, chunk.num_frames
            n += chunk.num_frames
            if len(chunk.pcm) != chunk.num_frames * SAMPLES_PER_FRAME * 2:
                raise RuntimeError("chunk PCM length does not match its frames")
        total = time.perf_counter() - a
        if n != frames:
            raise RuntimeError(f"synthesized {n} frames, asked for {frames}: EOS was not suppressed")
        return first or total, total, n

    for i in range(w.warmup):
        decode_once(w.seed + 1000 + i)
        synth_once(w.frames, w.seed + 2000 + i)
        synth_once(w.sentence_frames, w.seed + 3000 + i, first_only=True)
    prefill_s, decode_s, e2e_s, ttfa_s = [], [], [], []
    for i in range(w.runs):
        p, d = decode_once(w.seed + i)
        prefill_s.append(p)
        decode_s.append(d)
    for i in range(w.runs):
        e2e_s.append(synth_once(w.frames, w.seed + 100 + i)[1])
    for i in range(w.runs):
        ttfa_s.append(synth_once(w.sentence_frames, w.seed + 200 + i, first_only=True)[0])
    out = _summary(decode_s, e2e_s, ttfa_s, w.frames)
    out["raw"]["prefill_s"] = prefill_s
    out.update(
        load_s=load_s,
        prompt_positions=prompt.length,
        first_chunk_frames=engine.first_chunk_frames,
        dtype=engine.info.dtype,
        notes=f"decode sessions sized for {w.context} frames; TTFA chunk {engine.first_chunk_frames} frames",
    )
    del engine
    return out


# ---------------------------------------------------------------------------------------------- peers


def _mask_eos(model: Any, eos_id: int) -> None:
    def hook(_module: Any, _inputs: Any, out: Any) -> Any:
        out[..., eos_id] = float("-inf")
        return out

    model.talker.codec_head.register_forward_hook(hook)


def _timed(obj: Any, name: str, sink: list[float]) -> None:
    """Replace obj.name (looked up at call time) by a wrapper that appends its synchronised duration to sink."""
    fn = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _sync()
        a = time.perf_counter()
        result = fn(*args, **kwargs)
        _sync()
        sink.append(time.perf_counter() - a)
        return result

    setattr(obj, name, wrapper)


def _peer_dtype(device: str) -> Any:
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _speaker_name(speaker: str) -> str:
    return speaker[:1].upper() + speaker[1:].lower()


def _language_name(language: str) -> str:
    return "Auto" if language.lower() == "auto" else language[:1].upper() + language[1:].lower()


def run_ref(w: WorkerArgs) -> dict[str, Any]:
    import torch
    from qwen_tts import Qwen3TTSModel  # the reference, from --ref-path

    t0 = time.perf_counter()
    tts = Qwen3TTSModel.from_pretrained(
        w.model, device_map=w.device, dtype=_peer_dtype(w.device), attn_implementation="sdpa"
    )
    load_s = time.perf_counter() - t0
    model = tts.model
    _mask_eos(model, model.config.talker_config.codec_eos_token_id)
    gen_s: list[float] = []
    codec_s: list[float] = []
    _timed(model, "generate", gen_s)
    _timed(model.speech_tokenizer, "decode", codec_s)
    speaker, language = _speaker_name(w.speaker), _language_name(w.language)

    def call(frames: int, seed: int) -> float:
        torch.manual_seed(seed)
        a = time.perf_counter()
        # max_new_tokens = M returns M - 1 frames: the last sampled code 0 is never completed.
        wavs, sr = tts.generate_custom_voice(w.text, speaker=speaker, language=language, max_new_tokens=frames + 1)
        total = time.perf_counter() - a
        if sr != 24000 or wavs[0].size != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"reference returned {wavs[0].size} samples at {sr} Hz, expected {frames} frames")
        return total

    for i in range(w.warmup):
        call(w.frames, w.seed + 1000 + i)
    gen_s.clear()
    codec_s.clear()
    e2e_s = [call(w.frames, w.seed + i) for i in range(w.runs)]
    decode_s = list(gen_s)  # includes the prefill: generate() runs both
    out = _summary(decode_s, e2e_s, [], w.frames)
    ttfa = e2e_s if w.frames == w.sentence_frames else None
    if ttfa is None:
        ttfa = [call(w.sentence_frames, w.seed + 200 + i) for i in range(max(1, w.runs // 2))]
    out["ttfa_ms"] = median(ttfa) * 1e3
    out["raw"].update(ttfa_s=ttfa, codec_s=codec_s)
    out.update(load_s=load_s, notes="no streaming API: first audio is the whole call; decode time includes prefill")
    return out


def _patch_mimi_rope() -> None:
    """qwen-tts-hf on transformers 5.x: its "default" RoPE init reads config.rope_theta, which the v5 Mimi config keeps
    in rope_parameters (running-peers-on-the-gpu.md §5). Fall back to that; the numbers are the same."""
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return
    inner = ROPE_INIT_FUNCTIONS.get("default")
    if inner is None or getattr(inner, "_bench_wrapped", False):
        return

    def default(config: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(config, "rope_theta", None) is None:
            params = getattr(config, "rope_parameters", None) or {}
            theta = params.get("rope_theta") if isinstance(params, dict) else None
            if theta is not None:
                try:
                    config.rope_theta = theta
                except Exception:
                    pass
        return inner(config, *args, **kwargs)

    default._bench_wrapped = True  # type: ignore[attr-defined]
    ROPE_INIT_FUNCTIONS["default"] = default


def run_fq(w: WorkerArgs) -> dict[str, Any]:
    import torch

    import qwen_tts  # noqa: F401  (qwen-tts-hf from --fq-path; registers its RoPE entry first)

    _patch_mimi_rope()
    import faster_qwen3_tts.generate as fq_generate
    from faster_qwen3_tts import FasterQwen3TTS

    t0 = time.perf_counter()
    fq = FasterQwen3TTS.from_pretrained(w.model, device=w.device, dtype=_peer_dtype(w.device),
                                        attn_implementation="sdpa", max_seq_len=2048)  # fmt: skip
    load_s = time.perf_counter() - t0
    model = fq.model.model
    _mask_eos(model, model.config.talker_config.codec_eos_token_id)
    gen_s: list[float] = []
    _timed(fq_generate, "fast_generate", gen_s)
    speaker, language = _speaker_name(w.speaker), _language_name(w.language)

    def call(frames: int, seed: int) -> float:
        torch.manual_seed(seed)
        a = time.perf_counter()
        wavs, sr = fq.generate_custom_voice(w.text, speaker=speaker, language=language, max_new_tokens=frames)
        total = time.perf_counter() - a
        if sr != 24000 or wavs[0].size != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"faster-qwen3-tts returned {wavs[0].size} samples at {sr} Hz, expected {frames} frames")
        return total

    def stream(frames: int, seed: int, first_only: bool = False) -> float:
        torch.manual_seed(seed)
        a = time.perf_counter()
        first = None
        samples = 0
        gen = fq.generate_custom_voice_streaming(w.text, speaker=speaker, language=language, max_new_tokens=frames)
        for item in gen:
            if first is None:
                first = time.perf_counter() - a
                if first_only:
                    gen.close()
                    return first
            samples += len(item[0])
        if samples != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"faster-qwen3-tts streamed {samples} samples, expected {frames} frames")
        return first if first is not None else time.perf_counter() - a

    t1 = time.perf_counter()
    call(w.frames, w.seed + 1000)  # captures both CUDA graphs
    capture_s = time.perf_counter() - t1
    for i in range(w.warmup):
        call(w.frames, w.seed + 1100 + i)
    for i in range(max(1, w.warmup)):
        stream(w.sentence_frames, w.seed + 1200 + i)  # first stream decodes new, short codec shapes
    gen_s.clear()
    e2e_s = [call(w.frames, w.seed + i) for i in range(w.runs)]
    decode_s = list(gen_s)  # fast_generate: prefill + decode loop
    ttfa_s = [stream(w.sentence_frames, w.seed + 200 + i, first_only=True) for i in range(w.runs)]
    out = _summary(decode_s, e2e_s, ttfa_s, w.frames)
    out.update(load_s=load_s, capture_s=capture_s,
               notes="decode time includes prefill; TTFA from its streaming API, default chunk_size=12")  # fmt: skip
    return out


WORKERS: dict[str, Callable[[WorkerArgs], dict[str, Any]]] = {
    "kernels": run_ours,
    "torch": run_ours,
    "ref": run_ref,
    "fq": run_fq,
}


def worker_main(args: argparse.Namespace) -> int:
    import torch

    w = WorkerArgs(
        engine=args.worker, model=args.model, device=args.device, frames=args.frames,
        sentence_frames=args.sentence_frames, runs=args.runs, warmup=args.warmup, context=args.context,
        text=args.text, speaker=args.speaker, language=args.language, seed=args.seed,
    )  # fmt: skip
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    result: dict[str, Any] = {"ok": True}
    result.update(WORKERS[w.engine](w))
    result.update(_memory())
    result.update(frames=w.frames, runs=w.runs, warmup=w.warmup, gpu=_gpu_name(), torch=torch.__version__)
    Path(args.result).write_text(json.dumps(result, indent=1))
    return 0


# ---------------------------------------------------------------------------------------------- driver


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


def run_worker(engine: str, model: str, args: argparse.Namespace, frames: int, runs: int, timeout: float,
               log_file: Path | None) -> dict[str, Any]:  # fmt: skip
    """Run one worker subprocess; its result dict, or {"ok": False, "reason": ...}."""
    import tempfile

    env = dict(os.environ)
    extra = {"ref": args.ref_path, "fq": args.fq_path}.get(engine)
    root = str(Path(__file__).resolve().parent.parent)
    # Peers get their own site folders first (they hide the system transformers); ours keep the caller's path.
    paths = [p for p in (extra or "").split(os.pathsep) if p] + [root]
    if engine in OURS and env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "wyoming_qwen3tts.bench", "--worker", engine, "--model", model,
            "--result", str(result_file), "--device", args.device, "--frames", str(frames),
            "--sentence-frames", str(args.sentence_frames), "--runs", str(runs), "--warmup", str(args.warmup),
            "--context", str(args.context), "--text", args.text, "--speaker", args.speaker,
            "--language", args.language, "--seed", str(args.seed),
        ]  # fmt: skip
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


def ensure_checkpoint(size: str, root: Path, device: str) -> Path:
    from .tools.random_checkpoint import write_random_checkpoint

    out = root / size
    if (out / "model.safetensors").exists() and (out / "speech_tokenizer" / "model.safetensors").exists():
        return out
    started = time.perf_counter()
    write_random_checkpoint(out, size, seed=0, device="cuda" if device.startswith("cuda") else None)
    print(f"[bench] wrote random {size} checkpoint to {out} in {time.perf_counter() - started:.1f} s", flush=True)
    return out


def _git_commit() -> str:
    # Q3T_COMMIT first: a copy of the working tree sent to another machine may carry stale git metadata.
    if os.environ.get("Q3T_COMMIT"):
        return os.environ["Q3T_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("Q3T_COMMIT", "unknown")


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """x_ref / x_fq: decode frames/s over the peer's, and the peer's e2e RTF and TTFA over ours (higher = better)."""
    by = {(r["size"], r["engine"]): r for r in rows}
    for r in rows:
        for peer in PEERS:
            p = by.get((r["size"], peer))
            ratios: dict[str, float | None] = {"decode": None, "e2e": None, "ttfa": None}
            if r.get("ok") and p and p.get("ok"):
                if r.get("decode_fps") and p.get("decode_fps"):
                    ratios["decode"] = r["decode_fps"] / p["decode_fps"]
                if r.get("e2e_rtf") and p.get("e2e_rtf"):
                    ratios["e2e"] = p["e2e_rtf"] / r["e2e_rtf"]
                if r.get("ttfa_ms") and p.get("ttfa_ms"):
                    ratios["ttfa"] = p["ttfa_ms"] / r["ttfa_ms"]
            r[f"x_{peer}"] = ratios


def _f(v: Any, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [f"GPU: {meta['gpu']}; torch {meta['torch']}; commit {meta['commit']}; {meta['date']}"]
    for i, run in enumerate(meta.get("runs") or [], 1):
        lines.append(f"- run {i} ({run['date']}, copy {_f(run.get('copy_bw_gbps'), '.0f')} GB/s): `{run['command']}`")
    lines += [
        "",
        "| size | engine | frames | decode frames/s | × ref | × fq | e2e RTF | e2e / decode | TTFA ms | "
        "peak alloc GiB | peak reserved GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in results["rows"]:
        label = LABELS.get(r["engine"], r["engine"])
        if not r.get("ok"):
            lines.append(f"| {r['size']} | {label} | – | cannot run: {r['reason']} | | | | | | | |")
            notes.append(f"- {r['size']} {label} cannot run: {r['reason']}")
            continue
        over = r["e2e_rtf"] / r["decode_rtf"] if r.get("e2e_rtf") and r.get("decode_rtf") else None
        lines.append(
            f"| {r['size']} | {label} | {r['frames']} | {_f(r.get('decode_fps'), '.1f')} | "
            f"{_f(r['x_ref']['decode'], '.1f')} | {_f(r['x_fq']['decode'], '.2f')} | {_f(r.get('e2e_rtf'), '.4f')} | "
            f"{_f(over, '.2f')} | {_f(r.get('ttfa_ms'), '.1f')} | {_f(r.get('peak_alloc_gib'), '.2f')} | "
            f"{_f(r.get('peak_reserved_gib'), '.2f')} |"
        )
    rl = results.get("roofline") or []
    if rl:
        lines += [
            "",
            f"Roofline: measured device-to-device copy bandwidth {_f(meta.get('copy_bw_gbps'), '.0f')} GB/s.",
            "",
            "| size | weight bytes/frame | + KV bytes/frame | floor ms/frame | floor frames/s | ours (kernels) "
            "frames/s | fraction of floor | R9700 floor frames/s (640 GB/s) | R9700 at the same fraction |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for x in rl:
            lines.append(
                f"| {x['size']} | {x['weight_bytes']:,} | {x['kv_bytes']:,} | {_f(x.get('floor_ms'), '.3f')} | "
                f"{_f(x.get('floor_fps'), '.0f')} | {_f(x.get('kernels_fps'), '.1f')} | {_f(x.get('fraction'), '.1%')} | "
                f"{x['r9700_floor_fps']:.0f} | {_f(x.get('r9700_projected_fps'), '.0f')} |"
            )
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    engines = [e for e in ENGINES if any(r["engine"] == e for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    width = 0.8 / max(1, len(engines))
    for k, (key, title, axis) in enumerate(
        (("decode_fps", "decode frames/s (higher is better)", axes[0]), ("ttfa_ms", "time to first audio, ms (lower is better)", axes[1]))
    ):
        for j, eng in enumerate(engines):
            vals = []
            for s in sizes:
                r = next((r for r in rows if r["size"] == s and r["engine"] == eng), None)
                vals.append(r.get(key) if r and r.get("ok") and r.get(key) else 0.0)
            xs = [i + (j - (len(engines) - 1) / 2) * width for i in range(len(sizes))]
            bars = axis.bar(xs, [v or float("nan") for v in vals], width, label=LABELS.get(eng, eng))
            for x, v, b in zip(xs, vals, bars):
                if v:
                    axis.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
                else:  # no number: say so at the bottom of the plot
                    axis.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=7, rotation=90,
                              transform=axis.get_xaxis_transform(), color=b.get_facecolor())  # fmt: skip
        axis.set_xticks(range(len(sizes)), sizes)
        axis.set_xlim(-0.5, len(sizes) - 0.5)
        axis.set_yscale("log")
        axis.set_title(title, fontsize=10)
        if k == 0:
            for s_i, s in enumerate(sizes):
                tgt = TARGET_DECODE_FPS.get(s)
                if tgt:
                    axis.hlines(tgt, s_i - 0.45, s_i + 0.45, colors="k", linestyles="dashed", linewidth=0.8)
        else:
            axis.axhline(TARGET_TTFA_MS, color="k", linestyle="dashed", linewidth=0.8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncols=len(engines))
    meta = results["meta"]
    fig.suptitle(f"Qwen3-TTS-12Hz CustomVoice, batch 1 — {meta['gpu']} — dashed: targets", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def roofline(rows: list[dict[str, Any]], configs: dict[str, dict[str, Any]], bw: float | None) -> list[dict[str, Any]]:
    out = []
    for size, cfg in configs.items():
        fb = frame_bytes(cfg)
        k = next((r for r in rows if r["size"] == size and r["engine"] == "kernels" and r.get("ok")), None)
        frames = k["frames"] if k else 200
        ctx = (k.get("prompt_positions", 40) if k else 40) + frames / 2  # mean Talker context over the run
        kv = int(fb["kv_per_token"] * ctx)
        total = fb["weights"] + kv
        x: dict[str, Any] = {"size": size, "weight_bytes": fb["weights"], "kv_bytes": kv, "bytes": total,
                             "r9700_floor_fps": R9700_BW / total}  # fmt: skip
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


def write_outputs(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    try:
        chart(results, out / "results.png")
    except ImportError as err:  # matplotlib missing: the table and JSON still stand
        print(f"[bench] no chart: {err}", file=sys.stderr)


def print_table(results: dict[str, Any]) -> None:
    print(markdown(results), flush=True)


def merge(files: Sequence[Path]) -> dict[str, Any]:
    """Combine results.json files of several runs (on one GPU): a later file's row replaces an earlier one's for the
    same (size, engine); ratios and the roofline are recomputed, the roofline with the last run's copy bandwidth."""
    from .tools.random_checkpoint import model_config_dict

    loaded = [json.loads(Path(f).read_text()) for f in files]
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for i, res in enumerate(loaded):
        for r in res["rows"]:
            r = dict(r, run=i + 1)
            rows[(r["size"], r["engine"])] = r
        configs.update(res.get("configs") or {})
    sizes = list(dict.fromkeys(r["size"] for res in loaded for r in res["rows"]))
    ordered = [rows[k] for k in sorted(rows, key=lambda k: (sizes.index(k[0]), ENGINES.index(k[1])))]
    for r in ordered:
        if r["size"] not in configs:
            configs[r["size"]] = model_config_dict(r["size"])
    gpus = {res["meta"]["gpu"] for res in loaded}
    if len(gpus) > 1:
        raise SystemExit(f"results come from different GPUs: {sorted(gpus)}")
    meta = dict(loaded[-1]["meta"])
    meta["runs"] = [res["meta"] for res in loaded]
    meta["command"] = " ; ".join(res["meta"]["command"] for res in loaded)
    bw = meta["copy_bw_gbps"] * 1e9 if meta.get("copy_bw_gbps") else None
    add_ratios(ordered)
    return {"meta": meta, "rows": ordered, "roofline": roofline(ordered, configs, bw), "configs": configs}


def _sizes_and_models(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.model:
        cfg = json.loads((Path(args.model) / "config.json").read_text())
        size = cfg.get("tts_model_size", Path(args.model).name)
        size = {"1b7": "1.7b", "0b6": "0.6b"}.get(size, size)
        return [(size, args.model)]
    return [(s, "") for s in args.sizes.split(",") if s]


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wyoming_qwen3tts.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1.7b,0.6b", help="random full-size checkpoints to write and time")
    ap.add_argument("--model", default="", help="an existing checkpoint directory instead of --sizes")
    ap.add_argument("--ckpt-root", type=Path, default=Path("/tmp/q3t-bench-ckpt"))
    ap.add_argument("--backends", default=",".join(ENGINES))
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
    ap.add_argument("--ref-path", default=None, help="PYTHONPATH for the reference (qwen-tts + transformers 4.57)")
    ap.add_argument("--fq-path", default=None, help="PYTHONPATH for faster-qwen3-tts (+ qwen-tts-hf)")
    ap.add_argument("--worker-timeout", type=float, default=300.0)
    ap.add_argument("--budget-s", type=float, default=0.0, help="skip workers once this much time has passed (0: none)")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--no-copy-bw", action="store_true", help="skip the device-to-device copy measurement")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="RESULTS_JSON",
                    help="only combine earlier results.json files (later ones win) into --out")  # fmt: skip
    # worker mode (internal)
    ap.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
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
    frames_for = _parse_map(args.frames_for, int)
    runs_for = _parse_map(args.runs_for, int)
    bw = None if args.no_copy_bw or not args.device.startswith("cuda") else copy_bandwidth()
    if bw:
        print(f"[bench] device-to-device copy: {bw / 1e9:.0f} GB/s", flush=True)
    cmd = "python -m wyoming_qwen3tts.bench " + " ".join(sys.argv[1:] if argv is None else list(argv))
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
            model = str(ensure_checkpoint(size, args.ckpt_root, args.device))
        configs[size] = json.loads((Path(model) / "config.json").read_text())
        for engine in engines:
            frames = frames_for.get(engine, args.frames)
            runs = runs_for.get(engine, args.runs)
            if args.budget_s and time.perf_counter() - started > args.budget_s:
                res: dict[str, Any] = {"ok": False, "reason": f"skipped: the run's time budget ({args.budget_s:.0f} s) was spent"}
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


if __name__ == "__main__":
    sys.exit(main())
