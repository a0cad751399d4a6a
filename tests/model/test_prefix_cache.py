"""Voices' prompt prefixes (model/prompt.py PromptPrefix, model/prefix_cache.py) on the CPU, tiny checkpoints:

- a prompt's prefix covers exactly the positions its text does not touch (the same vectors for two texts; the
  first position after it differs), for preset, designed and cloned voices (x-vector and in context);
- the key changes with the voice, the language, the instruct and the clip, never with the text;
- greedy codes with the prefix cache (the second request of a voice prefilled after its cached prefix) equal the
  uncached path's, token for token, on the torch backend and through the kernel backend's prefill (eagerly here:
  its captured graphs are checked on a GPU, tests/kernels/test_prefill_gpu.py);
- Transformer.prefill_after (start on the device, every cache position masked) writes the K/V and hidden state
  of forward() within float32 rounding, whatever stale values the cache holds past the start;
- the cache keeps at most its bound in bytes, least recently used dropped first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from wyoming_qwen3tts.backends.kernels.prefill import PrefillGraphs
from wyoming_qwen3tts.backends.torch_backend import TorchBackend
from wyoming_qwen3tts.engine import Engine, SamplingParams, SynthesisRequest
from wyoming_qwen3tts.model.prefix_cache import PrefixCache
from wyoming_qwen3tts.model.prompt import ClonePrompt, Prompt, PromptPrefix, chat_ref_text

GREEDY = replace(SamplingParams.greedy(), suppress_eos=True)
FRAMES = 24
TEXTS = ("The kitchen lights are now off.", "Good morning, it will be sunny with a high of twenty four degrees.")


def _clone(engine: Engine, in_context: bool, seed: int = 0) -> ClonePrompt:
    """A clone prompt of random but valid parts (no clip to encode): the prefix depends only on what it holds."""
    g = torch.Generator().manual_seed(seed)
    h = engine.model.cfg.talker.hidden_size
    embedding = torch.randn(h, generator=g)
    if not in_context:
        return ClonePrompt(embedding)
    codes = torch.randint(0, 64, (30, 16), generator=g)  # longer than the texts: they meet the clip's codes
    ref_text = engine.tokenizer.encode(chat_ref_text("The clip says this, and a little more."))
    return ClonePrompt(embedding, codes, ref_text)


def _request(text: str, **kw: Any) -> SynthesisRequest:
    kw.setdefault("speaker", "")  # designed and cloned voices have no preset speaker
    return SynthesisRequest(text=text, sampling=GREEDY, **kw)


def _prompts(engine: Engine, **voice: Any) -> list[Prompt]:
    return [engine.prepare(_request(t, **voice)) for t in TEXTS]


def _voices(custom: Engine, design: Engine, base: Engine) -> list[tuple[Engine, dict[str, Any]]]:
    return [
        (custom, {"speaker": "ryan", "language": "english"}),
        (custom, {"speaker": "ryan", "language": "auto"}),
        (design, {"instruct": "A calm, low voice of an old sailor telling a story by the fire."}),
        (base, {"clone": _clone(base, in_context=False), "language": "english"}),
        (base, {"clone": _clone(base, in_context=True), "language": "english"}),
    ]


def test_prefix_covers_the_positions_the_text_does_not_touch(custom: Engine, design: Engine, base: Engine) -> None:
    for engine, voice in _voices(custom, design, base):
        a, b = _prompts(engine, **voice)
        assert a.prefix is not None and b.prefix is not None, voice
        assert a.prefix == b.prefix, voice  # same length and key whatever the text
        n = a.prefix.length
        assert 0 < n < min(a.length, b.length)
        torch.testing.assert_close(a.embeds[:n], b.embeds[:n], rtol=0, atol=0)
        assert not torch.equal(a.embeds[n], b.embeds[n]), f"{voice}: position {n} should already be the text's"


def test_prefix_key_follows_the_voice_language_instruct_and_clip(custom: Engine, design: Engine, base: Engine) -> None:
    def key(engine: Engine, **voice: Any) -> PromptPrefix:
        prefix = engine.prepare(_request(TEXTS[0], **voice)).prefix
        assert prefix is not None
        return prefix

    keys = [
        key(custom, speaker="ryan", language="english"),
        key(custom, speaker="ryan", language="auto"),
        key(custom, speaker="vivian", language="english"),
        key(design, instruct="A calm, low voice."),
        key(design, instruct="A bright, quick voice."),
        key(base, clone=_clone(base, False, seed=1), language="english"),
        key(base, clone=_clone(base, False, seed=2), language="english"),  # another clip under any name
        key(base, clone=_clone(base, True, seed=1), language="english"),
    ]
    assert len({k.key for k in keys}) == len(keys), keys
    # The same clip's contents give the same key (a re-upload of the same file hits).
    assert key(base, clone=_clone(base, True, seed=3), language="english") == key(
        base, clone=_clone(base, True, seed=3), language="english"
    )


def _codes(backend: TorchBackend, prompt: Prompt, frames: int = FRAMES) -> np.ndarray:
    return backend.start(prompt, GREEDY, 0, frames).next_frames(frames)


def test_torch_backend_codes_with_the_prefix_cache_equal_the_uncached_path(
    custom: Engine, design: Engine, base: Engine
) -> None:
    for engine, voice in _voices(custom, design, base):
        plain = TorchBackend(engine.model)
        cache = PrefixCache(64 << 20)
        cached = TorchBackend(engine.model, cache)
        for prompt in _prompts(engine, **voice) + _prompts(engine, **voice)[:1]:
            np.testing.assert_array_equal(_codes(cached, prompt), _codes(plain, prompt), err_msg=str(voice))
        assert (cache.misses, cache.hits, len(cache)) == (1, 2, 1), voice


def test_kernel_prefill_after_a_cached_prefix_equals_the_whole_prefill(custom: Engine) -> None:
    """PrefillGraphs (the kernel backend's prefill) with graphs off, as on a runtime that cannot capture: the
    prompt after its cached prefix writes the whole prefill's K/V and last hidden state."""
    model = custom.model
    talker = model.talker.model
    whole = PrefillGraphs(talker, torch.zeros(model.cfg.talker.hidden_size), model.dtype, enabled=False)
    cache = PrefixCache(64 << 20)
    after = PrefillGraphs(talker, torch.zeros(model.cfg.talker.hidden_size), model.dtype, enabled=False, prefixes=cache)
    first, second = _prompts(custom, speaker="ryan", language="english")
    c1, c2 = model.new_talker_cache(256), model.new_talker_cache(256)
    after.prefill(first.embeds, c1, first.prefix)  # a miss: whole, then stored
    assert (cache.misses, len(cache)) == (1, 1)
    c1.data.normal_()  # stale values everywhere: the prefill after the prefix must overwrite or mask them
    after.prefill(second.embeds, c1, second.prefix)
    whole.prefill(second.embeds, c2)
    assert cache.hits == 1 and c1.length == c2.length == second.length
    n = second.length
    torch.testing.assert_close(c1.data[:, :, :n], c2.data[:, :, :n], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after.hn, whole.hn, rtol=1e-5, atol=1e-5)


def test_prefill_after_with_a_device_start_equals_forward(custom: Engine) -> None:
    """The graph body of a prefill after a prefix (start and last as device values, padded to a bucket) against
    forward() of the same positions, with garbage past the start in the cache."""
    model = custom.model
    talker = model.talker.model
    prompt = _prompts(custom, speaker="ryan", language="english")[1]
    start, n, bucket = 7, prompt.length - 7, 32
    ref_cache, cache = model.new_talker_cache(128), model.new_talker_cache(128)
    with torch.inference_mode():
        talker(prompt.embeds[:start], ref_cache)
        cache.data.normal_()
        cache.data[:, :, :start].copy_(ref_cache.data[:, :, :start])
        want = talker(prompt.embeds[start:], ref_cache)[-1:]
        x = torch.zeros(bucket, prompt.embeds.shape[1])
        x[:n] = prompt.embeds[start:]
        got = talker.prefill_after(x, cache, torch.tensor([start]), torch.tensor([n - 1]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.data[:, :, : start + n], ref_cache.data[:, :, : start + n], rtol=1e-5, atol=1e-5)


def test_prefix_cache_keeps_its_bound_dropping_the_least_recently_used() -> None:
    def entry(positions: int) -> torch.Tensor:
        return torch.zeros(2, 2, positions + 4, 1, 8)  # [layers, 2, max_seq, kv, hd]; 32 floats a position

    per_position = 2 * 2 * 1 * 8 * 4
    cache = PrefixCache(10 * per_position)
    a, b, c = PromptPrefix(4, ("a",)), PromptPrefix(4, ("b",)), PromptPrefix(4, ("c",))
    cache.keep(a, entry(4))
    cache.keep(b, entry(4))
    assert cache.kv_for(a) is not None  # a is now the most recently used
    cache.keep(c, entry(4))  # 12 positions > 10: b goes
    assert cache.kv_for(b) is None and cache.kv_for(a) is not None and cache.kv_for(c) is not None
    assert cache.bytes == 8 * per_position and len(cache) == 2
    cache.keep(PromptPrefix(11, ("huge",)), entry(11))  # larger than the whole bound: not kept, nothing dropped
    assert len(cache) == 2
    assert cache.kv_for(PromptPrefix(3, ("a",))) is None  # another length under the same key is no hit
    got = cache.kv_for(a)
    assert got is not None and got.shape[2] == 4
