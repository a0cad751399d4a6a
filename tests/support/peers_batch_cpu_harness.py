"""Run benchmarks.peers_batch's two workers on the CPU with a tiny model, to catch mistakes in how they call the peers.

    PYTHONPATH=SITE:REPO python tests/support/peers_batch_cpu_harness.py OUT.json [triton|fqb ...]

SITE holds qwen-tts 0.1.1, faster-qwen3-tts 0.2.4, qwen3-tts-triton 0.3.0 and faster-qwen3-tts-batch 0.2.0 (and
transformers 4.57.3 unless the interpreter has it). The peers only run on CUDA, so this stands in for the CUDA calls
they make (running-peers-on-the-gpu.md §5): synchronize and the memory counters do nothing, a "captured graph" runs
its body eagerly on replay, and a missing `triton` is a stub (the hybrid runner's kernel patching is recorded, not
run: Triton kernels need a GPU). It checks the worker's plumbing, not speed.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from unittest import mock

import torch


def _stub_triton() -> None:
    # First: transformers and torch's compiler look triton up once at import, and must not find the stub.
    import qwen_tts  # noqa: F401
    import transformers.masking_utils  # noqa: F401

    if importlib.util.find_spec("triton") is None:
        fake = mock.MagicMock()
        fake.__spec__ = importlib.machinery.ModuleSpec("triton", None)
        for name in (
            "triton",
            "triton.language",
            "triton.language.extra",
            "triton.language.extra.cuda",
            "triton.language.extra.cuda.libdevice",
            "triton.language.extra.libdevice",
        ):
            sys.modules[name] = fake


class _Stream:
    def wait_stream(self, _other: object) -> None:
        pass


class _Graph:
    """Replays its owner's step eagerly: capture() below sets `body`."""

    body = None

    def replay(self) -> None:
        assert self.body is not None, "replay before capture"
        self.body()


def _stub_cuda() -> None:
    c = torch.cuda
    c.synchronize = lambda *a, **k: None
    c.current_device = lambda: 0
    c.reset_peak_memory_stats = lambda *a, **k: None
    c.max_memory_allocated = lambda *a, **k: 0
    c.empty_cache = lambda: None
    c.device = lambda *_a, **_k: contextlib.nullcontext()
    c.Stream = _Stream
    c.stream = lambda *_a, **_k: contextlib.nullcontext()
    c.current_stream = lambda *a, **k: _Stream()
    c.CUDAGraph = _Graph
    c.graph = lambda *_a, **_k: contextlib.nullcontext()  # the capture-time call runs eagerly once


def _eager(cls: type, body: str) -> None:
    capture = cls.capture

    def wrapped(self: object, *a: object, **k: object) -> None:
        capture(self, *a, **k)
        self.graph.body = getattr(self, body)  # type: ignore[attr-defined]

    cls.capture = wrapped  # type: ignore[method-assign]


def main() -> int:
    out, peers = Path(sys.argv[1]), sys.argv[2:] or ["triton", "fqb"]
    _stub_triton()
    _stub_cuda()
    from faster_qwen3_tts.predictor_graph import PredictorGraph
    from faster_qwen3_tts.talker_graph import TalkerGraph
    from faster_qwen3_tts_batch.batched_predictor_graph import BatchedPredictorGraph
    from faster_qwen3_tts_batch.batched_talker_graph import BatchedTalkerGraph

    # qwen3-tts-triton's batched graphs subclass faster-qwen3-tts's and keep their capture().
    for cls, body in (
        (PredictorGraph, "_full_loop"),
        (TalkerGraph, "_decode_step"),
        (BatchedPredictorGraph, "_full_loop"),
        (BatchedTalkerGraph, "_decode_step"),
    ):
        _eager(cls, body)
    patched: list[str] = []
    import qwen3_tts_triton.models.triton_faster_runner as hybrid

    hybrid.apply_triton_kernels = lambda model, **k: patched.append(type(model).__name__)

    from benchmarks import peers_batch_workers as workers

    results = {}
    for peer in peers:
        spec = dict(
            peer=peer,
            model_type="custom_voice" if peer == "triton" else "base",
            size="tiny",
            device="cpu",
            streams=[1, 2],
            frames=3,
            runs=1,
            warmup=1,
            text="Hello there.",
            text_tokens=4,
            ref_seconds=1.0,
            max_seq_len=80,
            seed=7,
            speaker="vivian",
            language="english",
            mode="hybrid",
        )
        run = workers.run_triton if peer == "triton" else workers.run_fqb
        results[peer] = run(spec, lambda partial: None)
    results["patched"] = patched
    out.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
