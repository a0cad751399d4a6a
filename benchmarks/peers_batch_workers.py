"""Workers of benchmarks.peers_batch, each run in its peer's environment: build the full-size model in memory with
qwen-tts 0.1.1's own classes and random weights, then time qwen3-tts-triton's generate_batch() (CustomVoice) or
faster-qwen3-tts-batch's generate_voice_clone_batch() (Base) at each stream count, end of speech masked."""

from __future__ import annotations

import gc
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wyoming_qwen3tts.request import SAMPLE_RATE, SAMPLES_PER_FRAME

from .common import gpu_name, memory, sync
from .peers import _mask_eos, _timed
from .peers_batch import streams_row

# Qwen's chat markers around the text, as _build_assistant_text's string tokenises (qwen3-tts-model.md §7.1):
# <|im_start|> assistant \n TEXT <|im_end|> \n <|im_start|> assistant \n
_ROLE = [151644, 77091, 198]
_TAIL = [151645, 198, 151644, 77091, 198]

Save = Callable[[dict[str, Any]], None]


def prompt_ids(text_tokens: int) -> list[int]:
    """A fixed prompt: ordinary BPE ids stand in for the text (the random model does not care which)."""
    return [*_ROLE, *((1_000 + 7_919 * i) % 150_000 for i in range(text_tokens)), *_TAIL]


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in (
        "qwen3-tts-triton",
        "faster-qwen3-tts-batch",
        "faster-qwen3-tts",
        "qwen-tts",
        "transformers",
        "torch",
        "triton",
    ):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _randomise(module: Any, seed: int, tiny: bool) -> None:
    """Every saved tensor by the rules of our random checkpoints (full sizes: matrices N(0, 0.02), biases 0, norm and
    scale vectors 1), drawn where it lives: no NaN may reach torch.multinomial (its device-side assert ends the run)."""
    import torch

    from wyoming_qwen3tts.tools.random_checkpoint import _init_rule

    device = next(module.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    with torch.no_grad():
        for name, t in module.state_dict(keep_vars=True).items():
            if t.is_floating_point():
                _init_rule(name, tuple(t.shape), tiny)(t.data, gen)


def build_model(size: str, model_type: str, device: str, dtype: Any, seed: int, text_tokens: int) -> Any:
    """qwen-tts's Qwen3TTSModel around a random model and codec built in memory (running-peers-on-the-gpu.md §2),
    with the release's configs and generation defaults from tools.random_checkpoint; prompts are fixed ids."""
    import torch
    from qwen_tts import Qwen3TTSModel, Qwen3TTSTokenizer
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    from transformers import EncodecFeatureExtractor

    from wyoming_qwen3tts.tools.random_checkpoint import (
        CODEC_PREPROCESSOR_CONFIG,
        GENERATION_CONFIG,
        TINY_SIZES,
        codec_config_dict,
        model_config_dict,
    )

    cfg = Qwen3TTSConfig.from_dict(model_config_dict(size, model_type))
    ccfg = Qwen3TTSTokenizerV2Config.from_dict(codec_config_dict(size))
    cfg._attn_implementation = ccfg._attn_implementation = "sdpa"  # flash-attn is absent; both peers capture sdpa
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # what from_pretrained(dtype=...) does while it builds, for the codec too
    try:
        with torch.device(device):
            model = Qwen3TTSForConditionalGeneration(cfg).eval()
            codec = Qwen3TTSTokenizerV2Model(ccfg).eval()
    finally:
        torch.set_default_dtype(before)
    tiny = size in TINY_SIZES
    _randomise(model, seed, tiny)
    _randomise(codec, seed + 1, tiny)
    tok = Qwen3TTSTokenizer()  # the codec wrapper; from_pretrained would fill these fields
    tok.model, tok.config, tok.device = codec, codec.config, torch.device(device)
    # A Base prompt encodes the reference clip (create_voice_clone_prompt does even in x-vector mode).
    fe = {k: v for k, v in CODEC_PREPROCESSOR_CONFIG.items() if k != "feature_extractor_type"}
    tok.feature_extractor = EncodecFeatureExtractor(**fe)
    model.load_speech_tokenizer(tok)
    model.load_generate_config(dict(GENERATION_CONFIG))
    wrapper = Qwen3TTSModel(model=model, processor=None, generate_defaults=model.generate_config)
    ids = torch.tensor([prompt_ids(text_tokens)], device=device)
    wrapper._tokenize_texts = lambda texts: [ids.clone() for _ in texts]  # replaces the Qwen2 BPE processor
    _mask_eos(model, model.config.talker_config.codec_eos_token_id)
    return wrapper


def faster_model(wrapper: Any, device: str, dtype: Any, max_seq_len: int) -> Any:
    """faster-qwen3-tts 0.2.4's FasterQwen3TTS around the wrapper: what its from_pretrained does after loading."""
    from faster_qwen3_tts import FasterQwen3TTS
    from faster_qwen3_tts.predictor_graph import PredictorGraph
    from faster_qwen3_tts.talker_graph import TalkerGraph

    t, tc = wrapper.model.talker, wrapper.model.config.talker_config
    pg = PredictorGraph(
        t.code_predictor,
        t.code_predictor.model.config,
        tc.hidden_size,
        device=device,
        dtype=dtype,
        do_sample=True,
        top_k=50,
        temperature=0.9,
    )
    tg = TalkerGraph(t.model, tc, device=device, dtype=dtype, max_seq_len=max_seq_len)
    return FasterQwen3TTS(
        base_model=wrapper, predictor_graph=pg, talker_graph=tg, device=device, dtype=dtype, max_seq_len=max_seq_len
    )


def _timed_prefill(talker: Any, sink: list[float], shapes: list[int]) -> None:
    """Time the talker's prefill forward: both peers call talker.forward() only there (decode steps replay graphs of
    talker.model), so the generate loop minus this is the decode time."""
    inner = talker.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        embeds = kwargs.get("inputs_embeds")
        if embeds is not None and int(embeds.shape[1]) not in shapes:
            shapes.append(int(embeds.shape[1]))
        sync()
        a = time.perf_counter()
        out = inner(*args, **kwargs)
        sync()
        sink.append(time.perf_counter() - a)
        return out

    talker.forward = forward


def _free() -> None:
    import torch

    gc.collect()  # the previous count's graphs and static caches, before the next count's peak is read
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sweep(
    spec: dict[str, Any],
    save: Save,
    base: dict[str, Any],
    call: Callable[[int, int], float],
    forget: Callable[[int], None],
    gen_s: list[float],
    prefill_s: list[float],
) -> dict[str, Any]:
    """Time every stream count in spec order: a capture/warm-up call, then spec["runs"] timed calls. A count that
    fails becomes a row with its error; the result is saved after every count."""
    import torch

    rows: list[dict[str, Any]] = []
    result = dict(base, rows=rows, complete=False)
    for n in spec["streams"]:
        try:
            first = call(n, spec["seed"] + 1000)  # captures this count's graphs
            for i in range(spec["warmup"] - 1):
                call(n, spec["seed"] + 1100 + i)
            e2e, gen, pre = [], [], []
            for r in range(spec["runs"]):
                gen_s.clear()
                prefill_s.clear()
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()  # the peak of a timed call, weights and graphs included
                e2e.append(call(n, spec["seed"] + 100 * r))
                gen.append(sum(gen_s))
                pre.append(sum(prefill_s))
            row = streams_row(n, spec["frames"], e2e, gen, pre, first)
            row.update(memory())
        except Exception as err:  # recorded, and the next count still runs (a CUDA error will fail it quickly)
            traceback.print_exc()
            row = {"streams": n, "ok": False, "error": f"{type(err).__name__}: {err}"[:600]}
        forget(n)
        _free()
        rows.append(row)
        print(
            f"[{spec['peer']}] {n} streams: "
            + (
                f"{row['aggregate_fps']:.1f} frames/s aggregate, "
                f"{row['step_ms']:.2f} ms/step, call {row['e2e_ms']:.0f} ms"
                if row.get("ok") and row.get("aggregate_fps")
                else str(row.get("error"))
            ),
            flush=True,
        )
        save(result)
    result["complete"] = True
    return result


def _setup(spec: dict[str, Any]) -> tuple[Any, Any, float]:
    """Build the model (CustomVoice or Base) and its FasterQwen3TTS; also returns the build time."""
    import torch

    dtype = torch.bfloat16 if spec["device"].startswith("cuda") else torch.float32
    t0 = time.perf_counter()
    wrapper = build_model(spec["size"], spec["model_type"], spec["device"], dtype, spec["seed"], spec["text_tokens"])
    fq = faster_model(wrapper, spec["device"], dtype, spec["max_seq_len"])
    sync()
    return wrapper, fq, time.perf_counter() - t0


def _base(spec: dict[str, Any], wrapper: Any, build_s: float) -> dict[str, Any]:
    import qwen_tts
    import torch
    import transformers

    alloc = torch.cuda.memory_allocated() / 1024**3 if torch.cuda.is_available() else None
    # Which copies were imported: the carried folders must hide the box's own transformers.
    paths = {m.__name__: str(Path(m.__file__).parent) for m in (qwen_tts, transformers)}
    return dict(
        gpu=gpu_name(),
        torch=torch.__version__,
        versions=_versions(),
        build_s=build_s,
        weights_gib=alloc,
        frames=spec["frames"],
        runs=spec["runs"],
        size=spec["size"],
        model_type=spec["model_type"],
        attn=wrapper.model.talker.config._attn_implementation,
        paths=paths,
    )


def _check(what: str, audio: Any, sr: int, frames: int) -> None:
    if sr != SAMPLE_RATE or audio.size != frames * SAMPLES_PER_FRAME:
        raise RuntimeError(f"{what}: {audio.size} samples at {sr} Hz, expected {frames} frames at {SAMPLE_RATE} Hz")


def run_triton(spec: dict[str, Any], save: Save) -> dict[str, Any]:
    """qwen3-tts-triton 0.3.0: the hybrid (or faster) runner's generate_batch() with batch_size = N, CustomVoice."""
    import faster_qwen3_tts
    import torch
    from qwen3_tts_triton import create_runner
    from qwen3_tts_triton.models import batched

    wrapper, fq, build_s = _setup(spec)
    dtype = "bf16" if spec["device"].startswith("cuda") else "fp32"
    runner = create_runner(spec["mode"], device=spec["device"], model_id="(random, in memory)", dtype=dtype)
    # Its load_model() calls FasterQwen3TTS.from_pretrained() and, in hybrid mode, patches the Triton kernels in
    # afterwards; hand it our model so that its own loading code runs.
    cls = faster_qwen3_tts.FasterQwen3TTS
    original = cls.__dict__["from_pretrained"]
    cls.from_pretrained = classmethod(lambda _cls, *a, **k: fq)
    try:
        runner.load_model()
    finally:
        cls.from_pretrained = original
    if runner.model is not fq:
        raise RuntimeError("qwen3-tts-triton's load_model() did not take the in-memory model")
    gen_s: list[float] = []
    prefill_s: list[float] = []
    positions: list[int] = []
    _timed(batched.BatchedEngine, "_generate_bucket", gen_s)  # prefill + decode loop of one bucket
    _timed_prefill(wrapper.model.talker, prefill_s, positions)
    frames = spec["frames"]

    def call(n: int, seed: int) -> float:
        torch.manual_seed(seed)
        sync()
        a = time.perf_counter()
        out = runner.generate_batch(
            [spec["text"]] * n,
            language=spec["language"],
            speaker=spec["speaker"],
            batch_size=n,
            max_new_tokens=frames,
            min_new_tokens=2,
            repetition_penalty=1.05,
            temperature=0.9,
            top_k=50,
            top_p=1.0,
            greedy=False,
            max_seq_len=spec["max_seq_len"],
            bucket=True,
        )
        sync()
        total = time.perf_counter() - a
        if len(out["results"]) != n or out["num_buckets"] != 1:
            raise RuntimeError(f"generate_batch: {len(out['results'])} clips in {out['num_buckets']} buckets for {n}")
        for clip in out["results"]:
            if clip["codec_steps"] != frames:
                raise RuntimeError(f"generate_batch: {clip['codec_steps']} frames, expected {frames}")
            _check("generate_batch", clip["audio"], clip["sample_rate"], frames)
        return total

    base = _base(spec, wrapper, build_s)
    base.update(
        mode=spec["mode"],
        speaker=spec["speaker"],
        prompt_positions=positions,
        notes=f"{spec['mode']} runner, generate_batch(batch_size=N): one bucket of N equal clips; decode = "
        "_generate_bucket minus its prefill forward; no streaming: TTFA is the whole call, which "
        "decodes every clip's codes to audio one after the other",
    )
    return _sweep(spec, save, base, call, lambda n: runner._batched.clear(), gen_s, prefill_s)


def _reference_clip(folder: Path, seconds: float) -> str:
    """A 24 kHz WAV for the Base prompt: a tone under noise (the random speaker encoder only needs some audio)."""
    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    rng = np.random.default_rng(0)
    audio = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.size)
    path = folder / "reference.wav"
    sf.write(str(path), audio.astype(np.float32), SAMPLE_RATE)
    return str(path)


def run_fqb(spec: dict[str, Any], save: Save) -> dict[str, Any]:
    """faster-qwen3-tts-batch 0.2.0: BatchedFasterQwen3TTS(max_batch_size = N).generate_voice_clone_batch() on Base,
    N requests for one reference clip (its defaults: x-vector only, non-streaming text)."""
    import faster_qwen3_tts_batch.batched_generate as fqb_generate
    import torch
    from faster_qwen3_tts_batch import BatchedFasterQwen3TTS

    wrapper, fq, build_s = _setup(spec)
    gen_s: list[float] = []
    prefill_s: list[float] = []
    positions: list[int] = []
    _timed(fqb_generate, "batched_fast_generate", gen_s)  # model.py imports it at call time
    _timed_prefill(wrapper.model.talker, prefill_s, positions)
    frames = spec["frames"]
    tmp = tempfile.TemporaryDirectory()
    ref = _reference_clip(Path(tmp.name), spec["ref_seconds"])
    engines: dict[int, Any] = {}

    def call(n: int, seed: int) -> float:
        if n not in engines:  # batched graphs are captured for a fixed batch size, on the first call
            engines[n] = BatchedFasterQwen3TTS(fq, max_batch_size=n, max_seq_len=spec["max_seq_len"])
        requests = [dict(text=spec["text"], language=spec["language"], ref_audio=ref, ref_text="")] * n
        torch.manual_seed(seed)
        sync()
        a = time.perf_counter()
        outs = engines[n].generate_voice_clone_batch(
            requests,
            max_new_tokens=frames,
            min_new_tokens=2,
            temperature=0.9,
            top_k=50,
            top_p=1.0,
            do_sample=True,
            repetition_penalty=1.05,
        )
        sync()
        total = time.perf_counter() - a
        if len(outs) != n:
            raise RuntimeError(f"generate_voice_clone_batch: {len(outs)} outputs for {n} requests")
        for arrays, sr in outs:
            _check("generate_voice_clone_batch", arrays[0], sr, frames)
        return total

    base = _base(spec, wrapper, build_s)
    base.update(
        ref_seconds=spec["ref_seconds"],
        prompt_positions=positions,
        notes="Base voice clone (x-vector only, its default); max_batch_size = N, batch-and-wait; decode = "
        "batched_fast_generate minus its prefill forward; the 1-stream capture includes the base "
        "model's batch-1 graphs; no streaming: TTFA is the whole call",
    )
    try:
        return _sweep(spec, save, base, call, lambda n: engines.pop(n, None), gen_s, prefill_s)
    finally:
        tmp.cleanup()
