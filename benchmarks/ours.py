"""The worker for our backends: the engine's public calls, timed (decode, end to end, first audio)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from .common import SAMPLES_PER_FRAME, WorkerArgs, summary, sync


def run_ours(w: WorkerArgs) -> dict[str, Any]:
    from wyoming_qwen3tts.engine import Engine, EngineOptions
    from wyoming_qwen3tts.request import SynthesisRequest

    t0 = time.perf_counter()
    options = EngineOptions(
        device=w.device,
        backend=w.engine,
        max_frames=max(w.context, w.frames),  # type: ignore[arg-type]
        local_files_only=True,
        weights=w.weights,
        max_streams=1,
    )  # type: ignore[arg-type]
    engine = Engine.from_pretrained(w.model, options)
    if engine.backend.name != w.engine:
        raise RuntimeError(f"engine chose backend {engine.backend.name!r}: {engine.info.backend_reason}")
    load_s = time.perf_counter() - t0
    # The checkpoint's sampling, with a fixed length: code-0 EOS is never sampled (random weights end at random).
    sampling = replace(engine.default_sampling, suppress_eos=True)
    voice: dict[str, Any] = {}
    if engine.model_type == "base":  # a cloned voice, in context: its clip's codes and transcript lengthen the prompt
        voice = dict(clone=_clone(engine, w.ref_seconds))
    elif engine.model_type == "voice_design":
        voice = dict(instruct="A calm, warm female voice with a slight smile, speaking at an even pace.")

    def request(frames: int, seed: int) -> SynthesisRequest:
        return SynthesisRequest(
            text=w.text,
            speaker=w.speaker,
            language=w.language,
            seed=seed,
            max_frames=frames,
            sampling=sampling,
            **voice,
        )

    prompt = engine.prepare(request(w.frames, w.seed))

    def decode_once(seed: int) -> tuple[float, float]:
        sync()
        a = time.perf_counter()
        session = engine.backend.start(prompt, sampling, seed, w.context)
        sync()
        b = time.perf_counter()
        codes = session.next_frames(w.frames)  # returns host codes: synchronised
        c = time.perf_counter()
        if len(codes) != w.frames:
            raise RuntimeError(f"decoded {len(codes)} frames, asked for {w.frames}: EOS was not suppressed")
        return b - a, c - b

    def synth_once(frames: int, seed: int) -> tuple[float, float, int]:
        """Seconds to the first chunk and to the last, and the frames synthesized."""
        a = time.perf_counter()
        first = None
        n = 0
        for chunk in engine.synthesize(request(frames, seed)):
            if first is None:
                first = time.perf_counter() - a
            n += chunk.num_frames
            if len(chunk.pcm) != chunk.num_frames * SAMPLES_PER_FRAME * 2:
                raise RuntimeError("chunk PCM length does not match its frames")
        total = time.perf_counter() - a
        if n != frames:
            raise RuntimeError(f"synthesized {n} frames, asked for {frames}: EOS was not suppressed")
        return first or total, total, n

    for i in range(w.warmup):
        decode_once(w.seed + 1000 + i)
        synth_once(w.frames, w.seed + 2000 + i)
        synth_once(w.sentence_frames, w.seed + 3000 + i)
    prefill_s, decode_s, e2e_s, ttfa_s = [], [], [], []
    for i in range(w.runs):
        p, d = decode_once(w.seed + i)
        prefill_s.append(p)
        decode_s.append(d)
    for i in range(w.runs):
        e2e_s.append(synth_once(w.frames, w.seed + 100 + i)[1])
    for i in range(w.runs):
        # The whole sentence, its first chunk timed (as the qwentts.cpp worker does): a stream closed after its
        # first chunk leaves the frames it launched ahead on the GPU for the next run's prefill to queue behind
        # (such runs measured 25 to 51 ms on one H100).
        ttfa_s.append(synth_once(w.sentence_frames, w.seed + 200 + i)[0])
    out = summary(decode_s, e2e_s, ttfa_s, w.frames)
    out["raw"]["prefill_s"] = prefill_s
    out.update(
        load_s=load_s,
        prompt_positions=prompt.length,
        first_chunk_frames=engine.first_chunk_frames,
        dtype=engine.info.dtype,
        weights=engine.info.weights,
        model_type=engine.model_type,
        notes=f"decode sessions sized for {w.context} frames; TTFA chunk {engine.first_chunk_frames} frames"
        + (f"; cloned voice from a {w.ref_seconds:g} s clip, in context" if engine.model_type == "base" else ""),
    )
    return out


def _clone(engine: Any, seconds: float) -> Any:
    """A clone prompt from a synthetic voice-like clip of `seconds` (harmonics with vibrato, noise)."""
    import tempfile
    from pathlib import Path

    import numpy as np
    import soundfile

    rate = 24000
    t = np.arange(int(rate * seconds)) / rate
    phase = 2 * np.pi * np.cumsum(140 + 20 * np.sin(2 * np.pi * 3 * t)) / rate
    clip = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.2 + np.random.default_rng(0).normal(0, 0.01, t.size)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reference.wav"
        soundfile.write(str(path), clip.astype(np.float32), rate)
        transcript = "This is the reference clip of the voice we clone, read at an ordinary pace for ten seconds or so."
        return engine.clone_voice(path, transcript)
