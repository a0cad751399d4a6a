"""Sum a py-spy raw profile taken with --gil --threads (only the thread holding the interpreter's lock is sampled) by
thread and by function: how much of a load's time the lock was held, by whom, and for what; per request when the load
tool's JSON says how many were served.

    python kernels/device/gil_report.py gil.txt --seconds 30 --rate 2000 [--load load.json] [--top 12]

Each raw line is "thread (TID): NAME;frame;frame;... COUNT", frames as "function (file:line)".  Thread names lose
their pool number (qwen3tts-synth_12 -> qwen3tts-synth), so a pool's threads count together.
"""

from __future__ import annotations

import argparse
import collections
import json
import re

FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")


def parse(path: str) -> list[tuple[str, list[str], int]]:
    """(thread group, frames root first, samples) per line."""
    rows = []
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        head, *frames = stack.split(";")
        name = head.partition("): ")[2] or head  # "thread (TID): NAME"
        group = re.sub(r"[_-]\d+$", "", name)
        rows.append((group, frames, int(count)))
    return rows


def short(frame: str) -> str:
    """function (file.py:line) without the directories."""
    m = FRAME.match(frame)
    if not m:
        return frame
    fn, path, line = m.groups()
    parts = path.split("/")
    keep = "/".join(parts[-2:]) if "wyoming_qwen3tts" in path else parts[-1]
    return f"{fn} ({keep}:{line})"


def ours(frame: str) -> bool:
    return "wyoming_qwen3tts" in frame or "benchmarks" in frame


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--seconds", type=float, required=True, help="how long the sampled load ran")
    ap.add_argument("--rate", type=float, required=True, help="py-spy's samples per second")
    ap.add_argument("--load", help="the load tool's JSON (requests served)")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    rows = parse(args.profile)
    total = sum(c for _, _, c in rows)
    ms = 1000.0 / args.rate
    served = 0
    if args.load:
        try:
            served = int(json.load(open(args.load))["served"])
        except (OSError, ValueError, KeyError):
            served = 0
    per = f", {total * ms / served:.2f} ms a request ({served} served)" if served else ""
    print(
        f"lock held {total * ms / 1000:.2f} s of {args.seconds:.1f} s "
        f"({100 * total / (args.seconds * args.rate):.0f} % of the load's time){per}"
    )
    by_thread: collections.Counter[str] = collections.Counter()
    for group, _, c in rows:
        by_thread[group] += c
    for group, c in by_thread.most_common():
        req = f", {c * ms / served:.3f} ms a request" if served else ""
        print(f"  {group}: {c * ms:.0f} ms ({100 * c / total:.0f} %){req}")
    for group, gc in by_thread.most_common(6):
        leaf: collections.Counter[str] = collections.Counter()  # the innermost frame of ours, and what it called
        inclusive: collections.Counter[str] = collections.Counter()
        for g, frames, c in rows:
            if g != group:
                continue
            mine = [i for i, f in enumerate(frames) if ours(f)]
            if mine:
                i = mine[-1]
                below = short(frames[-1]) if i < len(frames) - 1 else "(itself)"
                leaf[f"{short(frames[i])} -> {below}"] += c
            else:
                leaf[" <- ".join(short(f) for f in frames[-2:][::-1]) or "(no frames)"] += c
            for f in {short(f) for f in frames if ours(f)}:
                inclusive[f] += c
        print(f"\n{group}: {gc * ms:.0f} ms; innermost frame of ours -> the frame running (ms, % of the thread's)")
        for key, c in leaf.most_common(args.top):
            print(f"  {c * ms:8.1f}  {100 * c / gc:4.1f} %  {key}")
        print(f"{group}: inclusive, functions of ours")
        for key, c in inclusive.most_common(args.top):
            print(f"  {c * ms:8.1f}  {100 * c / gc:4.1f} %  {key}")


if __name__ == "__main__":
    main()
