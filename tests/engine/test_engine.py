"""Engine behaviour on a tiny checkpoint (CPU): frame groups, cancellation, limits and clear errors."""

from __future__ import annotations

import json
import shutil
import threading

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.engine import Engine, EngineOptions, SamplingParams, SynthesisRequest, pcm16
from wyoming_qwen3tts.errors import (
    EmptyTextError,
    ModelLoadError,
    Qwen3TTSError,
    SynthesisCancelled,
    TextTooLongError,
    UnknownLanguageError,
    UnknownSpeakerError,
)
from wyoming_qwen3tts.model.config import ModelConfigError

CPU32 = EngineOptions(device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def engine(tiny_checkpoint) -> Engine:
    options = EngineOptions(device="cpu", dtype="float32", first_chunk_frames=2, chunk_frames=5, max_text_chars=200)
    return Engine.from_pretrained(str(tiny_checkpoint), options)


def _request(**kw) -> SynthesisRequest:
    base = dict(text="This is a sentence for the engine test.", speaker="ryan", sampling=SamplingParams.greedy())
    base.update(kw)
    return SynthesisRequest(**base)


def test_groups_first_small_then_larger(engine):
    chunks = list(engine.synthesize(_request(max_frames=17)))
    sizes = [c.num_frames for c in chunks]
    # first group, then doubling up to chunk_frames: 2, 4, 5, 5, ... (the last may be short)
    assert sizes[:3] == [2, 4, 5]
    assert all(s == 5 for s in sizes[2:-1])
    assert sum(sizes) <= 17
    for c in chunks:
        assert len(c.pcm) == c.num_frames * 1920 * 2
        assert c.codes.shape == (c.num_frames, 16) and c.codes.dtype == np.int64


def test_streamed_pcm_equals_one_shot_codec_decode(engine):
    """Audio sent group by group is the same as decoding all codes at once (no seams)."""
    pcm, codes = engine.synthesize_all(_request(max_frames=23))
    full = pcm16(engine.codec.decode(torch.from_numpy(codes)))
    a = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
    b = np.frombuffer(full, dtype="<i2").astype(np.int32)
    # float32 streaming equals the full decode to ~1e-6, which can flip one 16-bit rounding step
    assert a.shape == b.shape and np.abs(a - b).max() <= 1


def test_group_sizes_ramp_up():
    from wyoming_qwen3tts.engine import next_group_size

    sizes = [1]
    while len(sizes) < 7:
        sizes.append(next_group_size(sizes[-1], 12))
    assert sizes == [1, 2, 4, 8, 12, 12, 12]


def test_max_frames_and_determinism(engine):
    a = engine.synthesize_all(_request(max_frames=9, seed=4, sampling=SamplingParams()))
    b = engine.synthesize_all(_request(max_frames=9, seed=4, sampling=SamplingParams()))
    assert len(a[1]) <= 9
    assert np.array_equal(a[1], b[1]) and a[0] == b[0]


def test_cancel_between_groups(engine):
    cancel = threading.Event()
    gen = engine.synthesize(_request(max_frames=40), cancel)
    first = next(gen)
    assert first.num_frames == 2
    cancel.set()
    with pytest.raises(SynthesisCancelled):
        next(gen)


@pytest.mark.parametrize(
    "kw,error",
    [
        (dict(speaker="nobody"), UnknownSpeakerError),
        (dict(language="klingon"), UnknownLanguageError),
        (dict(language="sichuan_dialect"), UnknownLanguageError),
        (dict(text="   \n "), EmptyTextError),
        (dict(text="x" * 201), TextTooLongError),
    ],
)
def test_bad_requests_raise_clear_errors(engine, kw, error):
    with pytest.raises(error) as info:
        list(engine.synthesize(_request(**kw)))
    assert str(info.value)


def test_unknown_speaker_message_lists_speakers(engine):
    with pytest.raises(UnknownSpeakerError, match="vivian"):
        engine.validate(_request(speaker="Bob"))


def test_speaker_lookup_is_case_insensitive(engine):
    assert engine.synthesize_all(_request(speaker="Ono_Anna", max_frames=3))[1].shape[0] >= 1


def test_control_tokens_in_text_are_neutralised(engine):
    assert engine.validate(_request(text=" hello <|im_end|> world ")).text == "hello  im_end  world"
    # Lone surrogates and control characters would break the tokenizer: spaces instead.
    assert engine.validate(_request(text="hi\ud800 there\x07")).text == "hi  there"
    assert (
        engine.prepare(_request(text="hi\ud800 there\x07")).length == engine.prepare(_request(text="hi  there")).length
    )
    prompt = engine.prepare(_request(text="hello <|im_end|> world"))
    plain = engine.prepare(_request(text="hello  im_end  world"))
    assert torch.equal(prompt.embeds, plain.embeds)


def test_missing_files_named(tiny_checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").unlink()
    (broken / "speech_tokenizer" / "config.json").unlink()
    with pytest.raises(ModelLoadError) as info:
        Engine.from_pretrained(str(broken), CPU32)
    assert "model.safetensors" in str(info.value) and "speech_tokenizer/config.json" in str(info.value)


def _relabelled(tiny_checkpoint, tmp_path, model_type: str):
    """A copy of the tiny CustomVoice checkpoint whose config.json says another tts_model_type."""
    other = tmp_path / model_type
    shutil.copytree(tiny_checkpoint, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["tts_model_type"] = model_type
    (other / "config.json").write_text(json.dumps(cfg))
    return str(other)


def test_unknown_model_type(tiny_checkpoint, tmp_path):
    """The engine serves CustomVoice, Base and VoiceDesign checkpoints; any other tts_model_type is a clear error."""
    with pytest.raises(ModelConfigError, match="tts_model_type"):
        Engine.from_pretrained(_relabelled(tiny_checkpoint, tmp_path, "tokenizer"), CPU32)


def test_a_base_checkpoint_missing_its_speaker_encoder_is_refused(tiny_checkpoint, tmp_path):
    """A CustomVoice checkpoint relabelled Base lacks the speaker encoder a Base model clones with."""
    with pytest.raises(Qwen3TTSError):
        Engine.from_pretrained(_relabelled(tiny_checkpoint, tmp_path, "base"), CPU32)


def test_kernels_backend_refused_on_cpu(tiny_checkpoint):
    from wyoming_qwen3tts.errors import Qwen3TTSError

    with pytest.raises(Qwen3TTSError, match="needs a GPU"):
        Engine.from_pretrained(str(tiny_checkpoint), EngineOptions(device="cpu", dtype="float32", backend="kernels"))


def test_warm_up_runs_a_short_synthesis(engine, caplog):
    with caplog.at_level("INFO"):
        seconds = engine.warm_up()
    assert seconds > 0
    assert "Warm-up synthesis took" in caplog.text
    assert engine.info.backend == "torch" and "CPU" in engine.info.device


def test_suppress_eos_decodes_exactly_max_frames(engine):
    from dataclasses import replace

    sampling = replace(SamplingParams.greedy(), suppress_eos=True)
    _, codes = engine.synthesize_all(_request(max_frames=30, sampling=sampling))
    assert codes.shape == (30, 16)
    assert not (codes[:, 0] == engine.config.talker.codec_eos_token_id).any()


def test_exclusive_backend_runs_one_request_at_a_time(engine, monkeypatch):
    """A backend with exclusive sessions (the kernel graph) never sees two sessions at once."""
    monkeypatch.setattr(type(engine.backend), "exclusive_sessions", True)
    first = engine.synthesize(_request(max_frames=12))
    next(first)
    started = threading.Event()

    def second() -> None:
        started.set()
        list(engine.synthesize(_request(max_frames=3)))

    t = threading.Thread(target=second)
    t.start()
    started.wait()
    t.join(timeout=1.0)
    assert t.is_alive(), "the second request must wait for the first"
    first.close()  # an abandoned generator releases the backend
    t.join(timeout=30)
    assert not t.is_alive()


def test_sampling_comes_from_the_checkpoint_then_the_options(tiny_checkpoint, tmp_path):
    """One rule for server, `say` and bench: the checkpoint's generation_config.json, then the
    options' overrides; a request without sampling settings takes the engine's."""
    from dataclasses import replace

    from wyoming_qwen3tts.request import SamplingOverrides

    other = tmp_path / "gen"
    shutil.copytree(tiny_checkpoint, other)
    gen = json.loads((other / "generation_config.json").read_text())
    gen.update(temperature=0.5, top_k=7, subtalker_top_p=0.8)
    (other / "generation_config.json").write_text(json.dumps(gen))
    plain = Engine.from_pretrained(str(other), CPU32)
    assert (plain.default_sampling.temperature, plain.default_sampling.top_k) == (0.5, 7)
    assert plain.default_sampling.subtalker_top_p == 0.8 and plain.default_sampling.do_sample
    overridden = Engine.from_pretrained(str(other), replace(CPU32, sampling=SamplingOverrides(top_k=3, greedy=True)))
    assert overridden.default_sampling == replace(
        plain.default_sampling, top_k=3, do_sample=False, subtalker_do_sample=False
    )
    request = SynthesisRequest(text="Sampling rule.", speaker="ryan", seed=5, max_frames=6)
    assert request.sampling is None
    _, implicit = plain.synthesize_all(request)
    _, explicit = plain.synthesize_all(replace(request, sampling=plain.default_sampling))
    assert np.array_equal(implicit, explicit)
    _, greedy = overridden.synthesize_all(request)
    _, greedy_explicit = overridden.synthesize_all(replace(request, sampling=replace(SamplingParams.greedy(), top_k=3)))
    assert np.array_equal(greedy, greedy_explicit)
