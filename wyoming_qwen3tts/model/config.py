"""Model configuration: the fields of a Qwen3-TTS checkpoint's config.json files we use, as dataclasses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any


class ModelConfigError(ValueError):
    """The checkpoint's configuration cannot be used by this engine."""


# tts_model_type -> the name the release uses for it (Qwen/Qwen3-TTS-12Hz-1.7B-<name>).
# The checkpoint served when none is configured.
DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"

MODEL_TYPE_NAMES: dict[str, str] = {"custom_voice": "CustomVoice", "base": "Base", "voice_design": "VoiceDesign"}


def voice_kind(*, cloned: bool, speaker: bool) -> str:
    """The model type (tts_model_type) that speaks a voice: a cloned voice a Base model, a preset speaker a
    CustomVoice model, a voice described in words (neither) a VoiceDesign model."""
    if cloned:
        return "base"
    return "custom_voice" if speaker else "voice_design"


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
class SpeakerEncoderConfig:
    """config.json -> speaker_encoder_config (Base models): the ECAPA-TDNN that turns a clip into an x-vector.

    The release writes only enc_dim and sample_rate; the rest are the reference's class defaults.
    """

    enc_dim: int = 1024
    mel_dim: int = 128
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        cfg = cls(**_known_fields(cls, d))
        n = len(cfg.enc_channels)
        if n < 3 or len(cfg.enc_kernel_sizes) != n or len(cfg.enc_dilations) != n:
            raise ModelConfigError(
                "speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations "
                "need the same length (at least 3)"
            )
        if any(c % cfg.enc_res2net_scale for c in cfg.enc_channels[1:-1]):
            raise ModelConfigError("speaker_encoder_config: the SE-Res2Net channels must divide by enc_res2net_scale")
        return cfg


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """The root config.json of a Qwen3-TTS model checkpoint (CustomVoice, Base or VoiceDesign)."""

    tts_model_type: str
    tts_model_size: str
    talker: TalkerConfig
    code_predictor: CodePredictorConfig
    speaker_encoder: SpeakerEncoderConfig | None = None  # Base models only
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
    def model_type_name(self) -> str:
        return MODEL_TYPE_NAMES[self.tts_model_type]

    @property
    def supports_instruct(self) -> bool:
        # The reference wrapper drops instruct on 0.6B CustomVoice and has no instruct for voice cloning;
        # for VoiceDesign the instruct is the voice description.
        if self.tts_model_type == "custom_voice":
            return self.tts_model_size != "0b6"
        return self.tts_model_type == "voice_design"

    @property
    def has_mtp_projection(self) -> bool:
        return self.talker.hidden_size != self.code_predictor.hidden_size

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Qwen3TTSConfig:
        model_type = d.get("tts_model_type")
        if model_type not in MODEL_TYPE_NAMES:
            raise ModelConfigError(
                f"unknown model type: config.json says tts_model_type={model_type!r}; expected one of "
                f"{', '.join(map(repr, MODEL_TYPE_NAMES))} (a Qwen3-TTS-12Hz CustomVoice, Base or VoiceDesign checkpoint)"
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
            speaker_encoder = (
                SpeakerEncoderConfig.from_dict(d.get("speaker_encoder_config") or {}) if model_type == "base" else None
            )
        except KeyError as err:
            raise ModelConfigError(f"config.json is missing the field {err.args[0]!r}") from None
        if model_type == "custom_voice" and not talker.spk_id:
            raise ModelConfigError("not a CustomVoice model: config.json lists no speakers (talker_config.spk_id)")
        if speaker_encoder is not None and speaker_encoder.enc_dim != talker.hidden_size:
            # The x-vector takes the speaker's place in the Talker's input, so it must be as wide.
            raise ModelConfigError(
                f"speaker_encoder_config.enc_dim is {speaker_encoder.enc_dim}, "
                f"the Talker's hidden size is {talker.hidden_size}; they must be equal"
            )
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
            speaker_encoder=speaker_encoder,
            raw=d,
            **top,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Qwen3TTSConfig:
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
    def from_dict(cls, d: dict[str, Any]) -> CodecDecoderConfig:
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
    def from_file(cls, path: str | Path) -> CodecDecoderConfig:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


@dataclass(frozen=True)
class CodecEncoderConfig:
    """speech_tokenizer/config.json -> encoder_config (a Mimi encoder) plus the encoder fields of the top level.

    Only what voice cloning needs: audio at 24 kHz -> causal SEANet convs -> a transformer -> a strided conv -> the
    first `valid_quantizers` codebooks of a split residual quantizer. Fields named as in encoder_config default to
    Mimi's values, for a config.json that omits them.
    """

    hidden_size: int = 512
    num_filters: int = 64
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)  # applied in reverse order by the encoder
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    intermediate_size: int = 2048
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    audio_channels: int = 1
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    num_residual_layers: int = 1
    compress: int = 2
    use_conv_shortcut: bool = False
    attention_bias: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sampling_rate: int = 24000
    # Not in encoder_config: the codebooks kept per frame (top-level encoder_valid_num_quantizers), and the final
    # conv that halves the frame rate (25 -> 12.5 Hz), whose kernel follows from the two rates.
    valid_quantizers: int = 16
    downsample_stride: int = 2
    downsample_kernel: int = 4

    @property
    def samples_per_frame(self) -> int:
        n = self.downsample_stride
        for r in self.upsampling_ratios:
            n *= r
        return n

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodecEncoderConfig:
        e = d.get("encoder_config")
        if not isinstance(e, dict):
            raise ModelConfigError("speech_tokenizer/config.json is missing the field 'encoder_config'")
        derived = {"valid_quantizers", "downsample_stride", "downsample_kernel"}
        cfg = cls(**{k: v for k, v in _known_fields(cls, e).items() if k not in derived and v is not None})
        hop = 1
        for r in cfg.upsampling_ratios:
            hop *= r
        # Mimi: the SEANet runs at ceil(rate / hop) frames/s and a stride-2 conv (kernel 2 * ratio) brings that to
        # frame_rate; the reference always builds that conv from these two rates.
        seanet_rate = -(-cfg.sampling_rate // hop)
        frame_rate = e.get("_frame_rate") or e.get("frame_rate") or cfg.sampling_rate / (hop * 2)
        if seanet_rate == frame_rate:
            raise ModelConfigError("speech_tokenizer encoder_config has no downsampling stage; not the 12 Hz codec")
        cfg = replace(
            cfg,
            head_dim=cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads,
            valid_quantizers=d.get("encoder_valid_num_quantizers", 16),
            downsample_kernel=2 * int(seanet_rate / frame_rate),
        )
        # What the encoder implementation assumes; the release has all of these.
        unsupported = {
            "use_causal_conv": (e.get("use_causal_conv", True), True),
            "pad_mode": (e.get("pad_mode", "constant"), "constant"),
            "hidden_act": (e.get("hidden_act", "gelu"), "gelu"),
            "audio_channels": (cfg.audio_channels, 1),
            "trim_right_ratio": (e.get("trim_right_ratio", 1.0), 1.0),
        }
        for name, (value, wanted) in unsupported.items():
            if value != wanted:
                raise ModelConfigError(
                    f"speech_tokenizer encoder_config.{name} is {value!r}; only {wanted!r} is supported"
                )
        if not cfg.num_semantic_quantizers < cfg.valid_quantizers <= cfg.num_quantizers:
            raise ModelConfigError(
                f"speech_tokenizer: encoder_valid_num_quantizers {cfg.valid_quantizers} does not fit "
                f"{cfg.num_quantizers} quantizers ({cfg.num_semantic_quantizers} semantic)"
            )
        return cfg


def _known_fields(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """The entries of a config.json dict that name fields of the dataclass cls (JSON lists become tuples)."""
    names = {f.name for f in fields(cls)}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
