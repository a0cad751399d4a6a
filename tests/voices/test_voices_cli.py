"""`python -m wyoming_qwen3tts.voices`: add (checked, stored, cloned and cached with a Base model), list, remove,
and design (a VoiceDesign sample kept as a cloned voice), on tiny random checkpoints on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import soundfile
from voice_clip import write_clip

from wyoming_qwen3tts.voices import scan_voice_folder
from wyoming_qwen3tts.voices.__main__ import main

pytestmark = pytest.mark.timeout(300)


def test_add_list_remove(tiny_base_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "voices"
    clip = write_clip(tmp_path / "recording.flac", seconds=2.5)
    assert (
        main(
            [
                "--voices-dir",
                str(folder),
                "add",
                "anna",
                "--audio",
                str(clip),
                "--text",
                "Hello, I am Anna.",
                "--language",
                "de",
                "--description",
                "Anna, warm",
                "--model",
                str(tiny_base_checkpoint),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "cloned 'anna'" in out and "in context" in out and "Home Assistant will show: anna - Anna, warm" in out
    info = soundfile.info(str(folder / "anna.wav"))
    # Kept as the clip's own samples, mixed down: float at the clip's 16 kHz (issue 37: no rounding to 16-bit).
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "FLOAT") and abs(info.duration - 2.5) < 0.01
    assert (folder / "anna.txt").read_text() == "Hello, I am Anna.\n"
    assert len(list((folder / ".prompts").glob("*.safetensors"))) == 1
    (voice,), problems = scan_voice_folder(folder)
    assert (voice.name, voice.language, voice.description, voice.x_vector_only) == ("anna", "de", "Anna, warm", False)
    assert problems == []

    # Refused: a name taken, no transcript, a path for a name, a clip that is not audio or too short.
    for argv, message in [
        (["add", "anna", "--audio", str(clip), "--text", "x"], "exists"),
        (["add", "bob", "--audio", str(clip)], "--text"),
        (["add", "../evil", "--audio", str(clip), "--x-vector-only"], "voice name"),
        (["add", "bob", "--audio", str(tmp_path / "voices" / "anna.txt"), "--x-vector-only"], "not an audio file"),
        (
            ["add", "bob", "--audio", str(write_clip(tmp_path / "short.wav", seconds=0.4)), "--x-vector-only"],
            "at least 1 s",
        ),
    ]:
        with pytest.raises(SystemExit) as caught:
            main(["--voices-dir", str(folder), *argv])
        assert message in str(caught.value), (argv, caught.value)
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == ["anna.toml", "anna.txt", "anna.wav"]
    assert not (tmp_path / "evil.wav").exists()

    assert main(["--voices-dir", str(folder), "add", "bob", "--audio", str(clip), "--x-vector-only"]) == 0
    capsys.readouterr()
    assert main(["--voices-dir", str(folder), "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[:3] for line in listed] == [
        ["anna", "anna.wav", "in context"],
        ["bob", "bob.wav", "x-vector"],
    ]
    assert main(["--voices-dir", str(folder), "remove", "anna"]) == 0
    assert not any(folder.glob("anna.*")) and (folder / "bob.wav").exists()
    with pytest.raises(SystemExit, match="no voice"):
        main(["--voices-dir", str(folder), "remove", "anna"])


@pytest.mark.slow
def test_design_keeps_a_designed_voice_as_a_clone(
    tiny_voice_design_checkpoint: Path, tiny_base_checkpoint: Path, tmp_path: Path
) -> None:
    """Run as a user would: the module's command line, in a subprocess."""
    folder = tmp_path / "voices"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wyoming_qwen3tts.voices",
            "--voices-dir",
            str(folder),
            "design",
            "narrator",
            "--description",
            "A calm, deep narrator.",
            "--text",
            "Once upon a time, in a quiet town by the sea.",
            "--model",
            str(tiny_voice_design_checkpoint),
            "--base-model",
            str(tiny_base_checkpoint),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "designed 'narrator'" in result.stdout and "cloned 'narrator'" in result.stdout
    (voice,), _ = scan_voice_folder(folder)
    assert (
        voice.reference_text == "Once upon a time, in a quiet town by the sea."
        and voice.description == "A calm, deep narrator."
    )
    assert soundfile.info(str(folder / "narrator.wav")).duration >= 1.0
