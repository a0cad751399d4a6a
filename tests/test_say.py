"""`python -m wyoming_qwen3tts.say` writes a valid WAV of frames x 1920 samples, and fails clearly."""

from __future__ import annotations

import subprocess
import sys
import wave

import numpy as np


def _say(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wyoming_qwen3tts.say", *args], capture_output=True, text=True, timeout=300
    )


def test_say_writes_wav_and_codes(tiny_checkpoint, tmp_path):
    out, codes_out = tmp_path / "out.wav", tmp_path / "codes.npy"
    proc = _say(
        "--model", str(tiny_checkpoint), "--voice", "vivian", "--text", "你好，世界。Hello world.",
        "--out", str(out), "--greedy", "--device", "cpu", "--dtype", "float32", "--max-frames", "15",
        "--codes-out", str(codes_out),
    )
    assert proc.returncode == 0, proc.stderr
    codes = np.load(codes_out)
    assert codes.ndim == 2 and codes.shape[1] == 16 and 1 <= codes.shape[0] <= 15
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == codes.shape[0] * 1920
    assert f"{codes.shape[0]} frames" in proc.stdout and "RTF" in proc.stdout


def test_say_unknown_voice_is_a_clear_error(tiny_checkpoint, tmp_path):
    proc = _say("--model", str(tiny_checkpoint), "--voice", "nobody", "--text", "hi", "--out", str(tmp_path / "x.wav"),
                "--device", "cpu", "--dtype", "float32")
    assert proc.returncode == 2
    assert "unknown speaker 'nobody'" in proc.stderr
    assert not (tmp_path / "x.wav").exists()


def test_say_missing_model_dir(tmp_path):
    proc = _say("--model", str(tmp_path / "nothing-here"), "--voice", "ryan", "--text", "hi", "--out", str(tmp_path / "x.wav"))
    assert proc.returncode == 2
    assert "error:" in proc.stderr
