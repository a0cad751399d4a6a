"""Voice cloning and voice design on our side alone: which voice each model type takes, the clone-prompt cache
(keys, restarts, damaged files), the cloner's errors, and the codec stream that continues a clip's codes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.errors import UnknownLanguageError, VoiceError
from wyoming_qwen3tts.model.checkpoint import load_checkpoint
from wyoming_qwen3tts.model.clone import VoiceCloner, model_identity
from wyoming_qwen3tts.model.clone_cache import ClonePromptCache, cache_key
from wyoming_qwen3tts.model.codec import CodecDecoder
from wyoming_qwen3tts.model.prompt import ClonePrompt, build_prompt, chat_instruct, chat_text
from wyoming_qwen3tts.model.reference_audio import reference_audio_from_array
from wyoming_qwen3tts.model.talker import Qwen3TTSModel
from wyoming_qwen3tts.model.tokenizer import TextTokenizer

ALL_TYPES = ("custom_voice", "base", "voice_design")


def _clip(seconds: float = 2.0, seed: int = 0):
    t = np.arange(int(seconds * 24000)) / 24000
    x = 0.3 * np.sin(2 * np.pi * (150 + 250 * t) * t) + 0.03 * np.random.default_rng(seed).standard_normal(t.size)
    return reference_audio_from_array(x.astype(np.float32), 24000, source=f"clip{seed}")


def _load(path: Path, **kw):
    ckpt = load_checkpoint(path, dtype="float32", model_types=ALL_TYPES, **kw)
    tok = TextTokenizer.from_dir(path)
    return ckpt, tok, Qwen3TTSModel.from_tensors(ckpt.config, ckpt.tensors, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def base(tiny_base_checkpoint: Path):
    return _load(tiny_base_checkpoint)


def _voice(hidden: int, frames: int = 0) -> ClonePrompt:
    g = torch.Generator().manual_seed(1)
    if not frames:
        return ClonePrompt(speaker_embedding=torch.randn(hidden, generator=g))
    return ClonePrompt(
        speaker_embedding=torch.randn(hidden, generator=g),
        ref_codes=torch.randint(0, 2048, (frames, 16), generator=g),
        ref_text_ids=[151644, 77091, 198, 9707, 13, 151645, 198],
    )


# --------------------------------------------------------------------------------------------------------------------
# Which voice a model type takes


def test_each_model_type_takes_its_own_kind_of_voice(
    tiny_checkpoint: Path,
    tiny_voice_design_checkpoint: Path,
    base,
) -> None:
    _, tok, custom = _load(tiny_checkpoint)
    _, _, design = _load(tiny_voice_design_checkpoint)
    _, _, cloning = base
    ids = tok.encode(chat_text("Hello there."))
    voice = _voice(cloning.cfg.talker.hidden_size)
    with pytest.raises(VoiceError, match="CustomVoice model cannot speak a cloned voice"):
        build_prompt(custom, ids, voice)
    with pytest.raises(VoiceError, match="CustomVoice model cannot speak a designed voice"):
        build_prompt(custom, ids, None)
    with pytest.raises(VoiceError, match=r"Base model cannot speak a preset speaker \('ryan'\).*ClonePrompt"):
        build_prompt(cloning, ids, "ryan")
    with pytest.raises(VoiceError, match="Base model cannot speak a designed voice"):
        build_prompt(cloning, ids, None)
    with pytest.raises(VoiceError, match="VoiceDesign model cannot speak a cloned voice.*voice description"):
        build_prompt(design, ids, voice)
    with pytest.raises(VoiceError, match="VoiceDesign model cannot speak a preset speaker"):
        build_prompt(design, ids, "ryan")
    # Dialects belong to preset speakers: a clone or a design has only the plain languages.
    with pytest.raises(UnknownLanguageError, match="sichuan_dialect"):
        build_prompt(cloning, ids, voice, "sichuan_dialect")
    assert build_prompt(cloning, ids, voice, "korean").language_id == 2064
    assert build_prompt(design, ids, None, "auto").language_id is None


def test_prompt_lengths_of_each_voice_kind(base, tiny_voice_design_checkpoint: Path) -> None:
    """The layouts of prompt.py's module doc, position by position (text of N tokens, language given)."""
    _, tok, cloning = base
    _, _, design = _load(tiny_voice_design_checkpoint)
    ids = tok.encode(chat_text("Hello there, good morning."))
    n = len(ids) - 8
    hidden = cloning.cfg.talker.hidden_size
    x = _voice(hidden)
    # role 3 + control block 6 (think, think_bos, lang, think_eos, voice, pad) + text: same as a preset speaker.
    assert build_prompt(cloning, ids, x, "english").length == 3 + 6 + n + 1 + 1
    assert build_prompt(cloning, ids, x, "english", non_streaming_text=False).length == 3 + 6 + 1
    # The x-vector sits in the voice slot (position 3 + 4), added to PAD on the text track.
    prompt = build_prompt(cloning, ids, x, "english")
    pad = cloning.talker.embed_text(torch.tensor([151671]))[0]
    assert torch.allclose(prompt.embeds[7], pad + x.speaker_embedding, atol=1e-6)
    icl = _voice(hidden, frames=30)
    transcript = len(icl.ref_text_ids) - 5
    # In context, non-streaming: transcript + text + EOS with codec pads, then BOS + 30 frames with PAD.
    p = build_prompt(cloning, ids, icl, "english", non_streaming_text=True)
    assert p.length == 3 + 6 + (transcript + n + 1) + (1 + 30) and p.trailing.shape[0] == 1
    assert torch.equal(p.codec_context, icl.ref_codes)
    # Streaming: the text (shorter than 31 codec positions) is added to the codec positions, padded with PAD.
    p = build_prompt(cloning, ids, icl, "english", non_streaming_text=False)
    assert p.length == 3 + 6 + 31 and p.trailing.shape[0] == 1
    # VoiceDesign: the description first, and no voice slot in the control block.
    desc = tok.encode(chat_instruct("A calm low voice."))
    assert build_prompt(design, ids, None, "english", desc).length == len(desc) + 3 + 5 + n + 1 + 1


def test_base_ignores_an_instruct_with_a_warning(base, caplog: pytest.LogCaptureFixture) -> None:
    _, tok, cloning = base
    ids = tok.encode(chat_text("Hello there."))
    voice = _voice(cloning.cfg.talker.hidden_size)
    with caplog.at_level("WARNING"):
        with_instruct = build_prompt(cloning, ids, voice, "english", tok.encode(chat_instruct("whisper")))
    assert "instruct is ignored" in caplog.text
    assert torch.equal(with_instruct.embeds, build_prompt(cloning, ids, voice, "english").embeds)


def test_clone_prompt_checks_its_parts() -> None:
    with pytest.raises(ValueError, match="both the clip's codes and its transcript"):
        ClonePrompt(speaker_embedding=torch.zeros(8), ref_codes=torch.zeros(3, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="one vector"):
        ClonePrompt(speaker_embedding=torch.zeros(1, 8))
    with pytest.raises(ValueError, match=r"\[frames, groups\]"):
        ClonePrompt(speaker_embedding=torch.zeros(8), ref_codes=torch.zeros(0, 16), ref_text_ids=[1])
    assert ClonePrompt(speaker_embedding=torch.zeros(8)).mode == "x_vector"


# --------------------------------------------------------------------------------------------------------------------
# The cloner and its cache


def test_in_context_clone_needs_a_transcript(base) -> None:
    ckpt, tok, _ = base
    cloner = VoiceCloner.from_checkpoint(ckpt, tok)
    for transcript in (None, "", "   "):
        with pytest.raises(VoiceError, match="needs the transcript of the clip"):
            cloner.clone(_clip(), transcript)
    voice = cloner.clone(_clip(), None, x_vector_only=True)
    assert voice.mode == "x_vector" and voice.speaker_embedding.shape == (64,)


def test_only_a_base_model_with_its_encoders_clones(tiny_checkpoint: Path, tiny_base_checkpoint: Path) -> None:
    ckpt, tok, _ = _load(tiny_checkpoint)
    with pytest.raises(VoiceError, match="is a CustomVoice model; voices are cloned with a Base model"):
        VoiceCloner.from_checkpoint(ckpt, tok)
    bare, tok, _ = _load(tiny_base_checkpoint, clone_encoders=False)
    with pytest.raises(VoiceError, match="without its clone encoders"):
        VoiceCloner.from_checkpoint(bare, tok)


def test_cache_survives_a_restart_and_keys_on_everything_that_matters(base, tmp_path: Path) -> None:
    ckpt, tok, _ = base
    cloner = VoiceCloner.from_checkpoint(ckpt, tok, cache_dir=tmp_path)
    clip = _clip()
    first = cloner.clone(clip, "Hello there.")
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) == 1 and not list(tmp_path.glob("*.partial"))

    restarted = VoiceCloner.from_checkpoint(ckpt, tok, cache_dir=tmp_path)
    calls: list[object] = []
    real = restarted.compute
    restarted.compute = lambda *a: calls.append(a) or real(*a)  # type: ignore[method-assign]
    again = restarted.clone(clip, "  Hello there.  ")  # the transcript is stripped before it is keyed
    assert calls == []
    assert torch.equal(again.speaker_embedding, first.speaker_embedding) and torch.equal(
        again.ref_codes, first.ref_codes
    )
    assert again.ref_text_ids == first.ref_text_ids
    # Another transcript, another mode or another clip is another prompt; the x-vector mode ignores the transcript.
    restarted.clone(clip, "Something else.")
    restarted.clone(clip, "Hello there.", x_vector_only=True)
    restarted.clone(clip, "ignored", x_vector_only=True)
    restarted.clone(_clip(seed=1), "Hello there.")
    assert len(calls) == 3 and len(list(tmp_path.glob("*.safetensors"))) == 4

    keys = {
        cache_key("model-a", "clip", False, "t"),
        cache_key("model-b", "clip", False, "t"),
        cache_key("model-a", "clip2", False, "t"),
        cache_key("model-a", "clip", True, "t"),
        cache_key("model-a", "clip", False, "u"),
    }
    assert len(keys) == 5 and cache_key("m", "c", True, "t") == cache_key("m", "c", True, "u")


def test_damaged_or_foreign_cache_files_are_recomputed(base, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ckpt, tok, _ = base
    cloner = VoiceCloner.from_checkpoint(ckpt, tok, cache_dir=tmp_path)
    clip = _clip()
    good = cloner.clone(clip, "Hello there.")
    (file,) = tmp_path.glob("*.safetensors")
    file.write_bytes(file.read_bytes()[:100])  # truncated by a crash or a full disk
    with caplog.at_level("WARNING"):
        again = cloner.clone(clip, "Hello there.")
    assert "ignoring the cached clone prompt" in caplog.text
    assert torch.equal(again.ref_codes, good.ref_codes)
    # A valid prompt file under another prompt's name is not used either.
    other = cloner.clone(clip, None, x_vector_only=True)
    (x_file,) = [f for f in tmp_path.glob("*.safetensors") if f != file]
    x_file.replace(file)
    assert ClonePromptCache(tmp_path).load(file.stem) is None
    assert cloner.clone(clip, "Hello there.").in_context and other.mode == "x_vector"


def test_model_identity_follows_the_encoder_weights(
    tiny_base_checkpoint: Path, tiny_base_checkpoint_06b: Path, tmp_path: Path
) -> None:
    from wyoming_qwen3tts.tools.random_checkpoint import write_random_checkpoint

    def identity(path: Path, dtype: str = "float32") -> str:
        return model_identity(load_checkpoint(path, dtype=dtype, model_types=("base",)))

    a = identity(tiny_base_checkpoint)
    assert len(a) == 64
    assert identity(tiny_base_checkpoint, "bfloat16") == a  # the Talker's dtype does not enter a clone prompt
    # The two tiny sizes differ only in the Talker side (their encoders are drawn from the same per-name seeds), so
    # a prompt computed with one serves the other; other encoder weights make another identity.
    assert identity(tiny_base_checkpoint_06b) == a
    assert identity(write_random_checkpoint(tmp_path / "seed1", "tiny", seed=1, model_type="base")) != a


def test_unwritable_cache_still_clones(base, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ckpt, tok, _ = base
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    cloner = VoiceCloner.from_checkpoint(ckpt, tok, cache_dir=blocker / "prompts")
    with caplog.at_level("WARNING"):
        voice = cloner.clone(_clip(), None, x_vector_only=True)
    assert voice.speaker_embedding.shape == (64,) and "could not cache" in caplog.text


# --------------------------------------------------------------------------------------------------------------------
# Decoding after the clip's codes


def test_codec_stream_with_context_continues_the_full_decode(base) -> None:
    ckpt, _, _ = base
    codec = CodecDecoder.from_tensors(ckpt.codec_config, ckpt.codec_tensors)
    codes = torch.randint(0, 2048, (30, 16), generator=torch.Generator().manual_seed(3))
    full = codec.decode(codes)
    stream = codec.new_stream(context=codes[:20])
    assert stream.frames == 20
    tail = torch.cat([stream.decode(codes[20:24]), stream.decode(codes[24:])])
    assert tail.shape == (10 * 1920,)
    assert float((tail - full[20 * 1920 :]).abs().max()) <= 1e-5
    assert codec.new_stream(context=codes[:0]).frames == 0
    # A voice's context decoded once and forked per request: every fork continues it the same way, alone.
    primed = codec.new_stream(context=codes[:20])
    a, b = primed.fork(), primed.fork()
    first = a.decode(codes[20:])
    assert torch.equal(b.decode(codes[20:]), first) and torch.equal(primed.fork().decode(codes[20:]), first)
    assert float((first - full[20 * 1920 :]).abs().max()) <= 1e-5
    assert primed.frames == 20 and a.frames == 30
