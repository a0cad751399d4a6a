"""Multi-stream decode benchmark: 1, 2, 4, 8, 16 streams stepping together on the batched kernels.

    python -m benchmarks.streams --model DIR [--streams 1,2,4,8,16] [--frames 200] [--runs 2]
        [--context 2048] [--weights bf16|int8] [--out results.json]

For each stream count N: N streams (one prompt, each its own seed, the checkpoint's sampling with end of
speech masked so every stream decodes --frames frames) are admitted into a BatchedDecoder and stepped
--frames times (one stream alone runs the lone step, the batch-1 frame's kernels on its slot, as in the
server; the batched step at one stream is timed beside it); aggregate frames/s = N * frames / wall time, per-stream frames/s = frames / wall time
(every stream advances one frame per step). Admission (the prompts' prefill) is timed apart: all N
streams in one admit_all (arriving together), and one admit after another (arriving at different steps).
In the same process and the same run, the batch-1 KernelBackend decodes the same prompt: the one-stream
path the server uses for a lone request. Peak GPU memory is read after the decoder for 16 slots of
--context positions is built. Medians of --runs timed runs after one warm-up. --weights int8 quantizes the
matrices at load, as the `weights = "int8"` setting does (model/quant.py), before the backends are built.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .common import gpu_name, memory, sync


def run(
    model_dir: str,
    streams: list[int],
    frames: int,
    runs: int,
    context: int,
    text: str,
    weights: str = "bf16",
    batch_invariant: bool = False,
) -> dict[str, Any]:
    import torch

    from wyoming_qwen3tts.backends.kernels.batched import Admission, BatchedDecoder
    from wyoming_qwen3tts.engine import Engine, EngineOptions
    from wyoming_qwen3tts.request import SynthesisRequest

    options = EngineOptions(
        backend="kernels",
        max_frames=context,
        local_files_only=True,
        weights=weights,  # type: ignore[arg-type]
        max_streams=1,
    )  # the one-stream backend; the decoder is built below
    engine = Engine.from_pretrained(model_dir, options)
    kb = engine.backend
    sampling = replace(engine.default_sampling, suppress_eos=True)
    speaker = engine.speakers[0] if engine.speakers else ""
    prompt = engine.prepare(SynthesisRequest(text=text, speaker=speaker, language="english", seed=0, max_frames=frames))
    weights_gib = torch.cuda.memory_allocated() / 1024**3
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    # As the server builds it (scheduler.BatchingBackend): the one-stream backend's PDL and attention splits.
    dec = BatchedDecoder(
        kb.model,
        kb.ops,
        kb.weights,
        slots=max(streams),
        max_seq=prompt.length + context + 1,
        max_trailing=max(prompt.trailing.shape[0], 1),
        pdl=kb.pdl,
        invariant=batch_invariant,
        lone_splits=kb.options.attn_splits,
        blas_rows=kb.options.blas_rows,
        attn_splits=kb.options.batched_attn_splits or None,
    )
    build_s = time.perf_counter() - t0
    mem = memory()

    def one_stream() -> float:
        session = kb.start(prompt, sampling, 1, frames)
        sync()
        a = time.perf_counter()
        codes = session.next_frames(frames)
        b = time.perf_counter()
        assert len(codes) == frames
        return b - a

    def admit(n: int, seed: int, together: bool) -> float:
        """Seconds to admit n streams (then released): in one admit_all, or one admit after another."""
        streams = [Admission(s, prompt, sampling, seed + s) for s in range(n)]
        sync()
        a = time.perf_counter()
        if together:
            dec.admit_all(streams)
        else:
            for x in streams:
                dec.admit(x.slot, x.prompt, x.sampling, x.seed)
        sync()
        b = time.perf_counter()
        for s in range(n):
            dec.release(s)
        return b - a

    def batched(n: int, seed: int) -> float:
        dec.admit_all([Admission(s, prompt, sampling, seed + s) for s in range(n)])
        sync()
        a = time.perf_counter()
        for _ in range(frames):
            dec.step()
        sync()
        b = time.perf_counter()
        for s in range(n):
            dec.release(s)
        return b - a

    one_stream()
    alone = statistics.median(one_stream() for _ in range(runs))
    batched_one = None
    if dec.lone is not None and 1 in streams:  # the batched step at one stream too, the lone step set aside
        lone, dec.lone = dec.lone, None
        batched(1, 1000)
        batched_one = frames / statistics.median(batched(1, 100 * r) for r in range(runs))
        dec.lone = lone
    rows = []
    for n in streams:
        batched(n, 1000)
        step_s = statistics.median(batched(n, 100 * r) for r in range(runs))
        admit(n, 1000, True)
        together_s = statistics.median(admit(n, 100 * r, True) for r in range(runs))
        one_by_one_s = statistics.median(admit(n, 100 * r, False) for r in range(runs))
        rows.append(
            dict(
                streams=n,
                aggregate_fps=n * frames / step_s,
                per_stream_fps=frames / step_s,
                step_ms=step_s / frames * 1e3,
                admit_ms_per_stream=one_by_one_s / n * 1e3,
                admit_together_ms=together_s * 1e3,
            )
        )
        print(
            f"{n:>3} streams: {n * frames / step_s:8.1f} frames/s aggregate, {frames / step_s:6.1f} per stream, "
            f"{step_s / frames * 1e3:.3f} ms/step, admit {one_by_one_s / n * 1e3:.1f} ms/stream one by one, "
            f"{together_s * 1e3:.1f} ms all {n} together",
            flush=True,
        )
    print(f"batch-1 backend: {frames / alone:.1f} frames/s", flush=True)
    if batched_one is not None:
        print(f"one stream on the batched step (lone steps off): {batched_one:.1f} frames/s", flush=True)
    return dict(
        model=model_dir,
        gpu=gpu_name(),
        torch=torch.__version__,
        weights=engine.info.weights,
        frames=frames,
        runs=runs,
        prompt_positions=prompt.length,
        context=context,
        slots=max(streams),
        decoder_build_s=build_s,
        weights_gib=weights_gib,
        peak_with_decoder_gib=mem["peak_alloc_gib"],
        batch1_fps=frames / alone,
        pdl=dec.pdl,
        blas_rows=dec.blas_rows,
        lone_steps=dec.lone is not None,
        one_stream_batched_step_fps=batched_one,
        rows=rows,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.streams", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--streams", default="1,2,4,8,16", help="stream counts (default 1,2,4,8,16)")
    p.add_argument("--frames", type=int, default=200, help="frames per stream (default 200)")
    p.add_argument("--runs", type=int, default=2, help="timed runs per row (default 2)")
    p.add_argument("--context", type=int, default=2048, help="frames of context each slot holds (default 2048)")
    p.add_argument("--text", default="The quick brown fox jumps over the lazy dog while the kettle starts to sing.")
    p.add_argument(
        "--weights",
        choices=("bf16", "int8"),
        default="bf16",
        help="the matrices: bf16 as loaded, or int8 quantized at load (default bf16)",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="no lone steps: one stream runs the batched step too (the batch_invariant setting)",
    )
    p.add_argument("--out", type=Path, help="write the results here as JSON")
    args = p.parse_args(argv)
    streams = [int(s) for s in args.streams.split(",") if s.strip()]
    result = run(
        args.model, streams, args.frames, args.runs, args.context, args.text, args.weights, args.batch_invariant
    )
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
