"""Token-exact parity with the reference package qwen-tts 0.1.1 (CPU, float32) on tiny random checkpoints.

Both engines load the same checkpoint directory. The reference tokenizes with its own processor
(the checkpoint's config.json keeps Qwen's regex, see the facts doc §7.1) and we check that our
tokenizer gives the same ids; then the codes of greedy decoding must be identical frame for
frame, and seeded sampling must draw the same codes (same draw order, same torch RNG).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

qwen_tts = pytest.importorskip("qwen_tts", reason="the reference oracle qwen-tts is part of the test extra")

from wyoming_qwen3tts.backends.torch_backend import TorchBackend  # noqa: E402
from wyoming_qwen3tts.engine import Engine, EngineOptions  # noqa: E402
from wyoming_qwen3tts.model.prompt import build_prompt, chat_instruct, chat_text  # noqa: E402
from wyoming_qwen3tts.request import SamplingParams  # noqa: E402

CPU_TORCH32 = EngineOptions(device="cpu", dtype="float32", backend="torch")

LONG_EN = (
    "The quick brown fox jumps over the lazy dog near the river bank, while seven children watch "
    "from the old stone bridge and count the boats that pass beneath it in the evening light."
)
LONG_ZH = "今天天气很好，我们一起去公园散步吧。晚上我们可以在家里做饭，然后看一部电影。"
SHORT = {
    "english": "Good morning, how are you today?",
    "chinese": "你好，很高兴认识你。",
    "japanese": "こんにちは、元気ですか。",
    "korean": "안녕하세요, 만나서 반갑습니다.",
    "german": "Guten Morgen, wie geht es dir heute?",
}


def _load_reference(path):
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from transformers import AutoProcessor

    torch.manual_seed(0)
    model = Qwen3TTSForConditionalGeneration.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager", device_map="cpu"
    ).eval()
    processor = AutoProcessor.from_pretrained(str(path), fix_mistral_regex=True)
    return model, processor


@pytest.fixture(scope="module")
def pair(tiny_checkpoint):
    ref, processor = _load_reference(tiny_checkpoint)
    ours = Engine.from_pretrained(str(tiny_checkpoint), CPU_TORCH32)
    return ref, processor, ours


@pytest.fixture(scope="module")
def pair_06b(tiny_checkpoint_06b):
    ref, processor = _load_reference(tiny_checkpoint_06b)
    ours = Engine.from_pretrained(str(tiny_checkpoint_06b), CPU_TORCH32)
    return ref, processor, ours


def _run_both(pair, text, speaker, language, *, instruct=None, non_streaming=True, frames=30, sample=False, seed=7):
    ref, processor, engine = pair
    ids = processor(text=chat_text(text), return_tensors="pt")["input_ids"]
    our_ids = engine.tokenizer.encode(chat_text(text))
    assert our_ids == ids[0].tolist(), "tokenizers disagree"
    instruct_ids = None
    if instruct:
        instruct_ids = processor(text=chat_instruct(instruct), return_tensors="pt")["input_ids"]
        assert engine.tokenizer.encode(chat_instruct(instruct)) == instruct_ids[0].tolist()
    gen = dict(
        do_sample=sample,
        subtalker_dosample=sample,
        top_k=50,
        top_p=1.0,
        temperature=0.9,
        subtalker_top_k=50,
        subtalker_top_p=1.0,
        subtalker_temperature=0.9,
        repetition_penalty=1.05,
    )
    torch.manual_seed(seed)
    with torch.inference_mode():
        ref_codes, _ = ref.generate(
            input_ids=[ids],
            instruct_ids=[instruct_ids],
            languages=[language],
            speakers=[speaker],
            non_streaming_mode=non_streaming,
            max_new_tokens=frames + 1,
            **gen,
        )
    ref_codes = ref_codes[0].numpy()

    prompt = build_prompt(
        engine.model,
        our_ids,
        speaker,
        language,
        instruct_ids[0].tolist() if instruct_ids is not None else None,
        non_streaming_text=non_streaming,
    )
    sampling = SamplingParams() if sample else SamplingParams.greedy()
    session = TorchBackend(engine.model).start(prompt, sampling, seed, frames)
    codes = session.next_frames(frames + 10)
    return ref_codes, codes


def _assert_same(ref_codes: np.ndarray, codes: np.ndarray) -> None:
    assert ref_codes.shape == codes.shape, f"reference {ref_codes.shape} vs ours {codes.shape}"
    bad = np.nonzero((ref_codes != codes).any(axis=1))[0]
    assert bad.size == 0, f"first differing frame {bad[0]}: ref {ref_codes[bad[0]]} ours {codes[bad[0]]}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "speaker,language,non_streaming,instruct",
    [
        ("ryan", "english", True, None),
        ("vivian", "auto", False, None),
        ("eric", "chinese", True, None),  # dialect rule: sichuan
        ("dylan", "auto", False, None),  # dialect rule: beijing
        ("aiden", "english", True, "Speak slowly and calmly, like a bedtime story."),
    ],
)
def test_long_greedy_codes_match_reference(pair, speaker, language, non_streaming, instruct):
    text = LONG_ZH if language == "chinese" else LONG_EN
    ref_codes, codes = _run_both(
        pair, text, speaker, language, instruct=instruct, non_streaming=non_streaming, frames=110
    )
    _assert_same(ref_codes, codes)
    assert len(codes) >= 100, "a long case must produce 100+ frames"


@pytest.mark.parametrize("speaker", ["serena", "uncle_fu", "ono_anna", "sohee", "eric", "dylan"])
@pytest.mark.parametrize("language", ["auto", "chinese"])
def test_every_speaker_short(pair, speaker, language):
    ref_codes, codes = _run_both(pair, SHORT["chinese"], speaker, language, frames=12)
    _assert_same(ref_codes, codes)


@pytest.mark.parametrize("language", ["japanese", "korean", "german", "english"])
def test_explicit_languages(pair, language):
    ref_codes, codes = _run_both(pair, SHORT[language], "ono_anna", language, non_streaming=False, frames=12)
    _assert_same(ref_codes, codes)


def test_seeded_sampling_matches_reference(pair):
    ref_codes, codes = _run_both(pair, SHORT["english"], "ryan", "english", sample=True, frames=25, seed=1234)
    _assert_same(ref_codes, codes)


@pytest.mark.slow
@pytest.mark.parametrize("non_streaming", [True, False])
def test_06b_without_projection(pair_06b, non_streaming):
    ref, _, engine = pair_06b
    assert not engine.config.has_mtp_projection
    assert "talker.code_predictor.small_to_mtp_projection.weight" not in engine.model.state_dict()
    ref_codes, codes = _run_both(pair_06b, LONG_EN, "sohee", "korean", non_streaming=non_streaming, frames=100)
    _assert_same(ref_codes, codes)


def test_06b_ignores_instruct_like_reference(pair_06b, caplog):
    """The reference wrapper drops instruct on 0.6B; we ignore it with a warning: same codes as none."""
    _, _, engine = pair_06b
    ids = engine.tokenizer.encode(chat_text(SHORT["english"]))
    with caplog.at_level("WARNING"):
        with_instruct = build_prompt(
            engine.model, ids, "ryan", "english", engine.tokenizer.encode(chat_instruct("whisper"))
        )
    without = build_prompt(engine.model, ids, "ryan", "english", None)
    assert "instruct is ignored" in caplog.text
    assert torch.equal(with_instruct.embeds, without.embeds)


def test_waveform_matches_reference_decode(pair):
    """Our codec on the checkpoint's codec weights vs the reference speech tokenizer, up to 300 frames."""
    ref, _, engine = pair
    gen = torch.Generator().manual_seed(5)
    for frames in (3, 300):
        codes = torch.randint(0, 2048, (frames, 16), generator=gen)
        with torch.inference_mode():
            ref_wavs, sr = ref.speech_tokenizer.decode([{"audio_codes": codes}])
            ours = engine.codec.decode(codes)
        assert sr == 24000
        ref_wave = torch.as_tensor(np.asarray(ref_wavs[0]), dtype=torch.float32)
        assert ours.shape == ref_wave.shape == (frames * 1920,)
        assert float((ours - ref_wave).abs().max()) <= 1e-4
