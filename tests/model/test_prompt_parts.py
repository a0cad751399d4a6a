"""The voices' text-independent prompt vectors kept between requests (model/prompt.py PromptParts), on the CPU:

- a prompt built from kept parts (a hit) equals, bit for bit, the one built without a cache, for preset, instructed,
  designed and cloned voices (x-vector and in context), with either text feed;
- the parts are keyed by the voice, language and instruct: another of these misses, another text hits;
- the cache keeps at most its entries and bytes, least recently used dropped first;
- the engine builds its prompts through its cache (a second request of a voice hits).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from wyoming_qwen3tts.engine import Engine, SynthesisRequest
from wyoming_qwen3tts.model.prompt import (
    ClonePrompt,
    Prompt,
    PromptParts,
    chat_instruct,
    chat_ref_text,
    chat_text,
    prompt_for,
    resolve_voice,
)

TEXTS = ("The kitchen lights are now off.", "Good morning, it will be sunny with a high of twenty four degrees.")


def _clone(engine: Engine, in_context: bool, seed: int = 0, frames: int = 30) -> ClonePrompt:
    g = torch.Generator().manual_seed(seed)
    embedding = torch.randn(engine.model.cfg.talker.hidden_size, generator=g)
    if not in_context:
        return ClonePrompt(embedding)
    codes = torch.randint(0, 64, (frames, 16), generator=g)
    return ClonePrompt(embedding, codes, engine.tokenizer.encode(chat_ref_text("The clip says this, and more.")))


def _build(engine: Engine, text: str, cache: PromptParts | None, non_streaming: bool, **voice: Any) -> Prompt:
    instruct = voice.pop("instruct", None)
    resolved = resolve_voice(engine.model.cfg, voice.get("clone", voice.get("speaker")), voice.get("language"))
    return prompt_for(
        engine.model,
        engine.tokenizer.encode(chat_text(text)),
        resolved,
        engine.tokenizer.encode(chat_instruct(instruct)) if instruct else None,
        non_streaming_text=non_streaming,
        parts_cache=cache,
    )


def _voices(custom: Engine, design: Engine, base: Engine) -> list[tuple[Engine, dict[str, Any]]]:
    return [
        (custom, {"speaker": "ryan", "language": "english"}),
        (custom, {"speaker": "eric", "language": "auto"}),  # a dialect speaker: its own language id
        (custom, {"speaker": "ryan", "language": "english", "instruct": "Speak slowly and calmly."}),
        (design, {"instruct": "A calm, low voice of an old sailor telling a story by the fire."}),
        (base, {"clone": _clone(base, in_context=False), "language": "english"}),
        (base, {"clone": _clone(base, in_context=True), "language": "english"}),  # the clip longer than the texts
        (base, {"clone": _clone(base, in_context=True, frames=3), "language": "auto"}),  # the texts longer
    ]


def _assert_same(a: Prompt, b: Prompt, what: object) -> None:
    for name in ("embeds", "trailing", "pad"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape and x.dtype == y.dtype, (what, name)
        assert torch.equal(x, y), (what, name)
    assert a.prefix == b.prefix and a.language_id == b.language_id, what
    assert (a.codec_context is None) == (b.codec_context is None), what


@pytest.mark.parametrize("non_streaming", [True, False])
def test_kept_parts_build_the_same_prompt_bit_for_bit(
    custom: Engine, design: Engine, base: Engine, non_streaming: bool
) -> None:
    cache = PromptParts()
    for n, (engine, voice) in enumerate(_voices(custom, design, base)):
        for text in TEXTS:
            fresh = _build(engine, text, None, non_streaming, **voice)
            misses = cache.misses
            kept = _build(engine, text, cache, non_streaming, **voice)
            _assert_same(fresh, kept, (voice, text))
            # The first text of each voice makes its parts; the second one reuses them.
            assert cache.misses == misses + (text == TEXTS[0]), (voice, text)
        assert len(cache) == n + 1


def test_parts_follow_the_voice_language_and_instruct_not_the_text(custom: Engine, base: Engine) -> None:
    cache = PromptParts()
    variants: list[tuple[Engine, dict[str, Any]]] = [
        (custom, {"speaker": "ryan", "language": "english"}),
        (custom, {"speaker": "ryan", "language": "german"}),
        (custom, {"speaker": "vivian", "language": "english"}),
        (custom, {"speaker": "ryan", "language": "english", "instruct": "Whisper."}),
        (custom, {"speaker": "ryan", "language": "english", "instruct": "Shout."}),
        (base, {"clone": _clone(base, False, seed=1), "language": "english"}),
        (base, {"clone": _clone(base, False, seed=2), "language": "english"}),  # a new clip under any name
        (base, {"clone": _clone(base, True, seed=1), "language": "english"}),
    ]
    for engine, voice in variants:
        _build(engine, TEXTS[0], cache, True, **voice)
    assert (cache.misses, cache.hits, len(cache)) == (len(variants), 0, len(variants))
    for engine, voice in variants:
        _build(engine, TEXTS[1], cache, False, **voice)  # another text, the other feed: the same parts
    assert (cache.misses, cache.hits) == (len(variants), len(variants))


def test_cache_keeps_its_bound_least_recently_used_first(custom: Engine) -> None:
    speakers = ["ryan", "vivian", "eric"]
    one = _build(custom, TEXTS[0], (probe := PromptParts()), True, speaker="ryan", language="english")
    assert one is not None and probe.bytes > 0
    by_entries = PromptParts(max_entries=2)
    for speaker in speakers:
        _build(custom, TEXTS[0], by_entries, True, speaker=speaker, language="english")
    assert len(by_entries) == 2
    _build(custom, TEXTS[0], by_entries, True, speaker="ryan", language="english")  # dropped first: a miss
    assert by_entries.misses == 4 and by_entries.hits == 0
    by_bytes = PromptParts(max_bytes=probe.bytes * 2)  # every speaker's parts are the same size
    for speaker in speakers:
        _build(custom, TEXTS[0], by_bytes, True, speaker=speaker, language="english")
    assert len(by_bytes) == 2 and by_bytes.bytes <= probe.bytes * 2
    _build(custom, TEXTS[0], by_bytes, True, speaker="eric", language="english")  # the newest: kept
    assert by_bytes.hits == 1
    tiny = PromptParts(max_bytes=probe.bytes - 1)  # an entry larger than the whole bound is not kept
    _build(custom, TEXTS[0], tiny, True, speaker="ryan", language="english")
    assert len(tiny) == 0 and tiny.bytes == 0


def test_engine_prompts_reuse_the_voice_parts(custom: Engine) -> None:
    custom.prompt_parts.clear()
    hits = custom.prompt_parts.hits
    first = custom.prepare(SynthesisRequest(text=TEXTS[0], speaker="ryan", language="english"))
    second = custom.prepare(SynthesisRequest(text=TEXTS[1], speaker="ryan", language="english"))
    assert custom.prompt_parts.hits == hits + 1 and len(custom.prompt_parts) == 1
    assert first.prefix == second.prefix
    _assert_same(second, _build(custom, TEXTS[1], None, True, speaker="ryan", language="english"), "engine")
