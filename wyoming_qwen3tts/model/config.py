"""Model configuration: the fields of a Qwen3-TTS checkpoint's config.json files we use, as dataclasses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ModelConfigError(ValueError):
    """The checkpoint's configuration cannot be used by this engine."""


@dataclass(frozen=True)
class TransformerConfig:
    """Geometry shared by the Talker and the CodePredictor (Qwen3-style decoder blocks)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int


@dataclass(frozen=True)
class TalkerConfig(TransformerConfig):
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_token_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    spk_id: dict[str, int]
    spk_is_dialect: dict[str, str | bool]
    codec_language_id: dict[str, int]


@dataclass(frozen=True)
class CodePredictorConfig(TransformerConfig):
    num_code_groups: int


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """The root config.json of a Qwen3-TTS model checkpoint."""

    tts_model_type: str
    tts_model_size: str
    talker: TalkerConfig
    code_predictor: CodePredictorConfig
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    assistant_token_id: int = 77091
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def speakers(self) -> list[str]:
        return list(self.talker.spk_id)

    @property
    def languages(self) -> list[str]:
        """Languages a request may name: 'auto' plus every non-dialect language id."""
        return ["auto"] + [k for k in self.talker.codec_language_id if "dialect" not in k]

    @property
    def supports_instruct(self) -> bool:
        # The reference wrapper drops instruct on 0.6B CustomVoice.
        return self.tts_model_size != "0b6"

    @property
    def has_mtp_projection(self) -> bool:
        return self.talker.hidden_size != self.code_predictor.hidden_size

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Qwen3TTSConfig":
        model_type = d.get("tts_model_type")
        if model_type != "custom_voice":
            raise ModelConfigError(
                f"not a CustomVoice model: config.json says tts_model_type={model_type!r}; "
                "this server needs a Qwen3-TTS-12Hz-*-CustomVoice checkpoint "
                "(Base and VoiceDesign models are not supported)"
            )
        if d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ModelConfigError(f"unsupported speech tokenizer {d.get('tokenizer_type')!r}; need the 12 Hz codec")
        try:
            t = d["talker_config"]
            cp = t["code_predictor_config"]
            talker = TalkerConfig(
                **_transformer_fields(t),
                text_vocab_size=t["text_vocab_size"],
                text_hidden_size=t["text_hidden_size"],
                num_code_groups=t["num_code_groups"],
                codec_pad_id=t["codec_pad_id"],
                codec_bos_id=t["codec_bos_id"],
                codec_eos_token_id=t["codec_eos_token_id"],
                codec_think_id=t["codec_think_id"],
                codec_nothink_id=t["codec_nothink_id"],
                codec_think_bos_id=t["codec_think_bos_id"],
                codec_think_eos_id=t["codec_think_eos_id"],
                spk_id={k.lower(): _one_id(v) for k, v in (t.get("spk_id") or {}).items()},
                spk_is_dialect={k.lower(): v for k, v in (t.get("spk_is_dialect") or {}).items()},
                codec_language_id={k.lower(): int(v) for k, v in (t.get("codec_language_id") or {}).items()},
            )
            code_predictor = CodePredictorConfig(
                **_transformer_fields(cp),
                num_code_groups=cp.get("num_code_groups", t["num_code_groups"]),
            )
        except KeyError as err:
            raise ModelConfigError(f"config.json is missing the field {err.args[0]!r}") from None
        if not talker.spk_id:
            raise ModelConfigError("not a CustomVoice model: config.json lists no speakers (talker_config.spk_id)")
        if talker.num_code_groups != 16:
            raise ModelConfigError(f"expected 16 code groups, config.json says {talker.num_code_groups}")
        top = {
            k: d[k]
            for k in (
                "im_start_token_id",
                "im_end_token_id",
                "tts_pad_token_id",
                "tts_bos_token_id",
                "tts_eos_token_id",
            )
            if k in d
        }
        return cls(
            tts_model_type=model_type,
            tts_model_size=d.get("tts_model_size") or ("1b7" if talker.hidden_size >= 2048 else "0b6"),
            talker=talker,
            code_predictor=code_predictor,
            raw=d,
            **top,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "Qwen3TTSConfig":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def _transformer_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The TransformerConfig fields of a talker_config or code_predictor_config dict."""
    return dict(
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d["num_key_value_heads"],
        head_dim=d.get("head_dim", d["hidden_size"] // d["num_attention_heads"]),
        rms_norm_eps=d.get("rms_norm_eps", 1e-6),
        rope_theta=d.get("rope_theta", 10000.0),
        vocab_size=d["vocab_size"],
    )


def _one_id(v: Any) -> int:
    # Copies of the release store a speaker id as a bare int or a one-element list.
    if isinstance(v, (list, tuple)):
        if len(v) != 1:
            raise ModelConfigError(f"speaker id {v!r} should be one integer")
        v = v[0]
    return int(v)


@dataclass(frozen=True)
class CodecDecoderConfig:
    """speech_tokenizer/config.json -> decoder_config (the 12 Hz codec's decoder)."""

    codebook_size: int
    codebook_dim: int
    hidden_size: int
    latent_dim: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int
    num_quantizers: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    decoder_dim: int
    sample_rate: int = 24000

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in (*self.upsampling_ratios, *self.upsample_rates):
            n *= r
        return n

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CodecDecoderConfig":
        if d.get("model_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ModelConfigError(f"speech_tokenizer is {d.get('model_type')!r}, not the 12 Hz codec")
        try:
            dc = d["decoder_config"]
            hidden = dc["hidden_size"]
            heads = dc["num_attention_heads"]
            return cls(
                codebook_size=dc.get("codebook_size", 2048),
                codebook_dim=dc.get("codebook_dim", 512),
                hidden_size=hidden,
                latent_dim=dc["latent_dim"],
                intermediate_size=dc["intermediate_size"],
                num_hidden_layers=dc["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=dc.get("num_key_value_heads", heads),
                head_dim=dc.get("head_dim", hidden // heads),
                rms_norm_eps=dc.get("rms_norm_eps", 1e-5),
                rope_theta=dc.get("rope_theta", 10000.0),
                sliding_window=dc.get("sliding_window", 72),
                num_quantizers=dc.get("num_quantizers", 16),
                upsample_rates=tuple(dc.get("upsample_rates", (8, 5, 4, 3))),
                upsampling_ratios=tuple(dc.get("upsampling_ratios", (2, 2))),
                decoder_dim=dc["decoder_dim"],
                sample_rate=d.get("output_sample_rate", 24000),
            )
        except KeyError as err:
            raise ModelConfigError(f"speech_tokenizer/config.json is missing the field {err.args[0]!r}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "CodecDecoderConfig":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
