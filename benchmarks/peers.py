"""Workers for the peers, each in its own environment (--ref-path, --fq-path): the reference qwen-tts 0.1.1
and faster-qwen3-tts 0.5.4, timed by wrapping their generate and decode calls. End of speech is masked
by a hook on their codec_head so every run decodes a fixed number of frames, as ours do."""

from __future__ import annotations

import time
from typing import Any

from wyoming_qwen3tts.request import SAMPLE_RATE

from .common import SAMPLES_PER_FRAME, WorkerArgs, median, summary, sync


def _mask_eos(model: Any, eos_id: int) -> None:
    def hook(_module: Any, _inputs: Any, out: Any) -> Any:
        out[..., eos_id] = float("-inf")
        return out

    model.talker.codec_head.register_forward_hook(hook)


def _timed(obj: Any, name: str, sink: list[float]) -> None:
    """Replace obj.name (looked up at call time) by a wrapper that appends its synchronised duration to sink."""
    fn = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sync()
        a = time.perf_counter()
        result = fn(*args, **kwargs)
        sync()
        sink.append(time.perf_counter() - a)
        return result

    setattr(obj, name, wrapper)


def _peer_dtype(device: str) -> Any:
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _speaker_name(speaker: str) -> str:
    return speaker[:1].upper() + speaker[1:].lower()


def _language_name(language: str) -> str:
    return "Auto" if language.lower() == "auto" else language[:1].upper() + language[1:].lower()


def run_ref(w: WorkerArgs) -> dict[str, Any]:
    import torch
    from qwen_tts import Qwen3TTSModel  # the reference, from --ref-path

    t0 = time.perf_counter()
    tts = Qwen3TTSModel.from_pretrained(
        w.model, device_map=w.device, dtype=_peer_dtype(w.device), attn_implementation="sdpa"
    )
    load_s = time.perf_counter() - t0
    model = tts.model
    _mask_eos(model, model.config.talker_config.codec_eos_token_id)
    gen_s: list[float] = []
    codec_s: list[float] = []
    _timed(model, "generate", gen_s)
    _timed(model.speech_tokenizer, "decode", codec_s)
    speaker, language = _speaker_name(w.speaker), _language_name(w.language)

    def call(frames: int, seed: int) -> float:
        torch.manual_seed(seed)
        a = time.perf_counter()
        # max_new_tokens = M returns M - 1 frames: the last sampled code 0 is never completed.
        wavs, sr = tts.generate_custom_voice(w.text, speaker=speaker, language=language, max_new_tokens=frames + 1)
        total = time.perf_counter() - a
        if sr != SAMPLE_RATE or wavs[0].size != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"reference returned {wavs[0].size} samples at {sr} Hz, expected {frames} frames")
        return total

    for i in range(w.warmup):
        call(w.frames, w.seed + 1000 + i)
    gen_s.clear()
    codec_s.clear()
    e2e_s = [call(w.frames, w.seed + i) for i in range(w.runs)]
    decode_s = list(gen_s)  # includes the prefill: generate() runs both
    out = summary(decode_s, e2e_s, [], w.frames)
    ttfa = e2e_s if w.frames == w.sentence_frames else None
    if ttfa is None:
        ttfa = [call(w.sentence_frames, w.seed + 200 + i) for i in range(max(1, w.runs // 2))]
    out["ttfa_ms"] = median(ttfa) * 1e3
    out["raw"].update(ttfa_s=ttfa, codec_s=codec_s)
    out.update(load_s=load_s, notes="no streaming API: first audio is the whole call; decode time includes prefill")
    return out


def _patch_mimi_rope() -> None:
    """qwen-tts-hf on transformers 5.x: its "default" RoPE init reads config.rope_theta, which the v5 Mimi config keeps
    in rope_parameters (running-peers-on-the-gpu.md §5). Fall back to that; the numbers are the same."""
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return
    inner = ROPE_INIT_FUNCTIONS.get("default")
    if inner is None or getattr(inner, "_bench_wrapped", False):
        return

    def default(config: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(config, "rope_theta", None) is None:
            params = getattr(config, "rope_parameters", None) or {}
            theta = params.get("rope_theta") if isinstance(params, dict) else None
            if theta is not None:
                try:
                    config.rope_theta = theta
                except Exception:
                    pass
        return inner(config, *args, **kwargs)

    default._bench_wrapped = True  # type: ignore[attr-defined]
    ROPE_INIT_FUNCTIONS["default"] = default


def run_fq(w: WorkerArgs) -> dict[str, Any]:
    import qwen_tts  # noqa: F401  (qwen-tts-hf from --fq-path; registers its RoPE entry first)
    import torch

    _patch_mimi_rope()
    import faster_qwen3_tts.generate as fq_generate
    from faster_qwen3_tts import FasterQwen3TTS

    t0 = time.perf_counter()
    fq = FasterQwen3TTS.from_pretrained(
        w.model, device=w.device, dtype=_peer_dtype(w.device), attn_implementation="sdpa", max_seq_len=2048
    )
    load_s = time.perf_counter() - t0
    model = fq.model.model
    _mask_eos(model, model.config.talker_config.codec_eos_token_id)
    gen_s: list[float] = []
    _timed(fq_generate, "fast_generate", gen_s)
    speaker, language = _speaker_name(w.speaker), _language_name(w.language)

    def call(frames: int, seed: int) -> float:
        torch.manual_seed(seed)
        a = time.perf_counter()
        wavs, sr = fq.generate_custom_voice(w.text, speaker=speaker, language=language, max_new_tokens=frames)
        total = time.perf_counter() - a
        if sr != SAMPLE_RATE or wavs[0].size != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"faster-qwen3-tts returned {wavs[0].size} samples at {sr} Hz, expected {frames} frames")
        return total

    def stream(frames: int, seed: int) -> float:
        """Seconds to the first chunk of a whole streamed sentence."""
        torch.manual_seed(seed)
        a = time.perf_counter()
        first = None
        samples = 0
        gen = fq.generate_custom_voice_streaming(w.text, speaker=speaker, language=language, max_new_tokens=frames)
        for item in gen:
            if first is None:
                first = time.perf_counter() - a
            samples += len(item[0])
        if samples != frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"faster-qwen3-tts streamed {samples} samples, expected {frames} frames")
        return first if first is not None else time.perf_counter() - a

    t1 = time.perf_counter()
    call(w.frames, w.seed + 1000)  # captures both CUDA graphs
    capture_s = time.perf_counter() - t1
    for i in range(w.warmup):
        call(w.frames, w.seed + 1100 + i)
    for i in range(max(1, w.warmup)):
        stream(w.sentence_frames, w.seed + 1200 + i)  # first stream decodes new, short codec shapes
    gen_s.clear()
    e2e_s = [call(w.frames, w.seed + i) for i in range(w.runs)]
    decode_s = list(gen_s)  # fast_generate: prefill + decode loop
    ttfa_s = [stream(w.sentence_frames, w.seed + 200 + i) for i in range(w.runs)]  # whole sentences, as ours
    out = summary(decode_s, e2e_s, ttfa_s, w.frames)
    out.update(
        load_s=load_s,
        capture_s=capture_s,
        notes="decode time includes prefill; TTFA from its streaming API, default chunk_size=12",
    )
    return out
