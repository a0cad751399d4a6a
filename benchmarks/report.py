"""Results tables: ratios to the peers, the markdown table, the PNG chart, merging runs."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import ENGINES, LABELS, PEERS
from .roofline import roofline

# The one-stream targets (decode frames/s per size, first audio in ms), drawn as dashed lines on the chart.
TARGET_DECODE_FPS = {"1.7b": 300.0, "0.6b": 400.0}
TARGET_TTFA_MS = 40.0


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
    lines += streams_table(results["rows"])
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


def streams_table(rows: list[dict[str, Any]]) -> list[str]:
    """Lines of the table of the rows that also timed several concurrent streams (qwentts.cpp's batching API)."""
    batched = [(r, s) for r in rows if r.get("ok") for s in r.get("streams") or []]
    if not batched:
        return []
    lines = [
        "",
        "Concurrent streams (each decodes the row's frames; aggregate decode = streams x frames / the longest "
        "stream's decode time):",
        "",
        "| size | engine | streams | aggregate decode frames/s | per stream frames/s | aggregate e2e frames/s |",
        "|---|---|---|---|---|---|",
    ]
    for r, s in batched:
        lines.append(
            f"| {r['size']} | {LABELS.get(r['engine'], r['engine'])} | {s['streams']} | "
            f"{_f(s.get('aggregate_fps'), '.1f')} | {_f(s.get('per_stream_fps'), '.1f')} | "
            f"{_f(s.get('e2e_aggregate_fps'), '.1f')} |"
        )
    return lines


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
        (
            ("decode_fps", "decode frames/s (higher is better)", axes[0]),
            ("ttfa_ms", "time to first audio, ms (lower is better)", axes[1]),
        )
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
                    axis.text(
                        x,
                        0.02,
                        "n/a",
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        rotation=90,
                        transform=axis.get_xaxis_transform(),
                        color=b.get_facecolor(),
                    )
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
    from wyoming_qwen3tts.tools.random_checkpoint import model_config_dict

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
