"""`python -m wyoming_qwen3tts.tools.quant_check --model DIR`: does int8 (weights = "int8") pick what bf16 picks?

Loads the model once on the torch path (in `--dtype`, bf16 on a GPU), makes an int8 copy of it (model/quant.py;
the two share every tensor but the quantized matrices), and for a fixed set of sentences in the model's
languages:

1. the reference model generates the codes: the checkpoint's sampling with a fixed seed (`--greedy`: argmax),
   up to `--frames` frames or its end of speech;
2. both models are teacher-forced through those same codes: every step sees the same context, so a slip of
   int8 at one step does not derail the steps after it;
3. per step, code 0 (the Talker's choice, after the code-0 processors the server applies: repetition penalty,
   suppressed ids) and codes 1..15 (the CodePredictor's, raw logits) are compared: top-1 agreement (int8's
   argmax equals the reference's argmax; with --greedy that is the reference's own code) and the KL divergence
   KL(reference || int8) of the two softmaxes, in nats.

`--baseline` also teacher-forces a float32 copy of the reference: how often float32 and bf16 disagree is the
rounding noise bf16 itself brings, a scale for int8's numbers. The README's "8-bit weights" says how to read
them. On random weights (tools.random_checkpoint) the numbers mean little: their logits are nearly flat, so
argmaxes flip on tiny differences; the tool runs there only to show that it works.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ..backends.torch_backend import TorchBackend
from ..engine import Engine
from ..errors import Qwen3TTSError
from ..model.prompt import ClonePrompt, Prompt
from ..model.quant import QuantReport, quantize_model
from ..model.sampling import CodeZeroProcessor
from ..model.talker import Qwen3TTSModel
from ..options import EngineOptions
from ..request import SamplingParams, SynthesisRequest

_LOG = logging.getLogger(__name__)


class Sentence(NamedTuple):
    language: str
    text: str
    speaker: str  # preferred (CustomVoice); another is taken where the model lacks it
    long: bool = False  # a passage, where small errors have the most steps to show


# The released models' ten languages with one sentence each, then two long passages.
SENTENCES: tuple[Sentence, ...] = tuple(
    Sentence(*s)
    for s in (
        (
            "english",
            "The quick brown fox jumps over the lazy dog while the kettle starts to sing in the kitchen.",
            "ryan",
        ),
        ("chinese", "今天天气很好，我们一起去公园散步吧。晚上我们可以在家里做饭。", "vivian"),
        (
            "german",
            "Guten Morgen! Ich habe das Licht in der Küche ausgeschaltet und die Haustür abgeschlossen.",
            "aiden",
        ),
        ("spanish", "El tren sale mañana temprano, así que preparamos las maletas esta noche.", "serena"),
        ("japanese", "こんにちは、今日はとても良い天気ですね。散歩に行きましょう。", "ono_anna"),
        ("korean", "안녕하세요, 만나서 반갑습니다. 오늘 날씨가 정말 좋네요.", "sohee"),
        ("french", "Le petit café au coin de la rue ouvre ses portes à sept heures chaque matin.", "eric"),
        ("russian", "Сегодня вечером мы пойдём в театр, а потом поужинаем в ресторане.", "uncle_fu"),
        ("italian", "La biblioteca della città resterà chiusa per lavori fino alla fine del mese.", "dylan"),
        ("portuguese", "Amanhã vamos visitar os nossos avós no campo e levar um bolo de laranja.", "aiden"),
        (
            "english",
            "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker "
            "who repaired every clock in the valley. Each morning he opened his shop, wound the tall clock by the door, "
            "and listened to the ticking as if it were a song that only he could understand.",
            "ryan",
            True,
        ),
        (
            "chinese",
            "从前，在一座大森林的边上有一个小村庄，村里住着一位年老的钟表匠。他每天早上打开店门，给门边那座高高的"
            "座钟上弦，然后静静地听着滴答声，仿佛那是一首只有他才能听懂的歌。",
            "serena",
            True,
        ),
    )
)

# A Base model without --reference-audio speaks with a zero speaker embedding (as Engine.warm_up does); a
# VoiceDesign model with this description.
DESIGN = "A calm, clear adult voice, speaking at a moderate pace."


@dataclass
class Logits:
    """One model's teacher-forced outputs on one sentence."""

    code0: Tensor  # [steps, V] float32: the Talker's scores after the code-0 processors
    predictor: Tensor  # [frames, 15, V_cp] float32: the CodePredictor's logits for codes 1..15


@torch.inference_mode()
def teacher_forced(model: Qwen3TTSModel, prompt: Prompt, codes: Tensor, steps: int, penalty: float) -> Logits:
    """The model's logits at every step of a decode whose codes are given: codes [T, 16] (on the model's
    device); steps = T, or T + 1 when the decode ended with an end of speech after frame T (its code-0 step is
    compared too). The same computation as the torch backend's session (backends/torch_backend.py), with
    the Talker's positions run in blocks and each frame's 16 CodePredictor positions at once."""
    talker = model.talker
    cp = talker.code_predictor
    cfg = model.cfg.talker
    frames = codes.shape[0]
    dtype = model.dtype
    # The Talker input after frame t: the sum of its 16 code embeddings, plus the text of step t.
    tables = [talker.model.codec_embedding, *cp.model.codec_embedding]
    summed = torch.stack([table(codes[:, g]) for g, table in enumerate(tables)], dim=0).sum(0)  # [T, H]
    n_trailing = prompt.trailing.shape[0]
    extra = (
        torch.stack([prompt.trailing[t] if t < n_trailing else prompt.pad for t in range(steps - 1)])
        if steps > 1
        else summed[:0]
    )
    inputs = torch.cat([prompt.embeds.to(dtype), (summed[: steps - 1] + extra.to(dtype))], dim=0)
    cache = model.new_talker_cache(inputs.shape[0])
    hidden = torch.cat([talker.model(block, cache) for block in inputs.split(256)])[prompt.length - 1 :]  # [steps, H]

    processor = CodeZeroProcessor(cfg.vocab_size, cfg.codec_eos_token_id, device=model.device)
    logits = talker.codec_head(hidden)
    code0 = torch.cat([processor(logits[t], codes[:t, 0], penalty) for t in range(steps)])

    cp_cache = model.new_predictor_cache()
    groups = cfg.num_code_groups
    predictor = []
    for t in range(frames):
        rows = [hidden[t : t + 1], talker.embed_codec(codes[t, :1])]
        rows += [cp.model.codec_embedding[g - 1](codes[t, g : g + 1]) for g in range(1, groups - 1)]
        cp_cache.reset()
        y = cp.model(cp.project(torch.cat(rows)), cp_cache)  # [16, H_cp]; position j predicts code j
        predictor.append(torch.cat([cp.lm_head[j - 1](y[j : j + 1]) for j in range(1, groups)]).float())
    return Logits(code0.float(), torch.stack(predictor) if predictor else logits.new_zeros(0, groups - 1, 0))


def kl_divergence(reference: Tensor, candidate: Tensor) -> Tensor:
    """KL(softmax(reference) || softmax(candidate)) over the last dim, in nats; ids masked (-inf) in the
    reference count nothing (the code-0 processors mask the same ids in both)."""
    lp = torch.log_softmax(reference.double(), dim=-1)
    lq = torch.log_softmax(candidate.double(), dim=-1)
    terms = torch.where(torch.isfinite(lp), lp.exp() * (lp - lq), torch.zeros_like(lp))
    return terms.sum(-1).clamp_min(0.0)


def compare(reference: Logits, candidate: Logits) -> dict[str, Any]:
    """Top-1 agreement and KL of a candidate's logits against the reference's, code 0 and codes 1..15."""
    agree0 = reference.code0.argmax(-1) == candidate.code0.argmax(-1)
    kl0 = kl_divergence(reference.code0, candidate.code0)
    agree_cp = reference.predictor.argmax(-1) == candidate.predictor.argmax(-1)  # [T, 15]
    kl_cp = kl_divergence(reference.predictor, candidate.predictor)
    misses = (~agree0).nonzero()
    return {
        "code0": {
            "steps": int(agree0.numel()),
            "agreement": _mean(agree0),
            "kl_mean": _mean(kl0),
            "kl_max": _max(kl0),
            "first_disagreement": int(misses[0]) if misses.numel() else None,
            "per_step": {"agree": agree0.int().tolist(), "kl": [round(float(v), 6) for v in kl0]},
        },
        "code_predictor": {
            "codes": int(agree_cp.numel()),
            "agreement": _mean(agree_cp),
            "per_group": [_mean(agree_cp[:, j]) for j in range(agree_cp.shape[1])] if agree_cp.numel() else [],
            "kl_mean": _mean(kl_cp),
            "kl_max": _max(kl_cp),
        },
    }


def _mean(t: Tensor) -> float:
    return float(t.double().mean()) if t.numel() else math.nan


def _max(t: Tensor) -> float:
    return float(t.max()) if t.numel() else math.nan


def _pooled(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """code0 / code_predictor over every sentence, each step counted once."""
    count = "steps" if key == "code0" else "codes"
    parts = [r[key] for r in results if r[key][count]]
    n = sum(p[count] for p in parts)
    if not n:
        return {count: 0, "agreement": math.nan, "kl_mean": math.nan, "kl_max": math.nan}
    return {
        count: n,
        "agreement": sum(p["agreement"] * p[count] for p in parts) / n,
        "kl_mean": sum(p["kl_mean"] * p[count] for p in parts) / n,
        "kl_max": max(p["kl_max"] for p in parts),
    }


def int8_copy(model: Qwen3TTSModel) -> tuple[Qwen3TTSModel, QuantReport]:
    """A copy of the model with its matrices in int8. The copy shares every tensor with the original (the
    deepcopy memo maps each to itself); quantize_model then swaps the copy's Linear modules, not the original's."""
    shared: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    quant = copy.deepcopy(model, shared)
    return quant, quantize_model(quant)


def float32_copy(model: Qwen3TTSModel) -> Qwen3TTSModel:
    """A float32 copy, each tensor converted on its own device as the copy is made (no second bf16 copy)."""
    converted: dict[int, Any] = {
        id(p): nn.Parameter(p.detach().float(), requires_grad=False) for p in model.parameters()
    }
    return copy.deepcopy(model, converted)


def _voice(
    engine: Engine, index: int, preferred: str, clone: ClonePrompt | None
) -> tuple[str, ClonePrompt | None, str | None]:
    """(speaker, clone, instruct) for the model's type."""
    if engine.model_type == "custom_voice":
        speakers = engine.speakers
        return (preferred if preferred in speakers else speakers[index % len(speakers)]), None, None
    if engine.model_type == "base":
        return "", clone, None
    return "", None, DESIGN


def run(
    engine: Engine,
    candidates: dict[str, Qwen3TTSModel],
    *,
    sentences: int,
    frames: int,
    seed: int,
    greedy: bool,
    clone: ClonePrompt | None = None,
) -> list[dict[str, Any]]:
    """Per sentence: the reference (engine.model) generates, every model is teacher-forced; one result a sentence
    with each candidate's comparison under its name."""
    sampling = SamplingParams.greedy() if greedy else engine.default_sampling
    chosen = [s for s in SENTENCES if s[0] in engine.languages][:sentences]
    results = []
    for index, (language, text, preferred, long) in enumerate(chosen):
        speaker, voice, instruct = _voice(engine, index, preferred, clone)
        request = SynthesisRequest(text=text, speaker=speaker, language=language, instruct=instruct, clone=voice)
        prompt = engine.prepare(request)  # the same for every candidate: it reads no quantized matrix
        with torch.inference_mode():
            codes = TorchBackend(engine.model).start(prompt, sampling, seed, frames).next_frames(frames)
        codes_t = torch.from_numpy(codes).to(engine.model.device)
        ended = len(codes) < frames  # the reference drew its end of speech
        steps = len(codes) + int(ended)
        reference = teacher_forced(engine.model, prompt, codes_t, steps, sampling.repetition_penalty)
        result: dict[str, Any] = {
            "language": language,
            "long": long,
            "speaker": speaker or None,
            "text": text,
            "frames": len(codes),
            "ended": ended,
        }
        for name, model in candidates.items():
            forced = teacher_forced(model, prompt, codes_t, steps, sampling.repetition_penalty)
            result[name] = compare(reference, forced)
        results.append(result)
        _LOG.info("%s: %d frames compared", language, len(codes))
    return results


def table(results: list[dict[str, Any]], name: str) -> str:
    """The short table the tool prints: one row a sentence and the pooled row, for one candidate."""
    lines = [
        f"{'sentence':<22} {'frames':>6} {'code0 agree':>11} {'code0 KL mean/max':>19} "
        f"{'cp agree':>8} {'cp KL mean/max':>17}"
    ]

    def row(label: str, frames: str, c0: dict[str, Any], cp: dict[str, Any]) -> str:
        return (
            f"{label:<22} {frames:>6} {c0['agreement']:>11.4f} {c0['kl_mean']:>9.2e}/{c0['kl_max']:<9.2e} "
            f"{cp['agreement']:>8.4f} {cp['kl_mean']:>8.2e}/{cp['kl_max']:<8.2e}"
        )

    for number, r in enumerate(results, 1):
        label = f"{number:>2} {r['language']}{', long' if r['long'] else ''}"
        frames = f"{r['frames']}{'' if r['ended'] else '+'}"
        lines.append(row(label, frames, r[name]["code0"], r[name]["code_predictor"]))
    total = sum(r["frames"] for r in results)
    lines.append(
        row(
            "all",
            str(total),
            _pooled([r[name] for r in results], "code0"),
            _pooled([r[name] for r in results], "code_predictor"),
        )
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_qwen3tts.tools.quant_check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", required=True, help="checkpoint directory or Hugging Face repo id")
    parser.add_argument("--data-dir", type=Path, default=None, help="where downloaded models are kept")
    parser.add_argument("--device", default="auto", help="auto (a GPU when there is one), cuda, cuda:N, cpu")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="the reference's dtype (auto: bfloat16 on a GPU, float32 on the CPU)",
    )
    parser.add_argument(
        "--sentences", type=int, default=len(SENTENCES), help=f"how many of the {len(SENTENCES)} sentences"
    )
    parser.add_argument("--frames", type=int, default=400, help="most frames a sentence (12.5 frames = 1 s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the reference's sampling")
    parser.add_argument("--greedy", action="store_true", help="the reference decodes greedily instead of sampling")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="also compare a float32 copy of the reference (bf16's own rounding, for scale)",
    )
    parser.add_argument("--reference-audio", type=Path, default=None, help="a Base model: clone this clip's voice")
    parser.add_argument("--reference-text", default=None, help="the clip's transcript (in-context cloning)")
    parser.add_argument("--json", type=Path, default=None, help="write every number here, per step included")
    args = parser.parse_args(argv)
    if args.sentences < 1 or args.frames < 1:
        parser.error("--sentences and --frames must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        options = EngineOptions(
            data_dir=args.data_dir, device=args.device, dtype=args.dtype, backend="torch", max_frames=args.frames
        )
        engine = Engine.from_pretrained(args.model, options)
        clone = None
        if engine.model_type == "base":
            clone = (
                engine.clone_voice(args.reference_audio, args.reference_text)
                if args.reference_audio
                else ClonePrompt(torch.zeros(engine.config.talker.hidden_size))
            )
        int8, report = int8_copy(engine.model)
        candidates = {"int8": int8}
        if args.baseline and engine.model.dtype != torch.float32:
            candidates["float32"] = float32_copy(engine.model)
        elif args.baseline:
            print("--baseline: the reference is float32 already; no baseline to add", file=sys.stderr)
        results = run(
            engine,
            candidates,
            sentences=args.sentences,
            frames=args.frames,
            seed=args.seed,
            greedy=args.greedy,
            clone=clone,
        )
    except (Qwen3TTSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    how = "greedy" if args.greedy else f"sampled (the checkpoint's sampling, seed {args.seed})"
    print(
        f"\n{args.model}: reference {engine.info.dtype} on {engine.info.device}, codes {how}, "
        f"teacher-forced through both; int8: {report}"
    )
    print("frames: '+' = stopped at --frames before its end of speech; agree = top-1 agreement; KL in nats\n")
    for name in candidates:
        print(f"{name} against the {engine.info.dtype} reference:\n{table(results, name)}\n")
    if args.json is not None:
        summary = {
            name: {key: _pooled([r[name] for r in results], key) for key in ("code0", "code_predictor")}
            for name in candidates
        }
        args.json.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "device": engine.info.device,
                    "dtype": engine.info.dtype,
                    "reference_codes": how,
                    "int8": {
                        "matrices": report.modules,
                        "bytes_before": report.bytes_before,
                        "bytes_after": report.bytes_after,
                    },
                    "overall": summary,
                    "sentences": results,
                },
                indent=1,
                ensure_ascii=False,
            )
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
