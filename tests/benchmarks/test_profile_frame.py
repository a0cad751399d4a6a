"""The frame profiler's trace arithmetic (kernels/device/profile_frame.py), on a hand-made trace: the
profiling itself needs a GPU and runs on the device machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "profile_frame", Path(__file__).resolve().parents[2] / "kernels" / "device" / "profile_frame.py"
)
profile_frame = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(profile_frame)


def _trace(events: list[tuple[str, float, float]]) -> dict:
    rows = [{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": dur} for n, ts, dur in events]
    rows.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0.0, "dur": 5.0})  # not a kernel
    return {"traceEvents": rows}


def test_kernel_events_keeps_device_kernels_in_start_order() -> None:
    ks = profile_frame.kernel_events(_trace([("b", 10.0, 1.0), ("a", 2.0, 3.0)]))
    assert [k["name"] for k in ks] == ["a", "b"]


def test_short_name_drops_arguments_and_namespaces() -> None:
    raw = "void (anonymous namespace)::k_gemv2<unsigned short, 2, true, 8>(unsigned short const*, int)"
    assert profile_frame.short_name(raw) == "k_gemv2<unsigned short, 2, true, 8>"


def test_summarize_splits_busy_time_and_gaps_per_frame() -> None:
    # Two frames of [gemv 4 µs, gap 1, attn 2 µs, gap 3], then the next frame.
    events, t = [], 0.0
    for _ in range(2):
        events += [("void gemv(int)", t, 4.0), ("void attn(int)", t + 5.0, 2.0)]
        t += 10.0
    res = profile_frame.summarize(profile_frame.kernel_events(_trace(events)), frames=2)
    by = {r["kernel"]: r for r in res["kernels"]}
    assert by["gemv"] == {"kernel": "gemv", "launches": 1.0, "busy_us": 4.0, "gap_us": 1.5}  # 0 then 3, / 2 frames
    assert by["attn"] == {"kernel": "attn", "launches": 1.0, "busy_us": 2.0, "gap_us": 1.0}
    assert res["busy_us_per_frame"] == 6.0 and res["gap_us_per_frame"] == 2.5 and res["launches_per_frame"] == 2.0
    assert res["frame_us"] == pytest.approx(17.0 / 2)  # first start to last end, over the frames
    assert "| `gemv` | 1 | 4.0 | 1.5 |" in profile_frame.markdown({**res, "size": "x", "gpu": "y"})


def test_overlapping_kernels_count_no_negative_gap() -> None:
    res = profile_frame.summarize(
        profile_frame.kernel_events(_trace([("a", 0.0, 10.0), ("b", 2.0, 3.0), ("c", 12.0, 1.0)])), frames=1
    )
    by = {r["kernel"]: r for r in res["kernels"]}
    assert by["b"]["gap_us"] == 0.0 and by["c"]["gap_us"] == 2.0  # c waits for a's end (10), not b's (5)


def test_kernel_events_keep_the_grid() -> None:
    trace = _trace([("a", 0.0, 1.0)])
    trace["traceEvents"][0]["args"] = {"grid": [8, 4, 16]}
    assert profile_frame.kernel_events(trace)[0]["grid"] == (8, 4, 16)


def test_batched_step_profile_charges_each_kernel_what_it_adds() -> None:
    """profile_batched_step.charge: with PDL a kernel starts before its predecessor ends; it is charged its end
    minus the previous end (its own duration apart), per (name, grid) and per step, and the charges sum to the span."""
    spec = importlib.util.spec_from_file_location(
        "profile_batched_step", Path(__file__).resolve().parents[2] / "kernels" / "device" / "profile_batched_step.py"
    )
    step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step)
    ks = [  # two steps of: gemv [0, 5), attn starting early at 1, ending 9; gemv again (other grid) 8 -> 12
        {"name": "void k_gemv<float>(int)", "grid": (64, 1, 1), "ts": 0.0, "dur": 5.0},
        {"name": "void k_attn(int)", "grid": (8, 4, 16), "ts": 1.0, "dur": 8.0},
        {"name": "void k_gemv<float>(int)", "grid": (16, 4, 1), "ts": 8.0, "dur": 4.0},
    ]
    ks += [{**k, "ts": k["ts"] + 12.0} for k in ks]
    step_us, table = step.charge(ks, 2)
    assert step_us == 12.0
    rows = {(r["kernel"], tuple(r["grid"])): r for r in table}
    assert rows[("k_attn", (8, 4, 16))] == {
        "kernel": "k_attn",
        "grid": [8, 4, 16],
        "launches": 1.0,
        "own_us": 8.0,
        "added_us": 4.0,
    }
    assert rows[("k_gemv<float>", (16, 4, 1))]["added_us"] == 3.0
    assert rows[("k_gemv<float>", (64, 1, 1))]["added_us"] == 5.0  # the first one whole, the second 5 past 12
    assert sum(r["added_us"] for r in table) == step_us
    assert [r["added_us"] for r in table] == [5.0, 4.0, 3.0]  # largest first
