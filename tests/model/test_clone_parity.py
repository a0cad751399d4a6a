"""Token-exact parity of voice cloning (Base) and voice design (VoiceDesign) with the reference qwen-tts 0.1.1, on
tiny random checkpoints of both Base sizes and of VoiceDesign (CPU, float32, greedy).

The reference builds its clone prompt from the clip itself (create_voice_clone_prompt: its own speaker encoder, mel
features, resampler and codec encoder), and we build ours from the same file with our own modules; then the codes of
greedy decoding must be identical frame for frame, in x-vector and in-context mode, with both text feeds, in several
languages. The x-vector must agree within 1e-5 and the clip's codes exactly. As in test_parity.py, the reference is
driven through model.generate (what generate_voice_clone / generate_voice_design call) so that codes come back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

qwen_tts = pytest.importorskip("qwen_tts", reason="the reference oracle qwen-tts is part of the test extra")

from wyoming_qwen3tts.backends.torch_backend import TorchBackend  # noqa: E402
from wyoming_qwen3tts.model.checkpoint import load_checkpoint  # noqa: E402
from wyoming_qwen3tts.model.clone import VoiceCloner  # noqa: E402
from wyoming_qwen3tts.model.codec import CodecDecoder  # noqa: E402
from wyoming_qwen3tts.model.codec_encoder import CodecEncoder  # noqa: E402
from wyoming_qwen3tts.model.prompt import build_prompt, chat_instruct, chat_ref_text, chat_text  # noqa: E402
from wyoming_qwen3tts.model.reference_audio import read_reference_audio  # noqa: E402
from wyoming_qwen3tts.model.speaker_encoder import log_mel_spectrogram, mel_filterbank  # noqa: E402
from wyoming_qwen3tts.model.talker import Qwen3TTSModel  # noqa: E402
from wyoming_qwen3tts.model.tokenizer import TextTokenizer  # noqa: E402
from wyoming_qwen3tts.request import SamplingParams  # noqa: E402

ALL_TYPES = ("custom_voice", "base", "voice_design")
REF_TEXT = "This is the reference clip, read in my own voice."
TEXTS = {
    "english": "Good morning, how are you today?",
    "chinese": "你好，很高兴认识你。",
    "japanese": "こんにちは、元気ですか。",
    "german": "Guten Morgen, wie geht es dir heute?",
}
LONG_EN = (
    "The quick brown fox jumps over the lazy dog near the river bank, while seven children watch "
    "from the old stone bridge and count the boats that pass beneath it in the evening light."
)
GREEDY = dict(
    do_sample=False,
    subtalker_dosample=False,
    top_k=50,
    top_p=1.0,
    temperature=0.9,
    subtalker_top_k=50,
    subtalker_top_p=1.0,
    subtalker_temperature=0.9,
    repetition_penalty=1.05,
)


def _chirp(seconds: float, rate: int, seed: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * (150 + 250 * t) * t) + 0.04 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Reference clips as files: 24 kHz mono WAV; 16 kHz stereo FLAC (read, mixed down and resampled by both sides);
    1 s (text longer than the clip's codes); 12.5 s (more positions than the encoder's 250-position window)."""
    d = tmp_path_factory.mktemp("clips")
    out = {"wav24k": d / "voice.wav", "flac16k": d / "voice.flac", "short": d / "short.wav", "long": d / "long.wav"}
    soundfile.write(out["wav24k"], _chirp(3.2, 24000, 0), 24000, subtype="FLOAT")
    stereo = np.stack([_chirp(2.6, 16000, 1), 0.5 * _chirp(2.6, 16000, 2)], axis=1)
    soundfile.write(out["flac16k"], stereo, 16000, subtype="PCM_24")
    soundfile.write(out["short"], _chirp(1.0, 24000, 3), 24000, subtype="FLOAT")
    soundfile.write(out["long"], _chirp(12.5, 24000, 4), 24000, subtype="FLOAT")
    return out


class Ours:
    """Our side of one checkpoint: model, tokenizer, codec decoder and (Base) a voice cloner."""

    def __init__(self, path: Path, cache_dir: Path | None = None) -> None:
        ckpt = load_checkpoint(path, dtype="float32", model_types=ALL_TYPES)
        self.ckpt = ckpt
        self.tokenizer = TextTokenizer.from_dir(path)
        self.model = Qwen3TTSModel.from_tensors(ckpt.config, ckpt.tensors, dtype=torch.float32, device="cpu")
        self.codec = CodecDecoder.from_tensors(ckpt.codec_config, ckpt.codec_tensors)
        self.cloner = (
            VoiceCloner.from_checkpoint(ckpt, self.tokenizer, cache_dir=cache_dir)
            if ckpt.codec_encoder_tensors
            else None
        )

    def codes(
        self,
        voice,
        text: str,
        language: str,
        *,
        instruct: str | None = None,
        non_streaming: bool,
        frames: int,
    ):
        instruct_ids = self.tokenizer.encode(chat_instruct(instruct)) if instruct else None
        prompt = build_prompt(
            self.model,
            self.tokenizer.encode(chat_text(text)),
            voice,
            language,
            instruct_ids,
            non_streaming_text=non_streaming,
        )
        return prompt, TorchBackend(self.model).start(prompt, SamplingParams.greedy(), 0, frames).next_frames(
            frames + 10
        )


def _reference(path: Path):
    from qwen_tts import Qwen3TTSModel as Reference

    torch.manual_seed(0)
    return Reference.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager", device_map="cpu")


class BasePair:
    """The reference and our side on one Base checkpoint. The reference's clone prompts are kept per clip and mode:
    building one runs its encoders on the clip, which is the slow part of these tests on a CPU."""

    def __init__(self, path: Path, cache_dir: Path) -> None:
        self.ref = _reference(path)
        self.ours = Ours(path, cache_dir=cache_dir)
        self._ref_prompts: dict[tuple[Path, bool], object] = {}

    def ref_prompt(self, clip: Path, x_vector_only: bool):
        key = (clip, x_vector_only)
        if key not in self._ref_prompts:
            items = self.ref.create_voice_clone_prompt(
                ref_audio=str(clip), ref_text=REF_TEXT, x_vector_only_mode=x_vector_only
            )
            self._ref_prompts[key] = items[0]
        return self._ref_prompts[key]


@pytest.fixture(scope="module", params=["tiny_base_checkpoint", "tiny_base_checkpoint_06b"])
def base_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> BasePair:
    return BasePair(request.getfixturevalue(request.param), tmp_path_factory.mktemp("prompts"))


@pytest.fixture(scope="module")
def design_pair(tiny_voice_design_checkpoint: Path):
    return _reference(tiny_voice_design_checkpoint), Ours(tiny_voice_design_checkpoint)


def _ids(ref, text: str) -> torch.Tensor:
    return ref.processor(text=text, return_tensors="pt")["input_ids"]


def _assert_same(ref_codes: np.ndarray, codes: np.ndarray, at_least: int) -> None:
    assert ref_codes.shape == codes.shape, f"reference {ref_codes.shape} vs ours {codes.shape}"
    bad = np.nonzero((ref_codes != codes).any(axis=1))[0]
    assert bad.size == 0, f"first differing frame {bad[0]}: ref {ref_codes[bad[0]]} ours {codes[bad[0]]}"
    assert len(codes) >= at_least, f"only {len(codes)} frames: the comparison would prove little"


def _clone_both(
    pair,
    clip: Path,
    text: str,
    language: str,
    *,
    x_vector_only: bool,
    non_streaming: bool,
    frames: int = 10,
):
    ref, ours = pair.ref, pair.ours
    item = pair.ref_prompt(clip, x_vector_only)
    ids, ref_ids = _ids(ref, chat_text(text)), _ids(ref, chat_ref_text(REF_TEXT))
    assert ours.tokenizer.encode(chat_text(text)) == ids[0].tolist()
    assert ours.tokenizer.encode(chat_ref_text(REF_TEXT)) == ref_ids[0].tolist()
    with torch.inference_mode():
        ref_codes, _ = ref.model.generate(
            input_ids=[ids],
            ref_ids=[ref_ids],
            voice_clone_prompt=ref._prompt_items_to_voice_clone_prompt([item]),
            languages=[language],
            non_streaming_mode=non_streaming,
            max_new_tokens=frames + 1,
            **GREEDY,
        )
    voice = ours.cloner.clone(read_reference_audio(clip), REF_TEXT, x_vector_only=x_vector_only)
    prompt, codes = ours.codes(voice, text, language, non_streaming=non_streaming, frames=frames)
    return item, voice, prompt, ref_codes[0].numpy(), codes


# --------------------------------------------------------------------------------------------------------------------
# The encoders


def test_mel_filterbank_equals_librosa() -> None:
    librosa = pytest.importorskip("librosa")
    ours = mel_filterbank()
    assert ours.dtype == np.float32 and ours.shape == (128, 513)
    assert np.array_equal(ours, librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000))


def test_log_mel_features_equal_the_reference() -> None:
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    for seconds in (1.0, 2.37):
        wav = _chirp(seconds, 24000, 5)
        ref = mel_spectrogram(
            torch.from_numpy(wav)[None],
            n_fft=1024,
            num_mels=128,
            sampling_rate=24000,
            hop_size=256,
            win_size=1024,
            fmin=0,
            fmax=12000,
        )
        assert torch.equal(log_mel_spectrogram(torch.from_numpy(wav)), ref[0].transpose(0, 1))


@pytest.mark.parametrize("clip", ["wav24k", "flac16k", "short"])
def test_speaker_embedding_within_1e5_of_the_reference(base_pair, clips, clip: str) -> None:
    ours = base_pair.ours
    theirs = base_pair.ref_prompt(clips[clip], True).ref_spk_embedding
    mine = ours.cloner.compute(read_reference_audio(clips[clip]), None).speaker_embedding
    assert mine.shape == theirs.shape == (ours.model.cfg.talker.hidden_size,)
    assert float((mine - theirs).abs().max()) <= 1e-5
    assert float(theirs.abs().mean()) > 0.05  # a real vector, not zeros on both sides


@pytest.fixture(scope="module")
def codec_pair(tiny_base_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> BasePair:
    # Both tiny Base sizes write the same codec (same config, same per-tensor seeds), so one of them covers it.
    return BasePair(tiny_base_checkpoint, tmp_path_factory.mktemp("prompts"))


@pytest.mark.parametrize("clip", ["wav24k", "flac16k", "short", "long"])
def test_reference_clip_codes_equal_the_reference_encoder(codec_pair, clips, clip: str) -> None:
    ref, ours = codec_pair.ref, codec_pair.ours
    wav, rate = soundfile.read(clips[clip], dtype="float32")
    if wav.ndim > 1:
        wav = wav.mean(axis=-1)
    theirs = ref.model.speech_tokenizer.encode(wav, sr=rate).audio_codes[0]
    audio = read_reference_audio(clips[clip])
    encoder: CodecEncoder = ours.cloner.codec_encoder
    mine = encoder.encode(audio.samples)
    assert mine.dtype == torch.int64 and mine.shape == theirs.shape == (-(-len(audio.samples) // 1920), 16)
    assert torch.equal(mine, theirs.cpu())
    assert len(torch.unique(mine[:, 0])) > 1  # the codes follow the sound


# --------------------------------------------------------------------------------------------------------------------
# Clone prompts and decoding


@pytest.mark.parametrize("non_streaming", [False, True])
@pytest.mark.parametrize("language", ["english", "chinese"])
def test_x_vector_clone_codes_match_reference(base_pair, clips, language: str, non_streaming: bool) -> None:
    text = TEXTS["chinese" if language == "chinese" else "english"]
    _, voice, prompt, ref_codes, codes = _clone_both(
        base_pair, clips["flac16k"], text, language, x_vector_only=True, non_streaming=non_streaming
    )
    assert not voice.in_context and prompt.codec_context is None
    _assert_same(ref_codes, codes, at_least=6)


@pytest.mark.parametrize("non_streaming", [False, True])
@pytest.mark.parametrize("language", ["japanese", "german", "auto"])
def test_in_context_clone_codes_match_reference(base_pair, clips, language: str, non_streaming: bool) -> None:
    text = TEXTS.get(language, TEXTS["english"])
    item, voice, prompt, ref_codes, codes = _clone_both(
        base_pair, clips["wav24k"], text, language, x_vector_only=False, non_streaming=non_streaming
    )
    assert voice.in_context and torch.equal(voice.ref_codes, item.ref_code)
    assert prompt.codec_context is not None and torch.equal(prompt.codec_context, item.ref_code)
    # The prompt holds the clip's frames: it is longer than the clip's codes.
    assert prompt.length > len(item.ref_code)
    _assert_same(ref_codes, codes, at_least=6)


def test_in_context_streaming_text_longer_than_the_clip(base_pair, clips) -> None:
    """A 1 s clip (14 codec positions) and a long text: the text runs past the clip, so the rest of it becomes the
    trailing text fed during decoding (the other branch of the reference's streaming ICL layout)."""
    _, _, prompt, ref_codes, codes = _clone_both(
        base_pair, clips["short"], LONG_EN, "english", x_vector_only=False, non_streaming=False, frames=12
    )
    assert prompt.trailing.shape[0] > 10
    _assert_same(ref_codes, codes, at_least=6)


def test_in_context_audio_continues_the_clip_like_the_reference(base_pair, clips) -> None:
    """generate_voice_clone decodes the clip's codes and the new ones in one pass and cuts the clip's part off; a
    codec stream started after the prompt's codec_context gives the same samples."""
    ref, ours = base_pair.ref, base_pair.ours
    text = TEXTS["english"]
    torch.manual_seed(0)
    wavs, rate = ref.generate_voice_clone(
        text=text, language="english", ref_audio=str(clips["wav24k"]), ref_text=REF_TEXT, max_new_tokens=11, **GREEDY
    )
    voice = ours.cloner.clone(read_reference_audio(clips["wav24k"]), REF_TEXT)
    prompt, codes = ours.codes(voice, text, "english", non_streaming=False, frames=10)
    mine = ours.codec.new_stream(context=prompt.codec_context).decode(torch.from_numpy(codes))
    # The reference cuts at int(ref_frames / all_frames * samples), which may land one sample early.
    total = len(prompt.codec_context) + len(codes)
    cut = int(len(prompt.codec_context) / total * (total * 1920))
    theirs = torch.from_numpy(wavs[0])[len(prompt.codec_context) * 1920 - cut :]
    assert rate == 24000 and mine.shape == theirs.shape == (len(codes) * 1920,)
    assert float((mine - theirs).abs().max()) <= 1e-4
    # Without the clip's codes in front the same frames sound different: the context matters.
    fresh = ours.codec.decode(torch.from_numpy(codes))
    assert float((fresh - theirs).abs().max()) > 1e-3


@pytest.mark.slow
def test_long_in_context_greedy_codes_match_reference(base_pair, clips) -> None:
    """100+ frames after the longest prompt kind (clip codes + transcript + text); the x-vector prompt has the
    CustomVoice layout, whose long runs test_parity.py covers."""
    _, _, _, ref_codes, codes = _clone_both(
        base_pair, clips["wav24k"], LONG_EN, "english", x_vector_only=False, non_streaming=False, frames=105
    )
    _assert_same(ref_codes, codes, at_least=100)


def test_cached_prompt_gives_the_same_codes(base_pair, clips) -> None:
    """A prompt read back from the cache directory is the computed one, bit for bit (what a restart uses)."""
    ours = base_pair.ours
    audio = read_reference_audio(clips["wav24k"])
    computed = ours.cloner.compute(audio, REF_TEXT)
    ours.cloner.clone(audio, REF_TEXT)  # computes and stores it, unless an earlier test already did
    restarted = VoiceCloner.from_checkpoint(ours.ckpt, ours.tokenizer, cache_dir=ours.cloner.cache.directory)

    def no_encoders(*_: object) -> None:
        raise AssertionError("a cached voice must not run the encoders again")

    restarted.compute = no_encoders  # type: ignore[method-assign]
    cached = restarted.clone(audio, REF_TEXT)
    assert torch.equal(cached.speaker_embedding, computed.speaker_embedding)
    assert torch.equal(cached.ref_codes, computed.ref_codes) and cached.ref_text_ids == computed.ref_text_ids


# --------------------------------------------------------------------------------------------------------------------
# Voice design


def _design_both(pair, text: str, description: str, language: str, *, non_streaming: bool, frames: int = 10):
    ref, ours = pair
    ids = _ids(ref, chat_text(text))
    instruct_ids = _ids(ref, chat_instruct(description)) if description else None
    if instruct_ids is not None:
        assert ours.tokenizer.encode(chat_instruct(description)) == instruct_ids[0].tolist()
    with torch.inference_mode():
        ref_codes, _ = ref.model.generate(
            input_ids=[ids],
            instruct_ids=[instruct_ids],
            languages=[language],
            non_streaming_mode=non_streaming,
            max_new_tokens=frames + 1,
            **GREEDY,
        )
    prompt, codes = ours.codes(None, text, language, instruct=description, non_streaming=non_streaming, frames=frames)
    return prompt, ref_codes[0].numpy(), codes


@pytest.mark.parametrize(
    ("language", "description"),
    [
        ("english", "A warm, low male voice, speaking slowly and calmly."),
        ("chinese", "一位年轻女性，声音明亮，语速稍快。"),
        ("auto", "A cheerful child with a high voice."),
        ("german", ""),
    ],  # no description: the model picks a voice, as the reference allows
)
@pytest.mark.parametrize("non_streaming", [True, False])
def test_voice_design_codes_match_reference(design_pair, language: str, description: str, non_streaming: bool) -> None:
    text = TEXTS.get(language, TEXTS["english"])
    prompt, ref_codes, codes = _design_both(design_pair, text, description, language, non_streaming=non_streaming)
    assert prompt.codec_context is None
    _assert_same(ref_codes, codes, at_least=6)


def test_voice_design_description_changes_the_voice(design_pair) -> None:
    _, ours = design_pair
    a = ours.codes(None, TEXTS["english"], "english", instruct="A deep old voice.", non_streaming=True, frames=12)[1]
    b = ours.codes(None, TEXTS["english"], "english", instruct="A bright young voice.", non_streaming=True, frames=12)[
        1
    ]
    assert not np.array_equal(a[: min(len(a), len(b))], b[: min(len(a), len(b))])
