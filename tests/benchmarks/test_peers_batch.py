"""benchmarks.peers_batch on the CPU: stream counts, the row arithmetic, the ratios and table, and a peer that fails or
hangs becoming an error in its entry instead of ending the run. The workers themselves need the peers' packages: with
Q3T_PEERS_SITE pointing at a folder that holds them, they drive both peers on a tiny CPU model
(tests/support/peers_batch_cpu_harness.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import peers_batch

REPO = Path(__file__).resolve().parents[2]


def test_stream_counts_are_parsed_and_both_ends_run_first() -> None:
    assert peers_batch.parse_streams("16, 1,4,4") == [1, 4, 16]
    for bad in ("", "0,2", "two"):
        with pytest.raises(SystemExit):
            peers_batch.parse_streams(bad)
    assert peers_batch.run_order([1, 2, 4, 8, 16]) == [1, 16, 2, 4, 8]
    assert peers_batch.run_order([4]) == [4]


def test_a_row_splits_the_prefill_from_the_decode_loop() -> None:
    row = peers_batch.streams_row(4, 200, e2e_s=[2.0, 2.2], gen_s=[1.5, 1.7], prefill_s=[0.1, 0.1], first_s=10.0)
    assert row["ok"] and row["streams"] == 4
    assert row["aggregate_fps"] == pytest.approx(4 * 200 / 1.5)  # decode = median(gen - prefill) = 1.5 s
    assert row["per_stream_fps"] == pytest.approx(200 / 1.5)
    assert row["step_ms"] == pytest.approx(7.5)
    assert row["admit_ms_per_stream"] == pytest.approx(25.0)
    assert row["e2e_ms"] == row["ttfa_ms"] == pytest.approx(2100.0)  # no streaming: first audio is the whole call
    assert row["e2e_aggregate_fps"] == pytest.approx(800 / 2.1)
    assert row["capture_s"] == pytest.approx(7.9)
    assert row["raw"]["gen_s"] == [1.5, 1.7]


def _result() -> dict:
    ok = peers_batch.streams_row
    return {
        "meta": {"date": "d", "commit": "c", "frames": 200, "runs": 1},
        "peers": {
            "triton": {
                "label": "qwen3-tts-triton 0.3.0 (hybrid)",
                "ok": False,
                "gpu": "H200",
                "versions": {"transformers": "4.57.3"},
                "rows": [
                    dict(ok(1, 200, [4.0], [3.9], [0.02], 9.0), peak_alloc_gib=4.5, peak_reserved_gib=5.0),
                    dict(ok(16, 200, [8.0], [6.1], [0.1], 20.0)),
                    {"streams": 8, "ok": False, "error": "OutOfMemoryError: no room"},
                ],
                "error": "timed out after 160 s; not run: 2, 4 streams",
            },
            "fqb": {
                "label": "faster-qwen3-tts-batch 0.2.0 (Base clone)",
                "ok": False,
                "rows": [],
                "error": "RuntimeError: broken (exit 1)",
            },
        },
    }


def test_ratios_read_times_better_than_the_peer_and_the_table_shows_failures() -> None:
    result = _result()
    ours = {
        "rows": [
            {"streams": 1, "aggregate_fps": 172.2, "ttfa_ms": 40.0},
            {"streams": 16, "aggregate_fps": 1304.1, "per_stream_fps": 81.5, "step_ms": 12.27},
        ]
    }
    peers_batch.add_ratios(result, ours)
    one, sixteen, failed = result["peers"]["triton"]["rows"]
    assert one["x_aggregate"] == pytest.approx(172.2 / one["aggregate_fps"])
    assert one["x_ttfa"] == pytest.approx(4000.0 / 40.0)
    assert sixteen["x_aggregate"] == pytest.approx(1304.1 / (16 * 200 / 6.0))
    assert sixteen["x_ttfa"] is None  # our row has no TTFA
    assert failed["x_aggregate"] is None and failed["x_ttfa"] is None
    md = peers_batch.markdown(result, ours)
    assert "| ours (batched kernels) | 16 | 1,304.1 | 81.5 | 12.27 |" in md
    assert f"| qwen3-tts-triton 0.3.0 (hybrid) | 1 | {one['aggregate_fps']:,.1f} |" in md
    assert "| 4.50 / 5.00 |" in md and "| – / – |" in md  # peak memory, measured and not
    assert "| 8 | failed: OutOfMemoryError: no room |" in md
    assert "- qwen3-tts-triton 0.3.0 (hybrid): timed out after 160 s; not run: 2, 4 streams" in md
    assert "- faster-qwen3-tts-batch 0.2.0 (Base clone): RuntimeError: broken (exit 1)" in md
    assert "- triton: H200; transformers 4.57.3" in md
    # Without our rows there is nothing to divide by.
    peers_batch.add_ratios(result, None)
    assert result["peers"]["triton"]["rows"][0]["x_aggregate"] is None


def _stand_in(site: Path, package: str, body: str) -> None:
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(body)


def test_a_peer_that_fails_or_hangs_is_recorded_and_the_run_goes_on(tmp_path: Path, capsys) -> None:
    # Stand-ins placed first on the workers' paths hide any real copy: the triton worker hangs on its first import,
    # the fqb worker fails on it.
    hangs, fails = tmp_path / "hangs", tmp_path / "fails"
    _stand_in(hangs, "faster_qwen3_tts", "import time\ntime.sleep(60)\n")
    _stand_in(fails, "faster_qwen3_tts_batch", "raise RuntimeError('stand-in peer, broken on purpose')\n")
    out = tmp_path / "o" / "peers.json"
    code = peers_batch.main(
        [
            "--triton-path",
            str(hangs),
            "--fqb-path",
            f"{fails}{os.pathsep}{tmp_path / 'nothing'}",
            "--streams",
            "1,2",
            "--frames",
            "2",
            "--runs",
            "1",
            "--device",
            "cpu",
            "--timeout",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    tri, fqb = result["peers"]["triton"], result["peers"]["fqb"]
    assert not tri["ok"] and tri["error"] == "timed out after 8 s; not run: 1, 2 streams"
    assert not fqb["ok"] and fqb["error"].startswith("RuntimeError: stand-in peer, broken on purpose (exit 1)")
    assert fqb["error"].endswith("not run: 1, 2 streams") and fqb["rows"] == []
    assert result["meta"]["streams"] == [1, 2] and result["meta"]["frames"] == 2
    assert "broken on purpose" in out.with_suffix(".md").read_text()
    log = out.with_suffix(".log").read_text()
    assert "==== triton" in log and "==== fqb" in log
    capsys.readouterr()

    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"rows": [{"streams": 1, "aggregate_fps": 172.2}]}))
    assert peers_batch.main(["--from", str(out), "--ours", str(ours)]) == 0
    table = capsys.readouterr().out
    assert "| ours (batched kernels) | 1 | 172.2 |" in table and "timed out after 8 s" in table


def test_a_peer_without_a_path_is_an_error_not_a_crash(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    assert peers_batch.main(["--peers", "fqb", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["peers"]["fqb"]["error"] == "no --fqb-path given"
    with pytest.raises(SystemExit):
        peers_batch.main(["--peers", "vllm", "--out", str(out)])


@pytest.mark.slow
def test_the_workers_drive_both_peers_on_a_tiny_cpu_model(tmp_path: Path) -> None:
    """Needs Q3T_PEERS_SITE, a folder with the three peer packages (.ci/run makes one; CI fails without it)."""
    if not os.environ.get("Q3T_PEERS_SITE"):
        if os.environ.get("CI") == "true":
            pytest.fail("Q3T_PEERS_SITE is not set: .ci/run installs the peer packages there")
        pytest.skip("Q3T_PEERS_SITE: a folder with the three peer packages (see .ci/run)")
    out = tmp_path / "smoke.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["Q3T_PEERS_SITE"], str(REPO)]))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "peers_batch_cpu_harness.py"), str(out)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["patched"] == ["Qwen3TTSForConditionalGeneration"]  # the hybrid runner's own kernel patching ran
    for peer, model_type in (("triton", "custom_voice"), ("fqb", "base")):
        r = result[peer]
        assert r["complete"] and r["model_type"] == model_type and r["attn"] == "sdpa"
        assert r["versions"]["qwen-tts"] == "0.1.1" and r["versions"]["faster-qwen3-tts"] == "0.2.4"
        assert [row["streams"] for row in r["rows"]] == [1, 2]
        for row in r["rows"]:  # every stream decoded its 3 frames (end of speech masked), checked in the worker
            assert row["ok"] and row["aggregate_fps"] > 0 and row["e2e_ms"] > 0 and row["capture_s"] is not None
