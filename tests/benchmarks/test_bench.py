"""The benchmark (benchmarks) on the CPU with a tiny checkpoint: the real worker path of our torch backend, the outputs
(JSON, markdown, PNG), "cannot run: reason" rows, and the §8 byte counts behind the roofline."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import cli, report, roofline
from wyoming_qwen3tts.options import EngineOptions
from wyoming_qwen3tts.tools.random_checkpoint import model_config_dict


def test_frame_bytes_match_the_model_doc() -> None:
    # qwen3-tts-model.md §8.2: Talker step and one CodePredictor pass, bf16, batch 1.
    big = roofline.frame_bytes(model_config_dict("1.7b"))
    small = roofline.frame_bytes(model_config_dict("0.6b"))
    assert big["talker"] == 2_831_403_008 and small["talker"] == 887_226_368
    assert big["cp_pass"] == 165_702_144 and small["cp_pass"] == 161_505_792
    assert big["cp_passes"] == 15
    assert big["weights"] == 2_831_403_008 + 15 * 165_702_144  # ≈ 5.317 GB
    assert round(small["weights"] / 1e9, 3) == 3.310
    assert big["kv_per_token"] == small["kv_per_token"] == 114_688


def test_frame_bytes_of_int8_weights() -> None:
    """weights="int8": every matrix one byte an element and four a row (its scale); norms and the projection's bias
    as before. So a frame reads a little over half the bf16 bytes."""
    for size in ("1.7b", "0.6b"):
        cfg = model_config_dict(size)
        bf16, int8 = roofline.frame_bytes(cfg), roofline.frame_bytes(cfg, weights="int8")
        tc = cfg["talker_config"]
        h, i, hd, layers = tc["hidden_size"], tc["intermediate_size"], tc["head_dim"], tc["num_hidden_layers"]
        q, kv = tc["num_attention_heads"] * hd, tc["num_key_value_heads"] * hd
        elements = layers * (h * (q + 2 * kv) + q * h + 3 * h * i) + tc["vocab_size"] * h
        rows = layers * (q + 2 * kv + h + 2 * i + h) + tc["vocab_size"]
        assert bf16["talker"] - int8["talker"] == elements - 4 * rows  # two bytes an element -> one, plus scales
        assert 0.5 < int8["weights"] / bf16["weights"] < 0.51
        assert int8["kv_per_token"] == bf16["kv_per_token"]


def test_no_eos_wrapper_keeps_the_torch_session_going(tiny_checkpoint: Path) -> None:
    from wyoming_qwen3tts.engine import Engine, EngineOptions
    from wyoming_qwen3tts.request import SamplingParams, SynthesisRequest

    engine = Engine.from_pretrained(
        str(tiny_checkpoint), EngineOptions(device="cpu", backend="torch", local_files_only=True)
    )
    prompt = engine.prepare(SynthesisRequest(text="Hello there.", speaker="vivian", language="english"))
    eos = engine.config.talker.codec_eos_token_id

    # Make EOS the certain greedy choice: without the wrapper the session ends once min-new-tokens allows it.
    def force_eos(_module: object, _inputs: object, logits: torch.Tensor) -> torch.Tensor:
        logits[..., eos] = 1e4
        return logits

    engine.model.talker.codec_head.register_forward_hook(force_eos)
    plain = engine.backend.start(prompt, SamplingParams.greedy(), 0, 8).next_frames(8)
    assert len(plain) < 8
    no_eos = dataclasses.replace(SamplingParams.greedy(), suppress_eos=True)
    masked = engine.backend.start(prompt, no_eos, 0, 8).next_frames(8)
    assert masked.shape == (8, 16) and not np.any(masked[:, 0] == eos)


def test_markdown_ratios_and_missing_values() -> None:
    rows = [
        {
            "size": "1.7b",
            "engine": "kernels",
            "ok": True,
            "frames": 10,
            "decode_fps": 300.0,
            "decode_rtf": 12.5 / 300,
            "e2e_rtf": 0.05,
            "ttfa_ms": 20.0,
            "peak_alloc_gib": 4.0,
            "peak_reserved_gib": 4.5,
        },
        {
            "size": "1.7b",
            "engine": "ref",
            "ok": True,
            "frames": 10,
            "decode_fps": 7.5,
            "decode_rtf": 12.5 / 7.5,
            "e2e_rtf": 1.5,
            "ttfa_ms": 5000.0,
            "peak_alloc_gib": None,
            "peak_reserved_gib": None,
        },
        {"size": "1.7b", "engine": "fq", "ok": False, "reason": "no wheel"},
    ]
    report.add_ratios(rows)
    assert rows[0]["x_ref"]["decode"] == pytest.approx(40.0)
    assert rows[0]["x_ref"]["e2e"] == pytest.approx(30.0)
    assert rows[0]["x_ref"]["ttfa"] == pytest.approx(250.0)
    assert rows[0]["x_fq"] == {"decode": None, "e2e": None, "ttfa": None}
    md = report.markdown({"meta": {"gpu": "G", "torch": "t", "commit": "c", "date": "d"}, "rows": rows})
    assert "| 1.7b | ours (kernels) | 10 | 300.0 | 40.0 | – |" in md
    assert "cannot run: no wheel" in md


def test_bench_cli_runs_torch_and_reports_peers_that_cannot_run(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    frames, sentence = 4, 3
    code = cli.main(
        [
            "--model",
            str(tiny_checkpoint),
            "--device",
            "cpu",
            "--backends",
            "torch,kernels,fq",
            "--frames",
            str(frames),
            "--sentence-frames",
            str(sentence),
            "--runs",
            "2",
            "--warmup",
            "1",
            "--context",
            "16",
            "--fq-path",
            str(tmp_path / "no-such-site"),
            "--worker-timeout",
            "240",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["engine"]: r for r in results["rows"]}
    assert list(rows) == ["torch", "kernels", "fq"]

    t = rows["torch"]
    assert t["ok"] and t["frames"] == frames and t["runs"] == 2
    assert len(t["raw"]["decode_s"]) == len(t["raw"]["e2e_s"]) == len(t["raw"]["ttfa_s"]) == 2
    assert t["decode_fps"] == pytest.approx(frames / np.median(t["raw"]["decode_s"]))
    assert t["e2e_rtf"] == pytest.approx(np.median(t["raw"]["e2e_s"]) / (frames / 12.5))
    assert 0 < t["ttfa_ms"] < 1e3 * max(t["raw"]["e2e_s"]) * 10
    assert t["peak_alloc_gib"] is None  # CPU: no GPU memory to report
    assert t["first_chunk_frames"] == EngineOptions().first_chunk_frames and t["prompt_positions"] > 9
    assert t["weights"] == results["meta"]["weights"] == "bf16"

    # A backend or a peer that cannot run becomes a row with the reason, not a crash.
    assert not rows["kernels"]["ok"] and "needs a GPU" in rows["kernels"]["reason"]
    assert not rows["fq"]["ok"] and "No module named 'faster_qwen3_tts'" in rows["fq"]["reason"]

    md = (out / "results.md").read_text()
    assert "| ours (torch) | 4 |" in md
    assert "faster-qwen3-tts 0.5.4 | – | cannot run: ModuleNotFoundError" in md
    assert "weight bytes/frame" in md  # the roofline table, even without a GPU
    png = (out / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "==== fq" in (out / "workers.log").read_text()


def test_bench_worker_quantizes_with_weights_int8(tiny_checkpoint: Path) -> None:
    """--weights int8 reaches our engine as the setting: the matrices quantized at load, recorded in the row."""
    from benchmarks.common import WorkerArgs
    from benchmarks.ours import run_ours

    w = WorkerArgs(
        engine="torch",
        model=str(tiny_checkpoint),
        device="cpu",
        frames=3,
        sentence_frames=2,
        runs=1,
        warmup=0,
        context=8,
        text="Hello there.",
        speaker="vivian",
        language="english",
        seed=1,
        weights="int8",
    )
    res = run_ours(w)
    assert res["weights"] == "int8" and res["decode_fps"] > 0


def test_merge_combines_runs_and_recomputes_ratios(tmp_path: Path) -> None:
    def run(date: str, bw: float, rows: list[dict]) -> Path:
        path = tmp_path / f"{date}.json"
        meta = {"gpu": "G", "torch": "t", "commit": "c", "date": date, "command": f"cmd {date}", "copy_bw_gbps": bw}
        path.write_text(json.dumps({"meta": meta, "rows": rows}))
        return path

    peers = run(
        "1",
        4000.0,
        [
            {"size": "1.7b", "engine": "kernels", "ok": False, "reason": "broken then"},
            {
                "size": "1.7b",
                "engine": "fq",
                "ok": True,
                "frames": 200,
                "decode_fps": 50.0,
                "e2e_rtf": 0.25,
                "ttfa_ms": 300.0,
            },
        ],
    )
    ours = run(
        "2",
        4100.0,
        [
            {
                "size": "1.7b",
                "engine": "kernels",
                "ok": True,
                "frames": 200,
                "decode_fps": 250.0,
                "e2e_rtf": 0.05,
                "ttfa_ms": 30.0,
                "prompt_positions": 30,
            },
        ],
    )
    out = tmp_path / "merged"
    assert cli.main(["--merge", str(peers), str(ours), "--out", str(out)]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert [(r["engine"], r["run"]) for r in merged["rows"]] == [("kernels", 2), ("fq", 1)]
    k = merged["rows"][0]
    assert k["x_fq"]["decode"] == pytest.approx(5.0) and k["x_fq"]["ttfa"] == pytest.approx(10.0)
    (roof,) = merged["roofline"]
    floor_fps = 4100e9 / (5_316_935_168 + 114_688 * 130)
    assert roof["floor_fps"] == pytest.approx(floor_fps) and roof["fraction"] == pytest.approx(250.0 / floor_fps)
    assert roof["r9700_projected_fps"] == pytest.approx(640e9 / roof["bytes"] * roof["fraction"])
    md = (out / "results.md").read_text()
    assert "`cmd 1`" in md and "`cmd 2`" in md and (out / "results.png").exists()


def test_the_server_never_imports_the_benchmark() -> None:
    """The bench (matplotlib, peer patches) is developer tooling: nothing the server loads pulls it in."""
    import subprocess
    import sys

    code = (
        "import sys, wyoming_qwen3tts.__main__, wyoming_qwen3tts.engine, wyoming_qwen3tts.backends.kernels.backend; "
        "print(sorted(m for m in sys.modules if m.startswith('benchmarks')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_commit_stamp_prefers_q3t_commit(monkeypatch):
    monkeypatch.setenv("Q3T_COMMIT", "235b731-device")
    assert cli._git_commit() == "235b731-device"
    monkeypatch.delenv("Q3T_COMMIT")
    assert cli._git_commit() not in ("", "235b731-device")
