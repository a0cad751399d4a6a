"""Write a random-weight Qwen3-TTS checkpoint (CustomVoice, Base or VoiceDesign) in the real release layout (tiny
sizes for tests, full sizes for timing on a GPU box).

    python -m wyoming_qwen3tts.tools.random_checkpoint --size tiny|tiny-0.6b|0.6b|1.7b --out DIR [--seed N]
        [--type custom_voice|base|voice_design] [--dtype bfloat16|float32] [--device cpu|cuda]

Weight names and shapes come from our own derivation of the config (model.checkpoint), not from transformers, so the
writer runs anywhere torch and safetensors do. Tensors are generated and written one at a time straight into the
safetensors file, so a 3.8 GB checkpoint needs about one tensor of RAM.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import struct
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..model import checkpoint
from ..model.checkpoint import resolve_dtype
from ..model.config import MODEL_TYPE_NAMES, CodecDecoderConfig, CodecEncoderConfig, Qwen3TTSConfig

_LOG = logging.getLogger(__name__)

SIZES: tuple[str, ...] = ("tiny", "tiny-0.6b", "0.6b", "1.7b")
TINY_SIZES: frozenset[str] = frozenset({"tiny", "tiny-0.6b"})
MODEL_TYPES: tuple[str, ...] = tuple(MODEL_TYPE_NAMES)  # custom_voice, base, voice_design
# VoiceDesign is released at 1.7B only.
SIZES_OF_TYPE: dict[str, tuple[str, ...]] = {"custom_voice": SIZES, "base": SIZES, "voice_design": ("tiny", "1.7b")}

Shapes = dict[str, tuple[int, ...]]

# §2.4: the nine CustomVoice speakers (codec_embedding rows) and their dialects.
SPEAKERS: dict[str, int] = {
    "vivian": 3065,
    "serena": 3066,
    "uncle_fu": 3010,
    "dylan": 2878,
    "eric": 2875,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
}
SPEAKER_DIALECTS: dict[str, str | bool] = {name: False for name in SPEAKERS} | {
    "dylan": "beijing_dialect",
    "eric": "sichuan_dialect",
}
# §2.2: CustomVoice carries the two dialect entries besides the ten plain languages.
LANGUAGES: dict[str, int] = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
# Base and VoiceDesign have no preset speakers, hence no dialect entries either (§2.2).
PLAIN_LANGUAGES: dict[str, int] = {k: v for k, v in LANGUAGES.items() if "dialect" not in k}

# §2.5, identical in every release.
GENERATION_CONFIG: dict[str, Any] = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_p": 1.0,
    "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}

# Deliberately 4.57.2, not the release's 4.57.3: for a local directory whose config says > 4.57.2 (or nothing),
# transformers 4.57.3 + the reference's fix_mistral_regex=True swap Qwen's pre-tokenizer regex for a "fixed Mistral"
# one, which splits camelCase differently (qwen3-tts-model.md §7.1). Hub-id loading keeps Qwen's regex and so does
# our engine; writing 4.57.2 makes the reference tokenize random checkpoints the way the real release is used.
TRANSFORMERS_VERSION = "4.57.2"


# --------------------------------------------------------------------------------------------------------------
# Configs


def _geometry(size: str) -> dict[str, Any]:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    if size == "1.7b":
        return dict(
            model_size="1b7",
            hidden=2048,
            inter=6144,
            layers=28,
            heads=16,
            kv=8,
            head_dim=128,
            mrope=[24, 20, 20],
            text_hidden=2048,
            cp=dict(hidden=1024, inter=3072, layers=5, heads=16, kv=8, head_dim=128),
        )
    if size == "0.6b":
        return dict(
            model_size="0b6",
            hidden=1024,
            inter=3072,
            layers=28,
            heads=16,
            kv=8,
            head_dim=128,
            mrope=[24, 20, 20],
            text_hidden=2048,
            cp=dict(hidden=1024, inter=3072, layers=5, heads=16, kv=8, head_dim=128),
        )
    # Tiny (§7.4): mrope sections sum to head_dim/2 and stay interleaved; "tiny" has a narrower code predictor so
    # small_to_mtp_projection exists like in 1.7B, "tiny-0.6b" has equal widths (no projection) like 0.6B.
    cp_hidden = 32 if size == "tiny" else 64
    return dict(
        model_size="1b7" if size == "tiny" else "0b6",
        hidden=64,
        inter=128,
        layers=2,
        heads=4,
        kv=2,
        head_dim=16,
        mrope=[4, 2, 2],
        text_hidden=32,
        cp=dict(hidden=cp_hidden, inter=64, layers=1, heads=2, kv=1, head_dim=16),
    )


def _check_type(size: str, model_type: str) -> None:
    _geometry(size)  # validates the size
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown model type {model_type!r}; choose one of {', '.join(MODEL_TYPES)}")
    if size not in SIZES_OF_TYPE[model_type]:
        raise ValueError(
            f"no {MODEL_TYPE_NAMES[model_type]} model of size {size!r}; choose one of {', '.join(SIZES_OF_TYPE[model_type])}"
        )


def _speaker_encoder_config(size: str, hidden: int) -> dict[str, Any]:
    """speaker_encoder_config of a Base model. The release writes only these two fields (the rest are the class
    defaults); tiny sizes shrink the ECAPA-TDNN but keep 128 mel bins, which the reference's features fix."""
    out: dict[str, Any] = {"enc_dim": hidden, "sample_rate": 24000}
    if size in TINY_SIZES:
        out |= {"enc_channels": [16, 16, 16, 16, 48], "enc_attention_channels": 8, "enc_se_channels": 8}
    return out


def model_config_dict(size: str, model_type: str = "custom_voice") -> dict[str, Any]:
    """The root config.json of a checkpoint of this size and type (full sizes: the release values of §2)."""
    _check_type(size, model_type)
    g = _geometry(size)
    cp = g["cp"]
    code_predictor = {
        "model_type": "qwen3_tts_talker_code_predictor",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": cp["head_dim"],
        "hidden_act": "silu",
        "hidden_size": cp["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": cp["inter"],
        "layer_types": ["full_attention"] * cp["layers"],
        "max_position_embeddings": 65536,
        "max_window_layers": 28,
        "num_attention_heads": cp["heads"],
        "num_code_groups": 16,
        "num_hidden_layers": cp["layers"],
        "num_key_value_heads": cp["kv"],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 2048,
    }
    talker = {
        "model_type": "qwen3_tts_talker",
        "attention_bias": False,
        "attention_dropout": 0,
        "code_predictor_config": code_predictor,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_language_id": dict(LANGUAGES if model_type == "custom_voice" else PLAIN_LANGUAGES),
        "codec_nothink_id": 2155,
        "codec_pad_id": 2148,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "codec_think_id": 2154,
        "head_dim": g["head_dim"],
        "hidden_act": "silu",
        "hidden_size": g["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": g["inter"],
        "max_position_embeddings": 32768,
        "num_attention_heads": g["heads"],
        "num_code_groups": 16,
        "num_hidden_layers": g["layers"],
        "num_key_value_heads": g["kv"],
        "position_id_per_seconds": 13,
        "rms_norm_eps": 1e-06,
        # The reference indexes both keys, so even tiny models must keep them (§7.4).
        "rope_scaling": {"interleaved": True, "mrope_section": list(g["mrope"]), "rope_type": "default"},
        "rope_theta": 1000000,
        "sliding_window": None,
        "spk_id": dict(SPEAKERS) if model_type == "custom_voice" else {},
        "spk_is_dialect": dict(SPEAKER_DIALECTS) if model_type == "custom_voice" else {},
        "text_hidden_size": g["text_hidden"],
        "text_vocab_size": 151936,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 3072,
    }
    out: dict[str, Any] = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "assistant_token_id": 77091,
        "im_end_token_id": 151645,
        "im_start_token_id": 151644,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "tts_pad_token_id": 151671,
        "talker_config": talker,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": g["model_size"],
        "tts_model_type": model_type,
        "dtype": "float32" if size in TINY_SIZES else "bfloat16",
        "transformers_version": TRANSFORMERS_VERSION,
    }
    if model_type == "base":
        out["speaker_encoder_config"] = _speaker_encoder_config(size, g["hidden"])
    return out


def _mimi_config(size: str) -> dict[str, Any]:
    """The codec's Mimi encoder (voice-clone only). Tiny: the smallest geometry the reference still builds; its
    unused grouped transposed conv (upsample) needs hidden_size divisible by upsample_groups, so they are equal."""
    full = size not in TINY_SIZES
    hidden = 512 if full else 16
    return {
        "_frame_rate": 12.5,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "audio_channels": 1,
        "codebook_dim": 256 if full else 8,
        "codebook_size": 2048,
        "compress": 2,
        "dilation_growth_rate": 2,
        "head_dim": 64 if full else 8,
        "hidden_act": "gelu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 2048 if full else 32,
        "kernel_size": 7,
        "last_kernel_size": 3,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "model_type": "mimi",
        "norm_eps": 1e-05,
        "num_attention_heads": 8 if full else 2,
        "num_filters": 64 if full else 2,
        "num_hidden_layers": 8 if full else 1,
        "num_key_value_heads": 8 if full else 2,
        # 16 is the least the wrapper accepts (encoder_valid_num_quantizers); the release has 32.
        "num_quantizers": 32 if full else 16,
        "num_residual_layers": 1,
        "num_semantic_quantizers": 1,
        "pad_mode": "constant",
        "residual_kernel_size": 3,
        "rope_theta": 10000.0,
        "sampling_rate": 24000,
        "sliding_window": 250,
        "trim_right_ratio": 1.0,
        "upsample_groups": 512 if full else hidden,
        "upsampling_ratios": [8, 6, 5, 4],
        "use_cache": False,
        "use_causal_conv": True,
        "use_conv_shortcut": False,
        "use_streaming": False,
        "vector_quantization_hidden_dimension": 256 if full else 8,
    }


def codec_config_dict(size: str) -> dict[str, Any]:
    """speech_tokenizer/config.json (§6.1); tiny sizes shrink widths and depth but keep every rate."""
    full = size not in TINY_SIZES
    _geometry(size)  # validates the name
    decoder = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "codebook_dim": 512 if full else 32,
        "codebook_size": 2048,
        "decoder_dim": 1536 if full else 64,
        "head_dim": 64 if full else 16,
        "hidden_act": "silu",
        "hidden_size": 512 if full else 32,
        "intermediate_size": 1024 if full else 64,
        "latent_dim": 1024 if full else 64,
        "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000,
        "num_attention_heads": 16 if full else 2,
        "num_hidden_layers": 8 if full else 2,
        "num_key_value_heads": 16 if full else 2,
        "num_quantizers": 16,
        "num_semantic_quantizers": 1,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000,
        "semantic_codebook_size": 4096,
        "sliding_window": 72,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "vector_quantization_hidden_dimension": 512 if full else 32,
    }
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decoder_config": decoder,
        "encoder_config": _mimi_config(size),
        "dtype": "float32",
        "transformers_version": TRANSFORMERS_VERSION,
    }


# The processor files as the release ships them (§1.2).
ROOT_PREPROCESSOR_CONFIG: dict[str, Any] = {"padding_side": "left", "processor_class": "Qwen3TTSProcessor"}
CODEC_PREPROCESSOR_CONFIG: dict[str, Any] = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}


# --------------------------------------------------------------------------------------------------------------
# Tensor lists


def model_tensor_shapes(config: dict[str, Any]) -> Shapes:
    """(name -> shape) of the root model.safetensors for a root config.json dict (Base: with the speaker encoder)."""
    return checkpoint.model_tensor_shapes(Qwen3TTSConfig.from_dict(config))


def codec_tensor_shapes(codec_config: dict[str, Any]) -> Shapes:
    """(name -> shape) of speech_tokenizer/model.safetensors (Mimi encoder + decoder) for its config.json dict."""
    return checkpoint.codec_encoder_tensor_shapes(
        CodecEncoderConfig.from_dict(codec_config)
    ) | checkpoint.codec_decoder_tensor_shapes(CodecDecoderConfig.from_dict(codec_config))


def tensor_bytes(shapes: Shapes, dtype: torch.dtype) -> int:
    """Payload bytes of these tensors stored as dtype (the safetensors file minus its header)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(math.prod(s) for s in shapes.values()) * itemsize


# --------------------------------------------------------------------------------------------------------------
# Initialisation


# Fills its tensor in place (and returns it, as torch's in-place methods do).
_Fill = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def _init_rule(name: str, shape: tuple[int, ...], tiny: bool) -> _Fill:
    """How to fill one tensor, in place.

    Full sizes follow the timing recipe (matrices N(0, 0.02), biases 0, norms/scales 1; snake log-parameters 0, i.e.
    factor 1) so nothing overflows. Tiny sizes use non-trivial values (norm weights away from 1, random biases,
    unit-variance-preserving matrices, random snake/scale/usage) so parity tests exercise every tensor and the
    audio is not near-silent.
    """
    leaf = name.rsplit(".", 1)[-1]

    def normal(std: float) -> _Fill:
        return lambda t, g: t.normal_(0.0, std, generator=g)

    def uniform(lo: float, hi: float) -> _Fill:
        return lambda t, g: t.uniform_(lo, hi, generator=g)

    def const(v: float) -> _Fill:
        return lambda t, g: t.fill_(v)

    if leaf == "initialized":
        return const(1.0)
    if leaf == "cluster_usage":
        return uniform(0.5, 2.0) if tiny else const(1.0)
    if leaf in ("alpha", "beta"):
        return normal(0.1) if tiny else const(0.0)
    if leaf in ("scale", "gamma"):
        return uniform(0.05, 0.15) if tiny else const(1.0)
    parts = name.split(".")
    if leaf == "weight" and len(parts) >= 2 and "norm" in parts[-2]:  # RMSNorm / LayerNorm weights
        return uniform(0.5, 1.5) if tiny else const(1.0)
    if leaf == "bias":
        return normal(0.02) if tiny else const(0.0)
    if leaf in ("embedding_sum", "embed_sum"):
        return normal(1.0) if tiny else normal(0.02)
    if "embedding" in name:  # token tables
        return normal(1.0) if tiny else normal(0.02)
    if tiny:
        # Conv weights are [out, in/groups, k] (transposed: [in, out, k]); either way fan-in ~ prod(shape[1:]).
        fan_in = max(1, math.prod(shape[1:]))
        gain = 1.0
        if ".conv2.conv." in name:
            gain = 0.2  # residual branches of the vocoder: unit gain would grow the signal ~x3 per block
        elif name.startswith("decoder.decoder.") and shape[0] == 1:
            gain = 0.5  # the final 1-channel conv: keep the waveform inside the [-1, 1] clamp
        return normal(gain / math.sqrt(fan_in))
    return normal(0.02)


def _tensor_seed(seed: int, name: str) -> int:
    # Per-tensor seeds make each tensor independent of write order and of which other tensors exist.
    return (seed * 1_000_003 + zlib.crc32(name.encode())) & 0x7FFF_FFFF_FFFF_FFFF


_CHUNK_ELEMENTS = 1 << 24  # rows are drawn in blocks of about this many float32 values (64 MB)


def random_tensor(
    name: str, shape: tuple[int, ...], *, seed: int, tiny: bool, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """One seeded random tensor on the CPU in dtype, drawn in float32 on device.

    Large tensors are drawn block of rows by block of rows from one generator, so the peak extra memory is one
    block, not a float32 copy of a 600 MB embedding table.
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(_tensor_seed(seed, name))
    fill = _init_rule(name, shape, tiny)
    out = torch.empty(shape, dtype=dtype)
    rows = shape[0] if shape else 1
    per_row = max(1, math.prod(shape[1:]))
    step = max(1, _CHUNK_ELEMENTS // per_row)
    flat = out.view(rows, per_row) if shape else out.view(1, 1)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        block = torch.empty((n, per_row), dtype=torch.float32, device=device)
        fill(block, gen)
        flat[start : start + n] = block.to(dtype).cpu()
    return out


# --------------------------------------------------------------------------------------------------------------
# Writing

_ST_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors_streaming(
    path: Path, shapes: Shapes, make: Callable[[str, tuple[int, ...]], torch.Tensor], dtype: torch.dtype
) -> None:
    """Write a safetensors file whose tensors are produced one by one by `make` (all stored as dtype).

    The header can be written first because every shape is known up front; then each tensor's bytes follow in
    header order, so memory use is one tensor, whatever the file size.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    names = sorted(shapes)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        n = math.prod(shapes[name]) * itemsize
        header[name] = {"dtype": _ST_DTYPE[dtype], "shape": list(shapes[name]), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format pads the header to 8-byte alignment with spaces
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in names:
            t = make(name, shapes[name])
            if t.dtype != dtype or tuple(t.shape) != shapes[name]:
                raise RuntimeError(f"{name}: made {t.dtype} {tuple(t.shape)}, header says {dtype} {shapes[name]}")
            f.write(t.contiguous().view(torch.uint8).numpy().data)  # the array's own bytes: no extra copy
    tmp.replace(path)  # a crash never leaves a truncated model.safetensors behind


def _write_json(path: Path, data: dict[str, Any], newline: bool = True) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + ("\n" if newline else ""), encoding="utf-8")


def _write_tokenizer(out_dir: Path) -> bool:
    try:
        from .qwen_vocab import write_tokenizer_files
    except ImportError:  # optional helper; without it the checkpoint simply has no tokenizer files
        _LOG.warning("wyoming_qwen3tts.tools.qwen_vocab unavailable: writing no tokenizer files")
        return False
    write_tokenizer_files(out_dir)
    return True


def write_random_checkpoint(
    out_dir: Path | str,
    size: str,
    seed: int = 0,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    model_type: str = "custom_voice",
) -> Path:
    """Write a complete random checkpoint of `size` and `model_type` into out_dir and return out_dir.

    dtype is that of model.safetensors (default bfloat16 for full sizes, float32 for tiny ones); the codec file is
    always float32, as released. device is where random numbers are drawn (default: cuda if available for full
    sizes, else cpu); values depend on it, but are deterministic for a given (size, seed, device).
    """
    tiny = size in TINY_SIZES
    config = model_config_dict(size, model_type)
    codec_config = codec_config_dict(size)
    model_dtype = resolve_dtype(dtype) if dtype is not None else (torch.float32 if tiny else torch.bfloat16)
    if device is None:
        device = "cuda" if (not tiny and torch.cuda.is_available()) else "cpu"
    dev = torch.device(device)
    config["dtype"] = str(model_dtype).removeprefix("torch.")

    out = Path(out_dir)
    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", GENERATION_CONFIG, newline=False)  # 245 B, like the release
    _write_json(out / "preprocessor_config.json", ROOT_PREPROCESSOR_CONFIG)
    _write_json(out / "speech_tokenizer" / "config.json", codec_config)
    _write_json(out / "speech_tokenizer" / "preprocessor_config.json", CODEC_PREPROCESSOR_CONFIG)
    _write_tokenizer(out)

    def maker(dt: torch.dtype) -> Callable[[str, tuple[int, ...]], torch.Tensor]:
        return lambda name, shape: random_tensor(name, shape, seed=seed, tiny=tiny, dtype=dt, device=dev)

    write_safetensors_streaming(out / "model.safetensors", model_tensor_shapes(config), maker(model_dtype), model_dtype)
    write_safetensors_streaming(
        out / "speech_tokenizer" / "model.safetensors",
        codec_tensor_shapes(codec_config),
        maker(torch.float32),
        torch.float32,
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_qwen3tts.tools.random_checkpoint",
        description="Write a random-weight Qwen3-TTS checkpoint in the release layout.",
    )
    parser.add_argument("--size", choices=SIZES, required=True)
    parser.add_argument(
        "--type",
        dest="model_type",
        choices=MODEL_TYPES,
        default="custom_voice",
        help="tts_model_type: custom_voice (default), base (voice clone) or voice_design",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory (created)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32", "float16"),
        default=None,
        help="model.safetensors dtype (default: bfloat16 for full sizes, float32 for tiny)",
    )
    parser.add_argument(
        "--device", default=None, help="where to draw random numbers (default: cuda when available for full sizes)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        out = write_random_checkpoint(
            args.out, args.size, seed=args.seed, dtype=args.dtype, device=args.device, model_type=args.model_type
        )
    except ValueError as err:
        parser.error(str(err))
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {args.size} {MODEL_TYPE_NAMES[args.model_type]} checkpoint to {out} ({total / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
