"""Per-frame decode time under kernel backend options side by side, in one process: same model,
same prompt, graph replay, default sampling, 200 frames, each setting measured twice (in order, then
in reverse order, so clock drift shows as spread). Random full-size bf16 models.

Usage: python kernels/device/bench_options.py "-" "attn_splits=16" "lib=/tmp/other/libq3t.so" \
    [--sizes 0.6b,1.7b] [--greedy] [--frames N] [--weights bf16,int8]
A setting is NAME=VALUE[,NAME=VALUE...] of KernelOptions fields (pdl, attn_splits, graph_prefill) and
`lib`, a library built elsewhere (the same ABI version; e.g. this commit's sources with one kernel
changed); "-" is the defaults. --weights int8 also times the model with int8 matrices (model/quant.py, as
`weights = "int8"` loads them). Prints one JSON line per size and weights.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import native_library, random_model, text_ids, timed

from wyoming_qwen3tts.backends.kernels.backend import KernelBackend
from wyoming_qwen3tts.backends.kernels.options import KernelOptions
from wyoming_qwen3tts.model.prompt import build_prompt
from wyoming_qwen3tts.model.quant import quantize_model
from wyoming_qwen3tts.request import SamplingParams


def backend(model, setting: str) -> KernelBackend:
    """The kernel backend of one setting ("-": the defaults)."""
    fields: dict[str, object] = {}
    lib = None
    for pair in [] if setting == "-" else setting.split(","):
        name, _, value = pair.partition("=")
        if name == "lib":
            lib = native_library(value)
        else:
            kind = {f.name: f.type for f in dataclasses.fields(KernelOptions)}[name]
            fields[name] = value not in ("0", "false") if kind in (bool, "bool") else int(value)
    return KernelBackend(model, KernelOptions(**fields), lib=lib)


def per_frame_ms(kb: KernelBackend, prompt, sampling: SamplingParams, frames: int) -> float:
    session = kb.start(prompt, sampling, 0, frames + 8)
    session.next_frames(8)  # capture + warm-up
    got, seconds = timed(lambda: session.next_frames(frames))
    assert len(got) == frames, len(got)
    return 1000 * seconds / frames


def main(argv: list[str]) -> None:
    sizes = ["0.6b", "1.7b"]
    if "--sizes" in argv:
        i = argv.index("--sizes")
        sizes = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2 :]
    frames = 200
    if "--frames" in argv:  # decode this many frames per measurement (a longer Talker context)
        i = argv.index("--frames")
        frames = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    weights = ["bf16"]
    if "--weights" in argv:  # bf16, int8 or both (comma list)
        i = argv.index("--weights")
        weights = argv[i + 1].split(",")
        argv = argv[:i] + argv[i + 2 :]
    greedy = "--greedy" in argv  # also time greedy decoding (argmax draws): the sampler's share
    settings = [a for a in argv if a != "--greedy"] or ["-"]
    for size, kind in [(s, w) for s in sizes for w in weights]:
        model = random_model(size, torch.bfloat16)  # EOS row zeroed: every run decodes all its frames
        if kind == "int8":
            quantize_model(model)
        prompt = build_prompt(model, text_ids(20), "ryan", "english")
        res: dict[str, object] = {
            "size": size,
            "weights": kind,
            "gpu": torch.cuda.get_device_name(),
            "frames": frames,
            "ms_per_frame": {},
        }
        for order in (settings, settings[::-1]):
            for setting in order:
                kb = backend(model, setting)
                res["ms_per_frame"].setdefault(setting, []).append(
                    round(per_frame_ms(kb, prompt, SamplingParams(), frames), 4)
                )
                if greedy:
                    ms = per_frame_ms(kb, prompt, SamplingParams.greedy(), frames)
                    res.setdefault("greedy_ms_per_frame", {}).setdefault(setting, []).append(round(ms, 4))
                del kb
                torch.cuda.empty_cache()
        print(json.dumps(res), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
