"""The qwentts.cpp worker of the side-by-side bench: the PyPI wheel realtimetts-qwen-native 0.2.0 (qwentts.cpp
b91bca4, GGML, CUDA 12.8 build) driven through its own ctypes binding on GGUF files converted from our checkpoint,
one engine name per weight variant (qcpp-bf16, qcpp-q8_0).

The runtime folder (--qcpp-runtime) comes from `python -m benchmarks.qwentts_cpp_prepare runtime`, the GGUF files
from its `convert` (made here on first use when missing). Every run decodes exactly the frames asked for: the
converted talker carries an EOS id no sample can take (qwentts_cpp_prepare says why that is the only way) and
max_new_tokens = N returns N frames; each call checks its sample count.

Measured, batch 1 (a context with max_batch 1, the path RealtimeTTS uses):
- decode frames/s: frames over the autoregressive part that qwentts.cpp times itself and logs per synthesis
  ("[Perf]" TalkerDecode + CodePredictor + HostCompose: talker step, 15 code predictor passes and sampling, after
  the prefill), like our engines' decode (after the prefill); its prefill and codec times are kept in raw;
- end to end: the binding's synthesize() (prompt, prefill, decode, codec decode of the whole utterance);
- first audio: its stream() from the call to the first chunk, a one-sentence request (its first chunk is 1 frame);
- GPU memory: device-wide memory in use after the runs minus before the load (ggml allocates outside torch).
Several streams (--qcpp-streams, default 4 and 16): its C API batches concurrent qt_synthesize calls on a context
made with max_batch = N (joins at frame boundaries). The binding serialises calls with a lock, so N threads call
qt_synthesize directly with the binding's own parameter structs. Per stream count: aggregate decode frames/s =
N x frames / the longest stream's autoregressive time (each stream's is the batched steps it lived through),
per stream frames/s, and the aggregate end to end over the wall time of the N calls (prefills, codec decodes).
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from wyoming_qwen3tts.request import SAMPLE_RATE

from .common import SAMPLES_PER_FRAME, WorkerArgs, median, summary
from .qwentts_cpp_prepare import CODEC_VOCAB, convert_checkpoint, gguf_paths, read_eos

QCPP_ENGINES = {"qcpp-bf16": "bf16", "qcpp-q8_0": "q8_0"}
VERSION = "realtimetts-qwen-native 0.2.0 (qwentts.cpp b91bca4)"
_PERF = re.compile(r"^\[Perf\] (\w+) ([0-9.]+) ms(?: \((\d+) frames)?")


def parse_streams(text: str) -> list[int]:
    """'4,16' -> [4, 16]: the stream counts above 1 to time (batch 1 is the row itself)."""
    try:
        counts = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise SystemExit(f"--qcpp-streams: {text!r} is not a comma-separated list of stream counts") from None
    if any(n < 2 for n in counts):
        raise SystemExit(f"--qcpp-streams: {text!r}: stream counts are 2 or more (batch 1 is the row itself)")
    return counts


def parse_perf(lines: list[str]) -> list[dict[str, float]]:
    """qwentts.cpp's per-synthesis "[Perf]" blocks (PromptBuild ... Total) from its log, one dict per synthesis in
    the order they finished: ms per phase, frames, and ar_ms = TalkerDecode + CodePredictor + HostCompose."""
    out: list[dict[str, float]] = []
    cur: dict[str, float] = {}
    for line in lines:
        m = _PERF.match(line)
        if not m:
            continue
        key, ms, frames = m.group(1), float(m.group(2)), m.group(3)
        if key == "PromptBuild":
            cur = {}
        cur[key] = ms
        if frames is not None:
            cur["frames"] = float(frames)
        if key == "Total":
            cur["ar_ms"] = cur.get("TalkerDecode", 0.0) + cur.get("CodePredictor", 0.0) + cur.get("HostCompose", 0.0)
            out.append(cur)
    return out


def find_cublas13() -> str | None:
    """cuBLAS 13 for the libcublas.so.12 stand-in: the NVIDIA wheels on sys.path (torch's), then a CUDA toolkit."""
    patterns = [os.path.join(p, "nvidia", "*", "lib", "libcublas.so.13*") for p in sys.path if p]
    patterns += [os.path.join(p, "nvidia", "cu13", "lib", "libcublas.so.13*") for p in sys.path if p]
    patterns += [
        "/usr/local/cuda*/lib64/libcublas.so.13*",
        "/usr/local/cuda*/targets/x86_64-linux/lib/libcublas.so.13*",
    ]
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def load_binding(runtime: Path) -> Any:
    """Import the wheel's qwentts_cpp from the runtime folder with the CUDA 12 runtime and the cuBLAS stand-in it
    preloads (QWENTTS_CPP_CUDA_LIBRARY_PATH is the binding's own override), and the libcuda stand-in where the
    runtime was made without a driver."""
    site = runtime / "site"
    if not (site / "qwentts_cpp" / "lib" / "libqwen.so").exists():
        raise RuntimeError(f"no qwentts.cpp runtime in {runtime}: run python -m benchmarks.qwentts_cpp_prepare runtime")
    stub = runtime / "stub" / "libcuda.so.1"
    if stub.exists() and not _driver_loads():  # before libggml-cuda.so.0 names libcuda.so.1; never over a driver
        ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
    os.environ["QWENTTS_CPP_CUDA_LIBRARY_PATH"] = str(runtime / "cuda12")
    if not os.environ.get("QCPP_CUBLAS"):
        os.environ["QCPP_CUBLAS"] = find_cublas13() or ""
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    import qwentts_cpp

    return qwentts_cpp


def _driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


class NativeLog:
    """qwentts.cpp's log, collected (qt_log_set is process-wide; lines come from whichever thread runs the step)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, level: int, message: str) -> None:
        with self._lock:
            self.lines.append(message)
        if level >= 2:  # warnings and errors also go to the worker's stderr, which the bench keeps
            print(f"[qwentts.cpp] {message}", file=sys.stderr, flush=True)

    def take(self) -> list[str]:
        with self._lock:
            lines, self.lines = self.lines, []
        return lines


def _device_used_bytes() -> int | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
        return int(total - free)
    except Exception:
        return None


def run_qcpp(w: WorkerArgs) -> dict[str, Any]:
    quant = QCPP_ENGINES[w.engine]
    runtime = Path(w.qcpp_runtime)
    binding = load_binding(runtime)
    folder = Path(w.qcpp_gguf) if w.qcpp_gguf else runtime / "gguf" / Path(w.model).name
    talker, codec = gguf_paths(folder, quant)
    convert_s = 0.0
    if not (talker.exists() and codec.exists()):
        t = time.perf_counter()
        convert_checkpoint(Path(w.model), folder, [quant], runtime / "convert.py", log=lambda s: print(s, flush=True))
        convert_s = time.perf_counter() - t
    eos = read_eos(talker)
    if eos < CODEC_VOCAB:
        raise RuntimeError(f"{talker} keeps EOS at {eos}: convert it with benchmarks.qwentts_cpp_prepare")

    log = NativeLog()
    library = binding.QwenLibrary()
    library.set_log_callback(log)  # before the load, so the backend line is kept
    used_before = _device_used_bytes()
    t0 = time.perf_counter()
    tts = binding.QwenTTS(talker, codec, max_batch=1)
    load_s = time.perf_counter() - t0
    load_lines = log.take()
    backend = next((ln.split("backend: ", 1)[1] for ln in load_lines if "Talker backend:" in ln), "?")
    if w.device.startswith("cuda") and not backend.startswith("CUDA"):
        raise RuntimeError(f"qwentts.cpp loaded on {backend}, not a CUDA device")
    kwargs = dict(text=w.text, lang=w.language.lower(), speaker=_match(tts.speaker_names(), w.speaker))

    def call(frames: int, seed: int) -> tuple[float, dict[str, float]]:
        log.take()
        a = time.perf_counter()
        audio, sr = tts.synthesize(**kwargs, max_new_tokens=frames, seed=seed)
        total = time.perf_counter() - a
        if sr != SAMPLE_RATE or audio.size != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"qwentts.cpp returned {audio.size} samples at {sr} Hz, expected {frames} frames")
        perf = parse_perf(log.take())
        if len(perf) != 1 or int(perf[0].get("frames", -1)) != frames:
            raise RuntimeError(f"qwentts.cpp logged {perf}, expected one synthesis of {frames} frames")
        return total, perf[0]

    def stream(frames: int, seed: int) -> float:
        a = time.perf_counter()
        first = None
        samples = 0
        for chunk, _sr in tts.stream(**kwargs, max_new_tokens=frames, seed=seed):
            if first is None:
                first = time.perf_counter() - a
            samples += chunk.size
        if samples != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"qwentts.cpp streamed {samples} samples, expected {frames} frames")
        log.take()
        return first if first is not None else time.perf_counter() - a

    for i in range(w.warmup):
        call(w.frames, w.seed + 1000 + i)
    for i in range(max(1, w.warmup)):
        stream(w.sentence_frames, w.seed + 1200 + i)
    timed = [call(w.frames, w.seed + i) for i in range(w.runs)]
    e2e_s = [t for t, _ in timed]
    decode_s = [p["ar_ms"] / 1e3 for _, p in timed]
    ttfa_s = [stream(w.sentence_frames, w.seed + 200 + i) for i in range(w.runs)]
    used_after = _device_used_bytes()  # before the close: the context's weights, KV cache and graphs
    out = summary(decode_s, e2e_s, ttfa_s, w.frames)
    out["raw"].update(
        prefill_ms=[p.get("Prefill") for _, p in timed],
        codec_ms=[p.get("CodecDecode") for _, p in timed],
        first_frame_ms=[p.get("TTFA") for _, p in timed],
    )
    tts.close()
    streams = []
    for n in parse_streams(w.qcpp_streams) if w.qcpp_streams else []:
        streams.append(_streams_row(binding, talker, codec, n, w, kwargs, log, used_before))
    out.update(
        load_s=load_s,
        convert_s=convert_s,
        backend=backend,
        version=library.version(),
        quant=quant,
        streams=streams,
        peak_alloc_gib=None,
        peak_reserved_gib=_gib(used_before, used_after),
        notes=(
            f"{VERSION} {quant.upper()}; decode = its own AR timing after the prefill; TTFA from its streaming API "
            "(first chunk 1 frame); GPU memory (peak reserved) = device-wide use after the runs minus before the load"
        ),
    )
    return out


def _gib(before: int | None, after: int | None) -> float | None:
    return (after - before) / 1024**3 if before is not None and after is not None else None


def _match(names: list[str], speaker: str) -> str:
    for name in names:
        if name.lower() == speaker.lower():
            return name
    raise RuntimeError(f"speaker {speaker!r} is not among the GGUF's {names}")


def _streams_row(
    binding: Any,
    talker: Path,
    codec: Path,
    n: int,
    w: WorkerArgs,
    kwargs: dict[str, Any],
    log: NativeLog,
    used_before: int | None,
) -> dict[str, Any]:
    """N concurrent synthesize calls of w.frames frames on a max_batch = N context: warm-up once, then w.runs."""
    tts = binding.QwenTTS(talker, codec, max_batch=n)
    lib = tts.library._lib

    def one(seed: int, sink: list[Any], i: int) -> None:
        params, keepalive = tts._make_tts_params(
            **kwargs,
            ref_audio_24k=None,
            ref_spk_emb=None,
            ref_codes=None,
            ref_text=None,
            instruct=None,
            onset_silence_profile="off",
            seed=seed,
            max_new_tokens=w.frames,
            do_sample=True,
            temperature=0.9,
            top_k=50,
            top_p=1.0,
            repetition_penalty=1.05,
            subtalker_do_sample=None,
            subtalker_temperature=None,
            subtalker_top_k=None,
            subtalker_top_p=None,
            dump_dir=None,
        )
        audio = binding._binding.QtAudio()
        rc = lib.qt_synthesize(tts._ctx, ctypes.byref(params), ctypes.byref(audio))
        sink[i] = (rc, audio.n_samples)
        lib.qt_audio_free(ctypes.byref(audio))
        keepalive.clear()  # the strings and arrays params points at lived until here

    def batch(seed: int) -> tuple[float, list[dict[str, float]]]:
        log.take()
        sink: list[Any] = [None] * n
        threads = [threading.Thread(target=one, args=(seed + i, sink, i)) for i in range(n)]
        a = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - a
        bad = [s for s in sink if s is None or s[0] != 0 or s[1] != w.frames * SAMPLES_PER_FRAME]
        if bad:
            raise RuntimeError(f"{n} streams: {len(bad)} calls failed or came back short: {bad[:3]}")
        perf = parse_perf(log.take())
        if len(perf) != n:
            raise RuntimeError(f"{n} streams: qwentts.cpp logged {len(perf)} syntheses")
        return wall, perf

    try:
        batch(w.seed + 5000)  # warm-up: graphs for N lanes
        runs = [batch(w.seed + 6000 + 100 * r) for r in range(max(1, w.runs))]
        used = _device_used_bytes()
    finally:
        tts.close()
    longest = [max(p["ar_ms"] for p in perf) / 1e3 for _, perf in runs]
    each = [statistics.median(p["ar_ms"] for p in perf) / 1e3 for _, perf in runs]
    walls = [wall for wall, _ in runs]
    dl, de, wl = median(longest), median(each), median(walls)
    return {
        "streams": n,
        "aggregate_fps": n * w.frames / dl if dl else None,
        "per_stream_fps": w.frames / de if de else None,
        "e2e_aggregate_fps": n * w.frames / wl if wl else None,
        "gpu_gib": _gib(used_before, used),
        "raw": {"longest_ar_s": longest, "median_ar_s": each, "wall_s": walls},
    }
