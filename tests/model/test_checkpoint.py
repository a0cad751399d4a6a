"""Checkpoint resolution, layout checks and loading (model.checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from wyoming_qwen3tts.errors import ModelLoadError
from wyoming_qwen3tts.model import checkpoint as ck
from wyoming_qwen3tts.model.config import ModelConfigError

PROJ = "talker.code_predictor.small_to_mtp_projection"


def _link_copy(src: Path, dst: Path) -> Path:
    """A checkpoint directory whose files are symlinks to src's, so a test can replace single files cheaply."""
    for p in src.rglob("*"):
        if p.is_file():
            target = dst / p.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(p)
    return dst


def _replace(path: Path, data: bytes | str) -> None:
    path.unlink()
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)


def test_layout_error_names_every_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        ck.check_layout(tmp_path)
    msg = str(err.value)
    every_file = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "vocab.json + merges.txt (or tokenizer.json)",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
    ]
    for name in every_file:
        assert name in msg, name
    assert ck.missing_files(tmp_path) == every_file


def test_layout_accepts_tokenizer_json_and_reports_only_what_is_missing(tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json", "speech_tokenizer/model.safetensors"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    assert ck.missing_files(tmp_path) == ["generation_config.json", "model.safetensors", "speech_tokenizer/config.json"]
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "vocab.json").write_text("{}")  # vocab without merges is not a tokenizer
    assert "vocab.json + merges.txt (or tokenizer.json)" in ck.missing_files(tmp_path)


def test_complete_tiny_checkpoint_passes_the_layout_check(tiny_checkpoint: Path) -> None:
    ck.check_layout(tiny_checkpoint)
    assert ck.missing_files(tiny_checkpoint) == []


@pytest.mark.parametrize("model_type", ["base", "voice_design"])
def test_base_or_voice_design_config_is_refused(tiny_checkpoint: Path, tmp_path: Path, model_type: str) -> None:
    d = _link_copy(tiny_checkpoint, tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    cfg["tts_model_type"] = model_type
    _replace(d / "config.json", json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="not a CustomVoice model") as err:
        ck.load_checkpoint(d)
    assert isinstance(err.value, ModelConfigError)  # callers may catch either
    assert model_type in str(err.value)


def test_unknown_model_type_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    d = _link_copy(tiny_checkpoint, tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    cfg["tts_model_type"] = "singing"
    _replace(d / "config.json", json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unknown model type.*'singing'"):
        ck.load_checkpoint(d, model_types=("custom_voice", "base", "voice_design"))


@pytest.mark.parametrize("clone_encoders", [True, False])
def test_base_checkpoint_loads_the_clone_encoders_as_stored(tiny_base_checkpoint: Path, clone_encoders: bool) -> None:
    with pytest.raises(ModelLoadError, match="not a CustomVoice model.*'base'"):
        ck.load_checkpoint(tiny_base_checkpoint)  # callers that serve only presets keep refusing Base
    c = ck.load_checkpoint(tiny_base_checkpoint, dtype="bfloat16", model_types=("base",), clone_encoders=clone_encoders)
    assert c.config.tts_model_type == "base" and c.config.speaker_encoder is not None
    assert set(c.tensors) == set(ck.talker_tensor_shapes(c.config))  # the Talker side only, in the asked dtype
    assert {t.dtype for t in c.tensors.values()} == {torch.bfloat16}
    if not clone_encoders:
        assert c.speaker_encoder_tensors == {} and c.codec_encoder_tensors == {} and c.codec_encoder_config is None
        return
    assert set(c.speaker_encoder_tensors) == set(ck.speaker_encoder_tensor_shapes(c.config.speaker_encoder))
    assert c.codec_encoder_config is not None
    assert set(c.codec_encoder_tensors) == set(ck.codec_encoder_tensor_shapes(c.codec_encoder_config))
    assert {t.dtype for t in c.speaker_encoder_tensors.values()} == {torch.float32}  # as stored in the file
    with safe_open(str(tiny_base_checkpoint / "model.safetensors"), framework="pt") as f:
        assert set(c.tensors) | set(c.speaker_encoder_tensors) == set(f.keys())
        assert torch.equal(
            c.speaker_encoder_tensors["speaker_encoder.fc.weight"], f.get_tensor("speaker_encoder.fc.weight")
        )
    with safe_open(str(tiny_base_checkpoint / "speech_tokenizer" / "model.safetensors"), framework="pt") as f:
        assert set(c.codec_tensors) | set(c.codec_encoder_tensors) == set(f.keys())


def test_voice_design_checkpoint_loads_without_encoders(tiny_voice_design_checkpoint: Path) -> None:
    c = ck.load_checkpoint(tiny_voice_design_checkpoint, dtype="float32", model_types=("voice_design",))
    assert c.config.tts_model_type == "voice_design" and c.config.speakers == [] and c.config.supports_instruct
    assert c.speaker_encoder_tensors == {} and c.codec_encoder_tensors == {}


def test_base_config_needs_an_x_vector_as_wide_as_the_talker(tiny_base_checkpoint: Path, tmp_path: Path) -> None:
    d = _link_copy(tiny_base_checkpoint, tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    cfg["speaker_encoder_config"]["enc_dim"] = 32
    _replace(d / "config.json", json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="enc_dim is 32, the Talker's hidden size is 64"):
        ck.load_checkpoint(d, model_types=("base",))


@pytest.mark.parametrize(
    ("fixture", "size", "has_projection"),
    [("tiny_checkpoint", "1b7", True), ("tiny_checkpoint_06b", "0b6", False)],
)
def test_loading_tiny_sizes_gives_the_config_key_sets(
    fixture: str, size: str, has_projection: bool, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(fixture)
    c = ck.load_checkpoint(path, dtype="float32")
    assert c.path == path and c.config.tts_model_size == size
    assert set(c.tensors) == set(ck.talker_tensor_shapes(c.config))
    assert (f"{PROJ}.weight" in c.tensors) == has_projection
    assert (f"{PROJ}.bias" in c.tensors) == has_projection
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        assert set(c.tensors) == set(f.keys())  # nothing in the file is left behind
        assert torch.equal(c.tensors["talker.codec_head.weight"], f.get_tensor("talker.codec_head.weight"))
    # Only the codec decoder is kept; the Mimi encoder (voice clone) is not.
    assert set(c.codec_tensors) == set(ck.codec_decoder_tensor_shapes(c.codec_config))
    assert all(k.startswith("decoder.") for k in c.codec_tensors)
    with safe_open(str(path / "speech_tokenizer" / "model.safetensors"), framework="pt") as f:
        assert any(k.startswith("encoder.") for k in f.keys())
    assert c.generation_config == json.loads((path / "generation_config.json").read_text())
    assert c.codec_config.samples_per_frame == 1920


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("bfloat16", torch.bfloat16), (torch.float16, torch.float16), ("float32", torch.float32)],
)
def test_dtype_choice_is_honoured_and_codec_stays_float32(
    tiny_checkpoint: Path, dtype: Any, expected: torch.dtype
) -> None:
    c = ck.load_checkpoint(tiny_checkpoint, dtype=dtype)
    assert {t.dtype for t in c.tensors.values()} == {expected}
    assert c.dtype == expected
    assert {t.dtype for t in c.codec_tensors.values()} == {torch.float32}
    assert all(t.device.type == "cpu" for t in c.tensors.values())
    with safe_open(str(tiny_checkpoint / "model.safetensors"), framework="pt") as f:
        ref = f.get_tensor("talker.model.norm.weight").to(expected)
    assert torch.equal(c.tensors["talker.model.norm.weight"], ref)


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        ck.resolve_dtype("int8")
    with pytest.raises(ValueError, match="unsupported dtype"):
        ck.resolve_dtype(torch.int32)
    assert ck.resolve_dtype("torch.bfloat16") is torch.bfloat16


def test_missing_tensor_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    d = _link_copy(tiny_checkpoint, tmp_path / "ckpt")
    with safe_open(str(tiny_checkpoint / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "talker.model.layers.1.mlp.up_proj.weight"}
    (d / "model.safetensors").unlink()
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"1 talker tensor\(s\) missing.*layers\.1\.mlp\.up_proj\.weight"):
        ck.load_checkpoint(d)


def test_wrong_shape_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    d = _link_copy(tiny_checkpoint, tmp_path / "ckpt")
    with safe_open(str(tiny_checkpoint / "speech_tokenizer" / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["decoder.pre_conv.conv.weight"] = torch.zeros(3, 3, 3)
    (d / "speech_tokenizer" / "model.safetensors").unlink()
    save_file(tensors, str(d / "speech_tokenizer" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"decoder\.pre_conv\.conv\.weight has shape \(3, 3, 3\)"):
        ck.load_checkpoint(d)


@pytest.mark.parametrize("model", ["./no/such/dir", "not a repo id", "a/b/c", "~/nothing-here"])
def test_neither_directory_nor_repo_id_is_a_clear_error(model: str) -> None:
    with pytest.raises(ModelLoadError, match="neither an existing directory nor a Hugging Face repo id"):
        ck.resolve_model_dir(model, None)


def test_a_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file"):
        ck.resolve_model_dir(str(f), None)


def test_local_directory_is_used_as_is(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    def no_hub(**_: Any) -> str:
        raise AssertionError("a local directory must not touch the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    assert ck.resolve_model_dir(str(tiny_checkpoint), Path("/nonexistent")) == tiny_checkpoint


def test_repo_id_downloads_only_needed_files_into_the_data_dir(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    seen: dict[str, Any] = {}

    def fake_download(**kw: Any) -> str:
        seen.update(kw)
        return str(tiny_checkpoint)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert ck.resolve_model_dir(ck.DEFAULT_MODEL, tmp_path) == tiny_checkpoint
    assert seen["repo_id"] == ck.DEFAULT_MODEL
    assert Path(seen["cache_dir"]) == tmp_path / "models"
    patterns = set(seen["allow_patterns"])
    assert {"model.safetensors", "speech_tokenizer/model.safetensors", "vocab.json", "merges.txt"} <= patterns
    assert "README.md" not in patterns and "*" not in patterns
    assert seen["local_files_only"] is False


def test_uncached_repo_with_local_files_only_is_a_load_error(tmp_path: Path) -> None:
    # The real hub client, told not to use the network: nothing cached under data_dir -> one clear error.
    with pytest.raises(ModelLoadError) as err:
        ck.resolve_model_dir("nobody-here/no-such-model", tmp_path, local_files_only=True)
    msg = str(err.value)
    assert "nobody-here/no-such-model" in msg and str(tmp_path / "models") in msg
    assert "local directory" in msg  # says what to do


def test_unknown_repo_id_offline_is_a_load_error(tmp_path: Path) -> None:
    # HF_HUB_OFFLINE is read when huggingface_hub is imported, so this needs a fresh interpreter.
    code = (
        "import sys; from pathlib import Path\n"
        "from wyoming_qwen3tts.model.checkpoint import load_checkpoint\n"
        "from wyoming_qwen3tts.errors import ModelLoadError\n"
        "try:\n"
        "    load_checkpoint('nobody-here/no-such-model', Path(sys.argv[1]))\n"
        "except ModelLoadError as e:\n"
        "    print('ModelLoadError:', e); sys.exit(3)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "nobody-here/no-such-model" in proc.stdout
    assert str(tmp_path / "data" / "models") in proc.stdout
