"""The random-checkpoint writer: release layout of all three model types (CustomVoice, Base, VoiceDesign), exact
tensor sets (checked against the reference's own modules), §8.1 byte totals, seeded determinism, and loadability in
the reference oracle."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from wyoming_qwen3tts.model.config import CodecDecoderConfig, Qwen3TTSConfig
from wyoming_qwen3tts.tools import random_checkpoint as rc

FIXTURES = ["tiny_checkpoint", "tiny_checkpoint_06b"]
# (fixture, tts_model_type, tts_model_size) of every tiny checkpoint the tests write.
ALL_FIXTURES = [
    ("tiny_checkpoint", "custom_voice", "1b7"),
    ("tiny_checkpoint_06b", "custom_voice", "0b6"),
    ("tiny_base_checkpoint", "base", "1b7"),
    ("tiny_base_checkpoint_06b", "base", "0b6"),
    ("tiny_voice_design_checkpoint", "voice_design", "1b7"),
]
SIZE_TYPES = [(size, t) for t in rc.MODEL_TYPES for size in rc.SIZES_OF_TYPE[t]]


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), framework="pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def _reference() -> Any:
    pytest.importorskip("qwen_tts")
    import qwen_tts.core.models.modeling_qwen3_tts as m

    return m


def _reference_shapes(
    size: str, model_type: str = "custom_voice"
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """State-dict shapes of the reference's model and codec built (on the meta device) from our config dicts."""
    m = _reference()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig as RefConfig
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    cfg = RefConfig(**rc.model_config_dict(size, model_type))
    ccfg = Qwen3TTSTokenizerV2Config(**rc.codec_config_dict(size))
    cfg._attn_implementation = ccfg._attn_implementation = "eager"
    with torch.device("meta"):
        model = m.Qwen3TTSForConditionalGeneration(cfg)
        codec = Qwen3TTSTokenizerV2Model(ccfg)
    return (
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
        {k: tuple(v.shape) for k, v in codec.state_dict().items()},
    )


@pytest.mark.parametrize(("size", "model_type"), SIZE_TYPES)
def test_tensor_lists_equal_the_reference_modules(size: str, model_type: str) -> None:
    ref_model, ref_codec = _reference_shapes(size, model_type)
    ours_model = rc.model_tensor_shapes(rc.model_config_dict(size, model_type))
    assert any(k.startswith("speaker_encoder.") for k in ours_model) == (model_type == "base")
    ours_codec = rc.codec_tensor_shapes(rc.codec_config_dict(size))
    assert ours_model == ref_model
    assert ours_codec == ref_codec


@pytest.mark.parametrize(
    ("size", "count", "payload"),
    [("1.7b", 404, 3_833_352_704), ("0.6b", 402, 1_811_577_344)],
)
def test_full_size_layouts_have_the_section_8_1_totals(size: str, count: int, payload: int) -> None:
    shapes = rc.model_tensor_shapes(rc.model_config_dict(size))
    assert len(shapes) == count
    assert rc.tensor_bytes(shapes, torch.bfloat16) == payload
    assert ("talker.code_predictor.small_to_mtp_projection.weight" in shapes) == (size == "1.7b")
    # §8.1 rows that are easy to get wrong: text_projection and the per-table CP embedding widths.
    fc = [s for k, s in shapes.items() if k.startswith("talker.text_projection.")]
    assert sum(math.prod(s) for s in fc) * 2 == (16_785_408 if size == "1.7b" else 12_589_056)


@pytest.mark.parametrize(
    ("size", "count", "payload", "encoder_params"),
    # §1.3/§8.1: Base adds the ECAPA-TDNN speaker encoder, 12.0 M parameters at 1.7B and 8.85 M at 0.6B; the 0.6B
    # file then holds 1.829 GB, which is what HF lists for Qwen3-TTS-12Hz-0.6B-Base.
    [
        ("1.7b", 404 + 76, 3_833_352_704 + 2 * 12_001_088, 12_001_088),
        ("0.6b", 402 + 76, 1_811_577_344 + 2 * 8_854_336, 8_854_336),
    ],
)
def test_full_size_base_layouts_add_the_speaker_encoder(
    size: str, count: int, payload: int, encoder_params: int
) -> None:
    shapes = rc.model_tensor_shapes(rc.model_config_dict(size, "base"))
    assert len(shapes) == count
    assert rc.tensor_bytes(shapes, torch.bfloat16) == payload
    assert sum(math.prod(s) for k, s in shapes.items() if k.startswith("speaker_encoder.")) == encoder_params
    cfg = Qwen3TTSConfig.from_dict(rc.model_config_dict(size, "base"))
    assert cfg.speaker_encoder is not None and cfg.speaker_encoder.enc_dim == cfg.talker.hidden_size
    assert cfg.speakers == [] and not cfg.supports_instruct
    assert "dialect" not in " ".join(cfg.talker.codec_language_id) and len(cfg.languages) == 11


def test_voice_design_is_written_at_1_7b_only() -> None:
    cfg = Qwen3TTSConfig.from_dict(rc.model_config_dict("1.7b", "voice_design"))
    assert cfg.tts_model_type == "voice_design" and cfg.speaker_encoder is None and cfg.supports_instruct
    assert rc.model_tensor_shapes(rc.model_config_dict("1.7b", "voice_design")) == rc.model_tensor_shapes(
        rc.model_config_dict("1.7b")
    )  # same Talker/CodePredictor shapes as CustomVoice
    with pytest.raises(ValueError, match="no VoiceDesign model of size '0.6b'"):
        rc.model_config_dict("0.6b", "voice_design")
    with pytest.raises(ValueError, match="unknown model type"):
        rc.model_config_dict("tiny", "custom")


def test_full_codec_has_the_release_parameter_counts() -> None:
    codec = rc.codec_config_dict("1.7b")
    dec = rc.codec_tensor_shapes(codec)
    n_dec = sum(math.prod(s) for k, s in dec.items() if k.startswith("decoder."))
    n_enc = sum(math.prod(s) for k, s in dec.items() if k.startswith("encoder."))
    # §6.3: 114.32 M decoder, 56.23 M encoder; together 682.2 MB of float32 as HF lists.
    assert round(n_dec / 1e4) == 11432
    assert round(n_enc / 1e4) == 5623
    assert round(rc.tensor_bytes(dec, torch.float32) / 1e5) == 6822


def test_full_size_configs_parse_with_the_release_values() -> None:
    big = Qwen3TTSConfig.from_dict(rc.model_config_dict("1.7b"))
    small = Qwen3TTSConfig.from_dict(rc.model_config_dict("0.6b"))
    assert (big.talker.hidden_size, big.talker.intermediate_size, big.talker.num_hidden_layers) == (2048, 6144, 28)
    assert (small.talker.hidden_size, small.talker.intermediate_size) == (1024, 3072)
    assert big.tts_model_size == "1b7" and small.tts_model_size == "0b6"
    assert big.has_mtp_projection and not small.has_mtp_projection
    cp = big.code_predictor
    assert (cp.hidden_size, cp.num_hidden_layers, cp.num_attention_heads, cp.num_key_value_heads) == (1024, 5, 16, 8)
    codec = CodecDecoderConfig.from_dict(rc.codec_config_dict("1.7b"))
    assert codec.samples_per_frame == 1920 and codec.decoder_dim == 1536 and codec.codebook_dim == 512


@pytest.mark.parametrize("fixture", FIXTURES)
def test_written_files_follow_the_release_layout(fixture: str, request: pytest.FixtureRequest) -> None:
    ckpt: Path = request.getfixturevalue(fixture)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_tts" and cfg["tts_model_type"] == "custom_voice"
    assert cfg["transformers_version"] == "4.57.2"  # keeps the reference on Qwen's tokenizer regex (§7.1)
    assert cfg["tts_model_size"] == ("1b7" if fixture == "tiny_checkpoint" else "0b6")
    t = cfg["talker_config"]
    assert len(t["spk_id"]) == 9 and set(t["spk_is_dialect"]) == set(t["spk_id"])
    assert t["codec_language_id"]["sichuan_dialect"] == 2062 and t["codec_language_id"]["beijing_dialect"] == 2074
    assert t["rope_scaling"]["interleaved"] is True
    assert sum(t["rope_scaling"]["mrope_section"]) == t["head_dim"] // 2
    assert t["num_code_groups"] == 16 and t["code_predictor_config"]["num_code_groups"] == 16
    gen = ckpt / "generation_config.json"
    assert gen.stat().st_size == 245 and json.loads(gen.read_text())["max_new_tokens"] == 8192
    assert json.loads((ckpt / "preprocessor_config.json").read_text())["processor_class"] == "Qwen3TTSProcessor"
    assert (ckpt / "speech_tokenizer" / "preprocessor_config.json").stat().st_size == 234
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (ckpt / name).is_file(), name

    model = _file_shapes(ckpt / "model.safetensors")
    assert model == rc.model_tensor_shapes(cfg)
    codec = _file_shapes(ckpt / "speech_tokenizer" / "model.safetensors")
    assert codec == rc.codec_tensor_shapes(json.loads((ckpt / "speech_tokenizer" / "config.json").read_text()))
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("talker.codec_head.weight").dtype == torch.float32
        norm = f.get_tensor("talker.model.norm.weight")
        assert 0.5 <= float(norm.min()) and float(norm.max()) <= 1.5 and float(norm.std()) > 0.1  # not all ones


@pytest.mark.parametrize(("fixture", "model_type", "size"), ALL_FIXTURES[2:])
def test_base_and_voice_design_files_follow_the_release_layout(
    fixture: str, model_type: str, size: str, request: pytest.FixtureRequest
) -> None:
    ckpt: Path = request.getfixturevalue(fixture)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["tts_model_type"] == model_type and cfg["tts_model_size"] == size
    t = cfg["talker_config"]
    assert t["spk_id"] == {} and t["spk_is_dialect"] == {}
    assert set(t["codec_language_id"]) == set(rc.PLAIN_LANGUAGES)
    assert ("speaker_encoder_config" in cfg) == (model_type == "base")
    model = _file_shapes(ckpt / "model.safetensors")
    assert model == rc.model_tensor_shapes(cfg)
    assert any(k.startswith("speaker_encoder.") for k in model) == (model_type == "base")
    codec = _file_shapes(ckpt / "speech_tokenizer" / "model.safetensors")
    assert codec == rc.codec_tensor_shapes(json.loads((ckpt / "speech_tokenizer" / "config.json").read_text()))


def test_same_seed_same_bytes_other_seed_other_values(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # Through the CLI, so the command line is exercised too.
    assert rc.main(["--size", "tiny", "--out", str(tmp_path / "again"), "--seed", "0"]) == 0
    for rel in ("model.safetensors", "speech_tokenizer/model.safetensors", "config.json"):
        assert (tmp_path / "again" / rel).read_bytes() == (tiny_checkpoint / rel).read_bytes(), rel
    name, shape = "talker.codec_head.weight", (3072, 64)
    kw: dict[str, Any] = dict(tiny=True, dtype=torch.float32, device=torch.device("cpu"))
    a = rc.random_tensor(name, shape, seed=0, **kw)
    b = rc.random_tensor(name, shape, seed=1, **kw)
    assert not torch.equal(a, b)


def test_full_size_init_follows_the_timing_recipe() -> None:
    kw: dict[str, Any] = dict(seed=3, tiny=False, dtype=torch.bfloat16, device=torch.device("cpu"))
    norm = rc.random_tensor("talker.model.layers.0.input_layernorm.weight", (2048,), **kw)
    assert torch.all(norm == 1)
    bias = rc.random_tensor("talker.text_projection.linear_fc1.bias", (2048,), **kw)
    assert torch.all(bias == 0)
    w = rc.random_tensor("talker.model.layers.0.self_attn.q_proj.weight", (256, 512), **kw).float()
    assert abs(float(w.std()) - 0.02) < 0.001 and abs(float(w.mean())) < 0.001
    assert torch.all(rc.random_tensor("decoder.decoder.1.block.0.alpha", (1536,), **kw) == 0)
    assert torch.all(rc.random_tensor("decoder.pre_transformer.layers.0.mlp_layer_scale.scale", (512,), **kw) == 1)


def test_streaming_writer_rejects_a_tensor_that_does_not_match_its_header(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="header says"):
        rc.write_safetensors_streaming(
            tmp_path / "x.safetensors", {"a": (2, 3)}, lambda n, s: torch.zeros(3, 2), torch.float32
        )
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize(("fixture", "model_type", "size"), ALL_FIXTURES)
def test_reference_loads_tiny_checkpoint_without_missing_or_unexpected_keys(
    fixture: str, model_type: str, size: str, request: pytest.FixtureRequest
) -> None:
    ckpt: Path = request.getfixturevalue(fixture)
    m = _reference()
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    from transformers import PreTrainedModel

    # The reference's own from_pretrained also loads the codec and forwards output_loading_info to it (which then
    # breaks), so the talker goes through the plain HF loader, as the reference does internally.
    model, info = PreTrainedModel.from_pretrained.__func__(  # type: ignore[attr-defined]
        m.Qwen3TTSForConditionalGeneration,
        str(ckpt),
        dtype=torch.float32,
        attn_implementation="eager",
        output_loading_info=True,
    )
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [] and info["mismatched_keys"] == []
    assert (model.tts_model_type, model.tts_model_size) == (model_type, size)
    assert (model.speaker_encoder is not None) == (model_type == "base")
    codec, cinfo = Qwen3TTSTokenizerV2Model.from_pretrained(
        str(ckpt / "speech_tokenizer"), dtype=torch.float32, output_loading_info=True
    )
    assert cinfo["missing_keys"] == [] and cinfo["unexpected_keys"] == [] and cinfo["mismatched_keys"] == []
    # The values that arrived are the ones in the file (no silent re-initialisation).
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        sd = model.state_dict()
        keys = ["talker.model.norm.weight", "talker.code_predictor.lm_head.3.weight"]
        if model_type == "base":
            keys += ["speaker_encoder.fc.weight", "speaker_encoder.blocks.2.res2net_block.blocks.1.conv.bias"]
        for key in keys:
            assert torch.equal(sd[key], f.get_tensor(key)), key
    with safe_open(str(ckpt / "speech_tokenizer" / "model.safetensors"), framework="pt") as f:
        csd = codec.state_dict()
        for key in (
            "decoder.decoder.1.block.0.alpha",
            "encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum",
        ):
            assert torch.equal(csd[key], f.get_tensor(key)), key


def test_reference_wrapper_speaks_from_the_tiny_checkpoint(tiny_checkpoint: Path) -> None:
    _reference()
    from qwen_tts import Qwen3TTSModel

    tts = Qwen3TTSModel.from_pretrained(str(tiny_checkpoint), dtype=torch.float32, attn_implementation="eager")
    assert set(tts.get_supported_speakers()) == set(rc.SPEAKERS)
    torch.manual_seed(0)
    wavs, sr = tts.generate_custom_voice(
        "Hello there.",
        speaker="Vivian",
        language="English",
        do_sample=False,
        subtalker_dosample=False,
        max_new_tokens=6,
    )
    wav = torch.from_numpy(wavs[0])
    assert sr == 24000
    assert wav.numel() > 0 and wav.numel() % 1920 == 0
    assert torch.isfinite(wav).all()
    # Non-degenerate: audible, yet mostly inside the codec's [-1, 1] clamp.
    assert 0.01 < float(wav.std()) < 0.5
    assert float((wav.abs() >= 1).float().mean()) < 0.01
