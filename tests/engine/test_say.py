"""`python -m wyoming_qwen3tts.say` writes a valid WAV of frames x 1920 samples with every kind of voice the server
offers (speakers, presets, voices-folder clones, a clip given inline, VoiceDesign), and fails clearly."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from voice_clip import write_clip

from wyoming_qwen3tts.say import main

pytestmark = pytest.mark.timeout(300)


def _say(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wyoming_qwen3tts.say", *args], capture_output=True, text=True, timeout=300
    )


def test_say_writes_wav_and_codes(tiny_checkpoint, tmp_path):
    out, codes_out = tmp_path / "out.wav", tmp_path / "codes.npy"
    proc = _say(
        "--model",
        str(tiny_checkpoint),
        "--voice",
        "vivian",
        "--text",
        "你好，世界。Hello world.",
        "--out",
        str(out),
        "--greedy",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--max-frames",
        "15",
        "--codes-out",
        str(codes_out),
    )
    assert proc.returncode == 0, proc.stderr
    codes = np.load(codes_out)
    assert codes.ndim == 2 and codes.shape[1] == 16 and 1 <= codes.shape[0] <= 15
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == codes.shape[0] * 1920
    assert f"{codes.shape[0]} frames" in proc.stdout and "RTF" in proc.stdout


def test_say_unknown_voice_is_a_clear_error(tiny_checkpoint, tmp_path):
    proc = _say(
        "--model",
        str(tiny_checkpoint),
        "--voice",
        "nobody",
        "--text",
        "hi",
        "--out",
        str(tmp_path / "x.wav"),
        "--device",
        "cpu",
        "--dtype",
        "float32",
    )
    assert proc.returncode == 2
    assert "Unknown voice 'nobody'" in proc.stderr
    assert not (tmp_path / "x.wav").exists()


def test_say_missing_model_dir(tmp_path):
    proc = _say(
        "--model", str(tmp_path / "nothing-here"), "--voice", "ryan", "--text", "hi", "--out", str(tmp_path / "x.wav")
    )
    assert proc.returncode == 2
    assert "error:" in proc.stderr


# Every run below: float32 on the CPU, greedy, a fixed seed and a few frames, so two runs of one voice agree code for code.
COMMON = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--greedy",
    "--seed",
    "3",
    "--max-frames",
    "6",
    "--text",
    "Hello there.",
]


def say_codes(tmp_path: Path, checkpoint: Path, *args: str) -> np.ndarray:
    """Run say in this process; its codes (and check the WAV holds as many frames)."""
    out, codes_out = tmp_path / "out.wav", tmp_path / "codes.npy"
    assert main(["--model", str(checkpoint), *COMMON, *args, "--out", str(out), "--codes-out", str(codes_out)]) == 0
    codes = np.load(codes_out)
    with wave.open(str(out)) as w:
        assert w.getnframes() == codes.shape[0] * 1920 and codes.shape[0] >= 1
    return codes


def test_say_a_preset_of_the_config(tiny_checkpoint: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[[voices]]\nname = "ryan-de"\nspeaker = "ryan"\nlanguage = "de-DE"\n')
    preset = say_codes(tmp_path, tiny_checkpoint, "--config", str(config), "--voice", "ryan-de")
    assert np.array_equal(preset, say_codes(tmp_path, tiny_checkpoint, "--voice", "ryan", "--language", "de"))
    assert not np.array_equal(preset, say_codes(tmp_path, tiny_checkpoint, "--voice", "ryan", "--language", "en"))


def test_say_cloned_voices_from_the_folder_and_inline(
    tiny_base_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "voices"
    folder.mkdir()
    clip = write_clip(folder / "anna.wav", seconds=2.0)
    (folder / "anna.txt").write_text("Hello, I am Anna.")
    from_folder = say_codes(tmp_path, tiny_base_checkpoint, "--voices-dir", str(folder), "--voice", "anna")
    assert "voice anna" in capsys.readouterr().out
    assert list((folder / ".prompts").glob("*.safetensors"))  # the server's prompt cache, shared
    inline = say_codes(tmp_path, tiny_base_checkpoint, "--ref-audio", str(clip), "--ref-text", "Hello, I am Anna.")
    assert np.array_equal(from_folder, inline)  # the same clip and transcript: the same voice
    x_vector = say_codes(tmp_path, tiny_base_checkpoint, "--ref-audio", str(clip), "--x-vector-only")
    assert not np.array_equal(x_vector, inline)  # another prompt (no clip codes, no transcript)


def test_say_a_designed_voice(tiny_voice_design_checkpoint: Path, tmp_path: Path) -> None:
    calm = say_codes(tmp_path, tiny_voice_design_checkpoint, "--design", "A calm, deep narrator.")
    bright = say_codes(tmp_path, tiny_voice_design_checkpoint, "--design", "A bright, fast young voice.")
    assert not np.array_equal(calm, bright)


@pytest.mark.parametrize(
    ("checkpoint", "args", "message"),
    [
        ("tiny_base_checkpoint", [], "--ref-audio CLIP"),
        ("tiny_base_checkpoint", ["--voice", "nobody"], "Unknown voice 'nobody'"),
        ("tiny_voice_design_checkpoint", [], "--design"),
        ("tiny_checkpoint", ["--ref-audio", "missing.wav", "--x-vector-only"], "cloning a voice needs a Base model"),
    ],
)
def test_say_tells_which_voice_the_model_needs(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    checkpoint: str,
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "x.wav"
    assert main(["--model", str(request.getfixturevalue(checkpoint)), *COMMON, *args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--voice", "ryan", "--design", "A voice."], "--voice and --design"),
        (["--ref-text", "Hello."], "go with --ref-audio"),
        (["--ref-audio", "clip.wav"], "needs --ref-text"),
    ],
)
def test_say_refuses_meaningless_arguments(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--text", "hi", "--out", "x.wav", *args])
    assert exited.value.code == 2 and message in capsys.readouterr().err
