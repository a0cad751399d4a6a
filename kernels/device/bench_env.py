"""Per-frame decode time under kernel-library settings read at q3t_init (Q3T_GEMV, Q3T_GEMV_FILL,
...), side by side in one process: same model, same prompt, graph replay, PDL on,
default sampling, 200 frames, each setting measured twice (in order, then in reverse order, so
clock drift shows as spread). Random full-size bf16 models.

Usage: python kernels/device/bench_env.py "Q3T_GEMV=v1" "Q3T_GEMV=v2" [--sizes 0.6b,1.7b] [--greedy] [--frames N]
(a setting is NAME=VALUE[,NAME=VALUE...]; "-" is the defaults; Q3T_CFLAGS=... selects a library
built with those compiler flags, e.g. "Q3T_CFLAGS=-DQ3T_TRIGGER_FIRST=0"; Q3T_LIB=path one built elsewhere,
e.g. from the commit before). Prints one JSON line per size.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cp import per_frame_ms  # noqa: E402
from common import random_model, text_ids  # noqa: E402

from wyoming_qwen3tts import native  # noqa: E402
from wyoming_qwen3tts.backends.kernel_backend import KernelBackend  # noqa: E402
from wyoming_qwen3tts.model.prompt import build_prompt  # noqa: E402
from wyoming_qwen3tts.request import SamplingParams  # noqa: E402


_libs: dict[str, native.Native] = {}


def apply(setting: str, names: set[str]) -> native.Native:
    """Unset every variable any setting names, set this one's, re-run q3t_init (which reads them).
    Q3T_CFLAGS (compiler flags) selects another build of the library: built here if needed and
    made the one native.load() returns, so the backend created next runs on it."""
    for name in names:
        os.environ.pop(name, None)
    if setting != "-":
        for pair in setting.split(","):
            name, _, value = pair.partition("=")
            os.environ[name] = value
    # Q3T_LIB=path loads a library built elsewhere (e.g. from another commit's sources) as is.
    key = os.environ.get("Q3T_LIB") or os.environ.get("Q3T_CFLAGS", "")
    if key not in _libs:
        _libs[key] = native.Native(Path(os.environ["Q3T_LIB"]) if os.environ.get("Q3T_LIB") else native.build())
    lib = native._loaded = _libs[key]
    lib.init(0)
    return lib


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
    greedy = "--greedy" in argv  # also time greedy decoding (argmax draws): the sampler's share
    argv = [a for a in argv if a != "--greedy"]
    settings = argv or ["-"]
    names = {p.partition("=")[0] for s in settings if s != "-" for p in s.split(",")}
    native.load(0)
    for size in sizes:
        model = random_model(size, torch.bfloat16)  # EOS row zeroed: every run decodes all its frames
        prompt = build_prompt(model, text_ids(20), "ryan", "english")
        res: dict[str, object] = {"size": size, "gpu": torch.cuda.get_device_name(), "frames": frames, "ms_per_frame": {}}
        for order in (settings, settings[::-1]):
            for setting in order:
                apply(setting, names)
                kb = KernelBackend(model, pdl=True)
                res["ms_per_frame"].setdefault(setting, []).append(round(per_frame_ms(kb, prompt, SamplingParams(), frames), 4))
                if greedy:
                    ms = per_frame_ms(kb, prompt, SamplingParams.greedy(), frames)
                    res.setdefault("greedy_ms_per_frame", {}).setdefault(setting, []).append(round(ms, 4))
                del kb
                torch.cuda.empty_cache()
        apply("-", names)
        print(json.dumps(res), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
