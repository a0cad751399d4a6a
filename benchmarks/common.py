"""What every part of the benchmark shares: engines, labels, the worker's arguments, timing helpers."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wyoming_qwen3tts.request import SAMPLES_PER_FRAME

FRAME_RATE = 12.5  # codec frames per second of audio
OURS = ("kernels", "torch")
PEERS = ("ref", "fq")
# qwentts.cpp (benchmarks/qwentts_cpp.py), one engine name per GGUF weight variant; not run unless named.
QCPP = ("qcpp-bf16", "qcpp-q8_0")
ENGINES = (*OURS, *PEERS, *QCPP)
DEFAULT_ENGINES = (*OURS, *PEERS)
LABELS = {
    "kernels": "ours (kernels)",
    "torch": "ours (torch)",
    "ref": "qwen-tts 0.1.1 (reference)",
    "fq": "faster-qwen3-tts 0.5.4",
    "qcpp-bf16": "qwentts.cpp b91bca4 BF16",
    "qcpp-q8_0": "qwentts.cpp b91bca4 Q8_0",
}

__all__ = [
    "DEFAULT_ENGINES",
    "ENGINES",
    "FRAME_RATE",
    "LABELS",
    "OURS",
    "PEERS",
    "QCPP",
    "SAMPLES_PER_FRAME",
    "WorkerArgs",
    "median",
    "summary",
    "sync",
]


def median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def memory() -> dict[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return {"peak_alloc_gib": None, "peak_reserved_gib": None}
    gib = 1024**3
    return {
        "peak_alloc_gib": torch.cuda.max_memory_allocated() / gib,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib,
    }


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


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
    ref_seconds: float = 10.0  # a Base model's reference clip (a cloned voice, in context)
    weights: str = "bf16"  # our engines' matrices: as loaded (bf16), or int8 quantized at load (the setting)
    qcpp_runtime: str = "/tmp/qcpp"  # qwentts.cpp: the folder benchmarks.qwentts_cpp_prepare runtime made
    qcpp_gguf: str = ""  # qwentts.cpp: this checkpoint's GGUF folder (made on first use when missing)
    qcpp_streams: str = ""  # qwentts.cpp: stream counts above 1 to time on a batching context, e.g. "4,16"


def summary(decode_s: list[float], e2e_s: list[float], ttfa_s: list[float], frames: int) -> dict[str, Any]:
    d, e, t = median(decode_s), median(e2e_s), median(ttfa_s)
    audio = frames / FRAME_RATE
    return {
        "decode_fps": frames / d if d else None,
        "decode_rtf": d / audio if d else None,
        "e2e_rtf": e / audio if e else None,
        "ttfa_ms": t * 1e3 if t is not None else None,
        "raw": {"decode_s": decode_s, "e2e_s": e2e_s, "ttfa_s": ttfa_s},
    }
