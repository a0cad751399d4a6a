"""The first-audio tracer's trace arithmetic (kernels/device/trace_first_audio.py), on a hand-made trace: the tracing
itself needs a GPU and runs on the device machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "trace_first_audio", Path(__file__).resolve().parents[2] / "kernels" / "device" / "trace_first_audio.py"
)
trace_first_audio = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(trace_first_audio)


def _mark(name: str, ts: float, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 1.0}


def _kernel(name: str, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_each_request_is_paired_with_its_own_first_chunk() -> None:
    """The host's marks only: the GPU-side copy of a request's range (gpu_user_annotation) is not a second request,
    so the second request's window runs from its own entry to its own first chunk."""
    events = [
        _mark("q3t_request", 1000.0),
        _mark("q3t_request", 1200.0, "gpu_user_annotation"),
        _mark("q3t_first_chunk", 20000.0),
        _mark("q3t_request", 70000.0),
        _mark("q3t_request", 70100.0, "gpu_user_annotation"),
        _mark("q3t_first_chunk", 85000.0),
        _kernel("void k_gemv2<a>(int)", 2000.0, 5.0, 7),
        _kernel("void k_gemv2<a>(int)", 2010.0, 5.0, 7),
        _kernel("conv", 5000.0, 100.0, 9),
        _kernel("conv", 71000.0, 100.0, 9),
    ]
    first, second = trace_first_audio.gpu_runs({"traceEvents": events})
    assert (first["first_chunk_ms"], second["first_chunk_ms"]) == (19.0, 15.0)
    assert [(r["stream"], r["kernels"], r["start_ms"]) for r in first["runs"]] == [(7, 2, 1.0), (9, 1, 4.0)]
    assert first["kernels_by_name"] == [["7: k_gemv2<a>", 2, 0.01], ["9: conv", 1, 0.1]]
    assert [(r["stream"], r["start_ms"]) for r in second["runs"]] == [(9, 1.0)]
    assert first["busy_ms_per_stream"] == {"7": 0.01, "9": 0.1}


def test_unmatched_marks_are_refused() -> None:
    with pytest.raises(RuntimeError, match="2 request marks against 1"):
        trace_first_audio.gpu_runs(
            {"traceEvents": [_mark("q3t_request", 1.0), _mark("q3t_request", 5.0), _mark("q3t_first_chunk", 3.0)]}
        )
