"""Checkpoint loading: find or download a Qwen3-TTS checkpoint (CustomVoice, Base or VoiceDesign), check its files,
read config and tensors.

The weight names and shapes a checkpoint must hold are derived here from the config values (one place, used both to
validate a loaded checkpoint and by the random-checkpoint writer), so nothing at run time needs transformers.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..errors import ModelLoadError
from .config import (
    DEFAULT_MODEL,
    MODEL_TYPE_NAMES,
    CodecDecoderConfig,
    CodecEncoderConfig,
    ModelConfigError,
    Qwen3TTSConfig,
    SpeakerEncoderConfig,
)

_LOG = logging.getLogger(__name__)

# Only what the engine (and the reference, for parity runs) reads. README/.gitattributes and ModelScope stubs are
# skipped; speech_tokenizer/model.safetensors is needed whole because encoder and decoder share one file.
DOWNLOAD_PATTERNS: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "speech_tokenizer/config.json",
    "speech_tokenizer/preprocessor_config.json",
    "speech_tokenizer/model.safetensors",
)

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

# owner/name as Hugging Face allows it: one slash, no path tricks.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

Shapes = dict[str, tuple[int, ...]]


class CheckpointConfigError(ModelLoadError, ModelConfigError):
    """A config.json the engine cannot use; catchable both as a load error and as a config error."""


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch dtype from a dtype or one of the names 'float32', 'bfloat16', 'float16' (and fp32/bf16/fp16)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    try:
        return _DTYPES[str(dtype).lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None


# --------------------------------------------------------------------------------------------------------------
# Expected tensors, from the config geometry


def _block_shapes(prefix: str, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int) -> Shapes:
    """One Qwen3-style decoder layer: bias-free projections, per-head q/k RMSNorm, SwiGLU, two RMSNorms."""
    return {
        f"{prefix}.self_attn.q_proj.weight": (heads * head_dim, hidden),
        f"{prefix}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        f"{prefix}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        f"{prefix}.self_attn.o_proj.weight": (hidden, heads * head_dim),
        f"{prefix}.self_attn.q_norm.weight": (head_dim,),
        f"{prefix}.self_attn.k_norm.weight": (head_dim,),
        f"{prefix}.mlp.gate_proj.weight": (inter, hidden),
        f"{prefix}.mlp.up_proj.weight": (inter, hidden),
        f"{prefix}.mlp.down_proj.weight": (hidden, inter),
        f"{prefix}.input_layernorm.weight": (hidden,),
        f"{prefix}.post_attention_layernorm.weight": (hidden,),
    }


def talker_tensor_shapes(cfg: Qwen3TTSConfig) -> Shapes:
    """Every tensor of the root model.safetensors of a CustomVoice checkpoint (Talker + CodePredictor)."""
    t, cp = cfg.talker, cfg.code_predictor
    h = t.hidden_size
    out: Shapes = {}
    for i in range(t.num_hidden_layers):
        out |= _block_shapes(
            f"talker.model.layers.{i}", h, t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.intermediate_size
        )
    out["talker.model.norm.weight"] = (h,)
    out["talker.model.codec_embedding.weight"] = (t.vocab_size, h)
    out["talker.model.text_embedding.weight"] = (t.text_vocab_size, t.text_hidden_size)
    # text_projection: text_hidden -> text_hidden -> talker hidden, both with bias.
    out["talker.text_projection.linear_fc1.weight"] = (t.text_hidden_size, t.text_hidden_size)
    out["talker.text_projection.linear_fc1.bias"] = (t.text_hidden_size,)
    out["talker.text_projection.linear_fc2.weight"] = (h, t.text_hidden_size)
    out["talker.text_projection.linear_fc2.bias"] = (h,)
    out["talker.codec_head.weight"] = (t.vocab_size, h)
    ch = cp.hidden_size
    for i in range(cp.num_hidden_layers):
        out |= _block_shapes(
            f"talker.code_predictor.model.layers.{i}",
            ch,
            cp.num_attention_heads,
            cp.num_key_value_heads,
            cp.head_dim,
            cp.intermediate_size,
        )
    out["talker.code_predictor.model.norm.weight"] = (ch,)
    # The CP's residual-code tables are as wide as the Talker (their rows are summed into the Talker input);
    # one table and one head per residual group.
    for g in range(cp.num_code_groups - 1):
        out[f"talker.code_predictor.model.codec_embedding.{g}.weight"] = (cp.vocab_size, h)
    for g in range(cp.num_code_groups - 1):
        out[f"talker.code_predictor.lm_head.{g}.weight"] = (cp.vocab_size, ch)
    if cfg.has_mtp_projection:
        out["talker.code_predictor.small_to_mtp_projection.weight"] = (ch, h)
        out["talker.code_predictor.small_to_mtp_projection.bias"] = (ch,)
    return out


def speaker_encoder_tensor_shapes(cfg: SpeakerEncoderConfig) -> Shapes:
    """Every `speaker_encoder.*` tensor of a Base checkpoint's model.safetensors (ECAPA-TDNN, see speaker_encoder.py)."""
    out: Shapes = {}
    p = "speaker_encoder"
    ch, ks = cfg.enc_channels, cfg.enc_kernel_sizes

    def conv(name: str, cout: int, cin: int, k: int) -> None:
        out[f"{p}.{name}.weight"] = (cout, cin, k)
        out[f"{p}.{name}.bias"] = (cout,)

    conv("blocks.0.conv", ch[0], cfg.mel_dim, ks[0])
    for i in range(1, len(ch) - 1):
        width = ch[i] // cfg.enc_res2net_scale
        conv(f"blocks.{i}.tdnn1.conv", ch[i], ch[i - 1], 1)
        for j in range(cfg.enc_res2net_scale - 1):
            conv(f"blocks.{i}.res2net_block.blocks.{j}.conv", width, width, ks[i])
        conv(f"blocks.{i}.tdnn2.conv", ch[i], ch[i], 1)
        conv(f"blocks.{i}.se_block.conv1", cfg.enc_se_channels, ch[i], 1)
        conv(f"blocks.{i}.se_block.conv2", ch[i], cfg.enc_se_channels, 1)
    conv("mfa.conv", ch[-1], ch[-1], ks[-1])
    conv("asp.tdnn.conv", cfg.enc_attention_channels, 3 * ch[-1], 1)  # frames + their mean and std
    conv("asp.conv", ch[-1], cfg.enc_attention_channels, 1)
    conv("fc", cfg.enc_dim, 2 * ch[-1], 1)  # attentive mean and std -> x-vector
    return out


def model_tensor_shapes(cfg: Qwen3TTSConfig) -> Shapes:
    """Every tensor of the root model.safetensors: the Talker side, plus the speaker encoder of a Base model."""
    out = talker_tensor_shapes(cfg)
    if cfg.speaker_encoder is not None:
        out |= speaker_encoder_tensor_shapes(cfg.speaker_encoder)
    return out


def codec_encoder_tensor_shapes(cfg: CodecEncoderConfig) -> Shapes:
    """Every `encoder.*` tensor of speech_tokenizer/model.safetensors: a Mimi model without its decoder half.

    SEANet layer indices count the weightless ELUs too, as the module list they come from does.
    """
    out: Shapes = {}
    nf, hidden = cfg.num_filters, cfg.hidden_size
    p = "encoder.encoder.layers"

    def conv(name: str, cout: int, cin: int, k: int, bias: bool = True) -> None:
        out[f"{name}.conv.weight"] = (cout, cin, k)
        if bias:
            out[f"{name}.conv.bias"] = (cout,)

    conv(f"{p}.0", nf, cfg.audio_channels, cfg.kernel_size)
    idx, dim = 1, nf
    for ratio in reversed(cfg.upsampling_ratios):
        for _ in range(cfg.num_residual_layers):
            conv(f"{p}.{idx}.block.1", dim // cfg.compress, dim, cfg.residual_kernel_size)
            conv(f"{p}.{idx}.block.3", dim, dim // cfg.compress, 1)
            if cfg.use_conv_shortcut:
                conv(f"{p}.{idx}.shortcut", dim, dim, 1)
            idx += 1
        idx += 1  # ELU
        conv(f"{p}.{idx}", dim * 2, dim, ratio * 2)
        idx += 1
        dim *= 2
    idx += 1  # ELU
    conv(f"{p}.{idx}", hidden, dim, cfg.last_kernel_size)

    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    for i in range(cfg.num_hidden_layers):
        q = f"encoder.encoder_transformer.layers.{i}"
        for proj, shape in (("q", (qd, hidden)), ("k", (kvd, hidden)), ("v", (kvd, hidden)), ("o", (hidden, qd))):
            out[f"{q}.self_attn.{proj}_proj.weight"] = shape
            if cfg.attention_bias:
                out[f"{q}.self_attn.{proj}_proj.bias"] = (shape[0],)
        out[f"{q}.mlp.fc1.weight"] = (cfg.intermediate_size, hidden)
        out[f"{q}.mlp.fc2.weight"] = (hidden, cfg.intermediate_size)
        for norm in ("input_layernorm", "post_attention_layernorm"):  # LayerNorm: weight and bias
            out[f"{q}.{norm}.weight"] = (hidden,)
            out[f"{q}.{norm}.bias"] = (hidden,)
        out[f"{q}.self_attn_layer_scale.scale"] = (hidden,)
        out[f"{q}.mlp_layer_scale.scale"] = (hidden,)
    conv("encoder.downsample", hidden, hidden, cfg.downsample_kernel, bias=False)

    vq = cfg.vector_quantization_hidden_dimension
    for part, n in (
        ("semantic_residual_vector_quantizer", cfg.num_semantic_quantizers),
        ("acoustic_residual_vector_quantizer", cfg.num_quantizers - cfg.num_semantic_quantizers),
    ):
        q = f"encoder.quantizer.{part}"
        if vq != hidden:
            out[f"{q}.input_proj.weight"] = (vq, hidden, 1)
            out[f"{q}.output_proj.weight"] = (hidden, vq, 1)
        for i in range(n):
            out[f"{q}.layers.{i}.codebook.initialized"] = (1,)
            out[f"{q}.layers.{i}.codebook.cluster_usage"] = (cfg.codebook_size,)
            out[f"{q}.layers.{i}.codebook.embed_sum"] = (cfg.codebook_size, cfg.codebook_dim)
    return out


def codec_decoder_tensor_shapes(cfg: CodecDecoderConfig) -> Shapes:
    """Every `decoder.*` tensor of speech_tokenizer/model.safetensors for this decoder config."""
    out: Shapes = {}
    d = cfg.codebook_dim
    half = d // 2  # the RVQ codebooks are half as wide as codebook_dim
    # One semantic quantizer (hard-wired in the reference) plus the acoustic rest.
    for part, n in (("rvq_first", 1), ("rvq_rest", cfg.num_quantizers - 1)):
        p = f"decoder.quantizer.{part}"
        out[f"{p}.input_proj.weight"] = (half, d, 1)
        out[f"{p}.output_proj.weight"] = (d, half, 1)
        for i in range(n):
            out[f"{p}.vq.layers.{i}._codebook.cluster_usage"] = (cfg.codebook_size,)
            out[f"{p}.vq.layers.{i}._codebook.embedding_sum"] = (cfg.codebook_size, half)
    lat, hid = cfg.latent_dim, cfg.hidden_size
    out["decoder.pre_conv.conv.weight"] = (lat, d, 3)
    out["decoder.pre_conv.conv.bias"] = (lat,)
    pt = "decoder.pre_transformer"
    out[f"{pt}.input_proj.weight"] = (hid, lat)
    out[f"{pt}.input_proj.bias"] = (hid,)
    out[f"{pt}.output_proj.weight"] = (lat, hid)
    out[f"{pt}.output_proj.bias"] = (lat,)
    out[f"{pt}.norm.weight"] = (hid,)
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    for i in range(cfg.num_hidden_layers):
        p = f"{pt}.layers.{i}"
        out[f"{p}.self_attn.q_proj.weight"] = (qd, hid)
        out[f"{p}.self_attn.k_proj.weight"] = (kvd, hid)
        out[f"{p}.self_attn.v_proj.weight"] = (kvd, hid)
        out[f"{p}.self_attn.o_proj.weight"] = (hid, qd)
        out[f"{p}.mlp.gate_proj.weight"] = (cfg.intermediate_size, hid)
        out[f"{p}.mlp.up_proj.weight"] = (cfg.intermediate_size, hid)
        out[f"{p}.mlp.down_proj.weight"] = (hid, cfg.intermediate_size)
        out[f"{p}.input_layernorm.weight"] = (hid,)
        out[f"{p}.post_attention_layernorm.weight"] = (hid,)
        out[f"{p}.self_attn_layer_scale.scale"] = (hid,)
        out[f"{p}.mlp_layer_scale.scale"] = (hid,)
    for i, factor in enumerate(cfg.upsampling_ratios):
        p = f"decoder.upsample.{i}"
        # ConvTranspose1d weights are [in, out, kernel].
        out[f"{p}.0.conv.weight"] = (lat, lat, factor)
        out[f"{p}.0.conv.bias"] = (lat,)
        out[f"{p}.1.dwconv.conv.weight"] = (lat, 1, 7)  # depthwise
        out[f"{p}.1.dwconv.conv.bias"] = (lat,)
        out[f"{p}.1.norm.weight"] = (lat,)
        out[f"{p}.1.norm.bias"] = (lat,)
        out[f"{p}.1.pwconv1.weight"] = (4 * lat, lat)
        out[f"{p}.1.pwconv1.bias"] = (4 * lat,)
        out[f"{p}.1.pwconv2.weight"] = (lat, 4 * lat)
        out[f"{p}.1.pwconv2.bias"] = (lat,)
        out[f"{p}.1.gamma"] = (lat,)
    dd = cfg.decoder_dim
    out["decoder.decoder.0.conv.weight"] = (dd, lat, 7)
    out["decoder.decoder.0.conv.bias"] = (dd,)
    for i, rate in enumerate(cfg.upsample_rates):
        cin, cout = dd // 2**i, dd // 2 ** (i + 1)
        p = f"decoder.decoder.{i + 1}.block"
        out[f"{p}.0.alpha"] = (cin,)
        out[f"{p}.0.beta"] = (cin,)
        out[f"{p}.1.conv.weight"] = (cin, cout, 2 * rate)
        out[f"{p}.1.conv.bias"] = (cout,)
        for u in range(3):  # residual units with dilations 1, 3, 9
            q = f"{p}.{u + 2}"
            out[f"{q}.act1.alpha"] = (cout,)
            out[f"{q}.act1.beta"] = (cout,)
            out[f"{q}.conv1.conv.weight"] = (cout, cout, 7)
            out[f"{q}.conv1.conv.bias"] = (cout,)
            out[f"{q}.act2.alpha"] = (cout,)
            out[f"{q}.act2.beta"] = (cout,)
            out[f"{q}.conv2.conv.weight"] = (cout, cout, 1)
            out[f"{q}.conv2.conv.bias"] = (cout,)
    last = dd // 2 ** len(cfg.upsample_rates)
    n = len(cfg.upsample_rates)
    out[f"decoder.decoder.{n + 1}.alpha"] = (last,)
    out[f"decoder.decoder.{n + 1}.beta"] = (last,)
    out[f"decoder.decoder.{n + 2}.conv.weight"] = (1, last, 7)
    out[f"decoder.decoder.{n + 2}.conv.bias"] = (1,)
    return out


# --------------------------------------------------------------------------------------------------------------
# Finding the directory


def resolve_model_dir(model: str, data_dir: Path | None, *, local_files_only: bool = False) -> Path:
    """A local checkpoint directory as is, or a Hugging Face repo id downloaded (or found) under data_dir/models."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(f"model {model!r} is a file, not a checkpoint directory")
    if not _REPO_ID.match(model) or model.startswith((".", "~")):
        raise ModelLoadError(
            f"model {model!r} is neither an existing directory nor a Hugging Face repo id (owner/name), "
            f"for example {DEFAULT_MODEL!r}"
        )
    cache_dir = Path(data_dir).expanduser() / "models" if data_dir is not None else None
    # Imported here so that loading a local directory never touches the hub library.
    import huggingface_hub

    try:
        # HF's own progress bars stay on: a first download is several GB and people need to see it move.
        snapshot = huggingface_hub.snapshot_download(
            repo_id=model,
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            allow_patterns=list(DOWNLOAD_PATTERNS),
            local_files_only=local_files_only,
        )
    except Exception as err:  # the hub raises many types (HTTP, offline, missing repo, OS); all mean the same here
        where = str(cache_dir) if cache_dir is not None else "the Hugging Face cache"
        raise ModelLoadError(
            f"could not get model {model!r} into {where}: {type(err).__name__}: {str(err).strip().rstrip('.')}. "
            "Check the repo id and the network (and HF_HUB_OFFLINE / HF_TOKEN), or download the checkpoint on "
            "another machine and set the model to its local directory."
        ) from err
    return Path(snapshot)


def missing_files(model_dir: Path) -> list[str]:
    """The required checkpoint files that are absent, in a fixed order (empty when the layout is complete)."""
    d = Path(model_dir)
    missing = [
        name for name in ("config.json", "generation_config.json", "model.safetensors") if not (d / name).is_file()
    ]
    has_bpe = (d / "vocab.json").is_file() and (d / "merges.txt").is_file()
    if not has_bpe and not (d / "tokenizer.json").is_file():
        missing.append("vocab.json + merges.txt (or tokenizer.json)")
    missing += [
        name
        for name in ("speech_tokenizer/config.json", "speech_tokenizer/model.safetensors")
        if not (d / name).is_file()
    ]
    return missing


def check_layout(model_dir: Path) -> None:
    """Raise ModelLoadError naming every missing required file at once."""
    if not Path(model_dir).is_dir():
        raise ModelLoadError(f"model directory {model_dir} does not exist")
    missing = missing_files(model_dir)
    if missing:
        raise ModelLoadError(
            f"model directory {model_dir} is not a complete Qwen3-TTS checkpoint; missing: {', '.join(missing)}"
        )


# --------------------------------------------------------------------------------------------------------------
# Loading


@dataclass
class Checkpoint:
    """A loaded checkpoint: configs plus the tensors our torch modules consume.

    Base models also carry the two encoders that turn a reference clip into a clone prompt: the speaker encoder's
    tensors (as stored in model.safetensors) and the codec encoder's (float32, from speech_tokenizer/).
    """

    path: Path
    config: Qwen3TTSConfig
    codec_config: CodecDecoderConfig
    generation_config: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(repr=False)
    codec_tensors: dict[str, torch.Tensor] = field(repr=False)
    codec_encoder_config: CodecEncoderConfig | None = None
    speaker_encoder_tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    codec_encoder_tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.tensors.values())).dtype


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} should hold a JSON object")
    return data


def _first(names: Iterable[str], n: int = 5) -> str:
    names = sorted(names)
    more = f" (and {len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _load_tensors(
    file: Path,
    expected: Shapes,
    dtype: torch.dtype | None,
    device: torch.device,
    what: str,
) -> dict[str, torch.Tensor]:
    """Read exactly the expected tensors, one at a time so peak host memory stays near one tensor."""
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error type for a damaged header
        raise ModelLoadError(f"cannot open {file}: {err}") from err
    with handle as f:
        present = set(f.keys())
        missing = expected.keys() - present
        if missing:
            raise ModelLoadError(
                f"{file} does not fit its config: {len(missing)} {what} tensor(s) missing, e.g. {_first(missing)}"
            )
        prefixes = {k.split(".", 1)[0] + "." for k in expected}
        extra = {k for k in present - expected.keys() if k.startswith(tuple(prefixes))}
        if extra:
            # Harmless for inference (e.g. a fine-tune's leftovers), but worth a note when weights look odd.
            _LOG.warning("%s has %d unused %s tensor(s), e.g. %s", file, len(extra), what, _first(extra))
        out: dict[str, torch.Tensor] = {}
        for name, shape in expected.items():
            t = f.get_tensor(name)
            if tuple(t.shape) != shape:
                raise ModelLoadError(f"{file}: tensor {name} has shape {tuple(t.shape)}, the config implies {shape}")
            out[name] = t.to(device=device, dtype=dtype if dtype is not None else t.dtype)
    return out


def load_checkpoint(
    model: str | Path,
    data_dir: Path | None = None,
    dtype: torch.dtype | str = torch.bfloat16,
    device: torch.device | str = "cpu",
    *,
    local_files_only: bool = False,
    model_types: Iterable[str] = ("custom_voice",),
    clone_encoders: bool = True,
) -> Checkpoint:
    """Resolve, check and load a checkpoint; see Checkpoint for what is returned.

    model_types: the tts_model_types the caller can serve ("custom_voice", "base", "voice_design"); any other is a
    clear error before a tensor is read. clone_encoders: for a Base model, also load the speaker encoder and the
    codec encoder (needed to build clone prompts, not to speak from cached ones).
    """
    torch_dtype = resolve_dtype(dtype)
    dev = torch.device(device)
    accepted = tuple(model_types)
    path = resolve_model_dir(str(model), data_dir, local_files_only=local_files_only)
    check_layout(path)
    raw_config = _read_json(path / "config.json")
    model_type = raw_config.get("tts_model_type")
    # Refused before the rest of the config is judged: a model of another type is the error to report.
    if model_type in MODEL_TYPE_NAMES and model_type not in accepted:
        wanted = " or ".join(MODEL_TYPE_NAMES.get(t, t) for t in accepted)
        raise CheckpointConfigError(
            f"{path}: not a {wanted} model: config.json says tts_model_type={model_type!r} "
            f"(a {MODEL_TYPE_NAMES[model_type]} model), which is not accepted here"
        )
    try:
        config = Qwen3TTSConfig.from_dict(raw_config)
        codec_json = _read_json(path / "speech_tokenizer" / "config.json")
        codec_config = CodecDecoderConfig.from_dict(codec_json)
        wants_encoders = clone_encoders and config.tts_model_type == "base"
        codec_encoder_config = CodecEncoderConfig.from_dict(codec_json) if wants_encoders else None
    except ModelConfigError as err:
        raise CheckpointConfigError(f"{path}: {err}") from err
    generation_config = _read_json(path / "generation_config.json")
    tensors = _load_tensors(path / "model.safetensors", talker_tensor_shapes(config), torch_dtype, dev, "talker")
    # The codec keeps its stored float32; the codec module decides what precision it runs in.
    codec_tensors = _load_tensors(
        path / "speech_tokenizer" / "model.safetensors",
        codec_decoder_tensor_shapes(codec_config),
        None,
        dev,
        "codec decoder",
    )
    speaker_encoder_tensors: dict[str, torch.Tensor] = {}
    codec_encoder_tensors: dict[str, torch.Tensor] = {}
    if codec_encoder_config is not None and config.speaker_encoder is not None:
        # As stored: the encoders run once per voice, in float32 (speaker_encoder.py, codec_encoder.py).
        speaker_encoder_tensors = _load_tensors(
            path / "model.safetensors",
            speaker_encoder_tensor_shapes(config.speaker_encoder),
            None,
            dev,
            "speaker encoder",
        )
        codec_encoder_tensors = _load_tensors(
            path / "speech_tokenizer" / "model.safetensors",
            codec_encoder_tensor_shapes(codec_encoder_config),
            None,
            dev,
            "codec encoder",
        )
    _LOG.info(
        "loaded %s (%s %s, %d talker tensors as %s, %d codec tensors%s) on %s",
        path,
        config.model_type_name,
        config.tts_model_size,
        len(tensors),
        torch_dtype,
        len(codec_tensors),
        f", {len(speaker_encoder_tensors) + len(codec_encoder_tensors)} clone-encoder tensors"
        if codec_encoder_tensors
        else "",
        dev,
    )
    return Checkpoint(
        path=path,
        config=config,
        codec_config=codec_config,
        generation_config=generation_config,
        tensors=tensors,
        codec_tensors=codec_tensors,
        codec_encoder_config=codec_encoder_config,
        speaker_encoder_tensors=speaker_encoder_tensors,
        codec_encoder_tensors=codec_encoder_tensors,
    )
