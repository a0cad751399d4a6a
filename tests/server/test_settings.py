"""Settings: precedence (command line > environment > TOML > defaults) and config.example.toml."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from wyoming_qwen3tts import __version__
from wyoming_qwen3tts.options import EngineOptions
from wyoming_qwen3tts.request import SamplingParams
from wyoming_qwen3tts.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.example.toml"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("WYOMING_QWEN3TTS_"):
            monkeypatch.delenv(key)


def test_defaults() -> None:
    settings = load_settings([])
    assert settings == Settings()
    assert settings.uri == "tcp://0.0.0.0:10200"
    assert settings.model == "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
    assert settings.streaming and settings.zeroconf is None and settings.seed is None


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        'uri = "tcp://127.0.0.1:1"\nchunk_frames = 5\ntemperature = 0.5\ntop_k = 7\n'
        '[[voices]]\nname = "calm"\nspeaker = "ryan"\ninstruct = "calm"\n'
    )
    monkeypatch.setenv("WYOMING_QWEN3TTS_CHUNK_FRAMES", "6")
    monkeypatch.setenv("WYOMING_QWEN3TTS_TEMPERATURE", "0.6")
    monkeypatch.setenv("WYOMING_QWEN3TTS_GREEDY", "true")
    settings = load_settings(["--config", str(config), "--temperature", "0.7", "--no-greedy"])
    assert settings.uri == "tcp://127.0.0.1:1"  # TOML over default
    assert settings.chunk_frames == 6  # env over TOML
    assert settings.temperature == 0.7  # CLI over env over TOML
    assert settings.greedy is False  # CLI --no-greedy over env
    assert settings.top_k == 7
    assert settings.first_chunk_frames == Settings().first_chunk_frames  # default
    assert [v.name for v in settings.voices] == ["calm"] and settings.voices[0].instruct == "calm"

    # The config file can come from the environment too.
    monkeypatch.setenv("WYOMING_QWEN3TTS_CONFIG", str(config))
    assert load_settings([]).uri == "tcp://127.0.0.1:1"


def test_cli_flags() -> None:
    settings = load_settings(
        ["--zeroconf", "--no-streaming", "--seed", "3", "--greedy", "--backend", "torch", "--data-dir", "/tmp/d"]
    )
    assert settings.zeroconf == "qwen3-tts" and not settings.streaming
    assert settings.seed == 3 and settings.sampling().greedy is True
    assert settings.backend == "torch" and settings.data_dir == Path("/tmp/d")
    assert load_settings(["--zeroconf", "kitchen"]).zeroconf == "kitchen"


def test_sampling_settings_override_the_checkpoints() -> None:
    """Unset sampling settings keep the checkpoint's generation_config.json values; set ones replace
    them; --greedy turns both draws into argmax."""
    checkpoint = SamplingParams.from_generation_config(
        {
            "do_sample": True,
            "temperature": 0.7,
            "top_k": 30,
            "repetition_penalty": 1.1,
            "subtalker_dosample": True,
            "subtalker_top_k": 20,
        }
    )
    assert (checkpoint.temperature, checkpoint.top_k, checkpoint.subtalker_top_k) == (0.7, 30, 20)
    assert checkpoint.top_p == SamplingParams().top_p  # absent from the file: the release's value
    assert load_settings([]).sampling().apply(checkpoint) == checkpoint
    sampling = load_settings(["--temperature", "0.3", "--subtalker-top-k", "9"]).sampling().apply(checkpoint)
    assert sampling == replace(checkpoint, temperature=0.3, subtalker_top_k=9)
    greedy = load_settings(["--greedy", "--top-k", "5"]).sampling().apply(checkpoint)
    assert not greedy.do_sample and not greedy.subtalker_do_sample and greedy.top_k == 5


def test_engine_options_carry_the_engine_settings() -> None:
    settings = load_settings(
        [
            "--device",
            "cpu",
            "--backend",
            "torch",
            "--max-text-chars",
            "300",
            "--chunk-frames",
            "4",
            "--max-frames",
            "99",
            "--first-chunk-frames",
            "3",
            "--temperature",
            "0.5",
        ]
    )
    options = settings.engine_options()
    assert (options.device, options.backend, options.max_text_chars) == ("cpu", "torch", 300)
    assert (options.first_chunk_frames, options.chunk_frames, options.max_frames) == (3, 4, 99)
    assert options.sampling == settings.sampling() and options.sampling.temperature == 0.5
    # Every default is the engine's own: one home each.
    defaults = Settings().engine_options()
    assert defaults == EngineOptions()


@pytest.mark.parametrize(
    "argv", [["--chunk-frames", "0"], ["--backend", "cuda"], ["--config", "/nonexistent.toml"], ["--top-p", "2"]]
)
def test_invalid_values_exit(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        load_settings(argv)
    assert info.value.code == 2


def test_unknown_toml_key_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("chunk_frame = 5\n")  # typo
    with pytest.raises(SystemExit):
        load_settings(["--config", str(config)])


def test_example_config_documents_every_setting_with_its_default() -> None:
    text = EXAMPLE.read_text()
    values = tomllib.loads(text)
    defaults = Settings().model_dump()
    for name, default in defaults.items():
        if default is None:
            # Shown commented out, since TOML has no null.
            assert re.search(rf"^# {name} = .+  # .+$", text, re.M), name
            assert name not in values
        else:
            assert name in values, name
            expected = str(default) if isinstance(default, Path) else default
            assert values[name] == expected, name
            assert re.search(rf"^{name} = .+  # \S.+$", text, re.M), f"{name} needs a comment"
    assert set(values) <= set(defaults)
    # The example loads as a config file and changes nothing.
    assert load_settings(["--config", str(EXAMPLE)]) == Settings()


def test_version_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "wyoming_qwen3tts", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == __version__
    help_text = subprocess.run(
        [sys.executable, "-m", "wyoming_qwen3tts", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in [
        "--uri",
        "--model",
        "--data-dir",
        "--device",
        "--dtype",
        "--backend",
        "--config",
        "--zeroconf",
        "--no-streaming",
        "--debug",
        "--log-format",
        "--first-chunk-frames",
        "--chunk-frames",
        "--max-frames",
        "--max-text-chars",
        "--seed",
        "--greedy",
        "--temperature",
    ]:
        assert flag in help_text, flag


def test_handler_config_takes_the_settings_of_its_names() -> None:
    from dataclasses import fields

    from wyoming_qwen3tts.handler import HandlerConfig

    settings = load_settings(
        [
            "--max-text-chars",
            "77",
            "--seed",
            "4",
            "--idle-timeout",
            "9",
            "--write-timeout",
            "8",
            "--max-sentence-chars",
            "50",
            "--max-event-bytes",
            "5000",
            "--max-pending-requests",
            "3",
            "--no-text-frontend",
        ]
    )
    config = HandlerConfig(**settings.values_for(HandlerConfig))
    assert {f.name: getattr(config, f.name) for f in fields(HandlerConfig)} == dict(
        max_text_chars=77,
        max_sentence_chars=50,
        seed=4,
        max_event_bytes=5000,
        idle_timeout=9.0,
        write_timeout=8.0,
        max_pending_requests=3,
        text_frontend=False,
    )


def test_engine_options_take_stop_runaway() -> None:
    assert load_settings([]).engine_options().stop_runaway is True
    assert load_settings(["--no-stop-runaway"]).engine_options().stop_runaway is False


def test_extra_models_from_flags_environment_and_file(tmp_path, monkeypatch) -> None:
    assert load_settings(["--extra-models", "a/Base", "b/VoiceDesign"]).extra_models == ["a/Base", "b/VoiceDesign"]
    monkeypatch.setenv("WYOMING_QWEN3TTS_EXTRA_MODELS", '["c/Base"]')
    assert load_settings([]).extra_models == ["c/Base"]
    monkeypatch.delenv("WYOMING_QWEN3TTS_EXTRA_MODELS")
    config = tmp_path / "c.toml"
    config.write_text('extra_models = ["d/Base"]\n')
    assert load_settings(["--config", str(config)]).extra_models == ["d/Base"]


def test_weights_from_flag_environment_and_file(tmp_path, monkeypatch) -> None:
    assert load_settings([]).engine_options().weights == "bf16"
    assert load_settings(["--weights", "int8"]).engine_options().weights == "int8"
    config = tmp_path / "c.toml"
    config.write_text('weights = "int8"\n')
    assert load_settings(["--config", str(config)]).weights == "int8"
    monkeypatch.setenv("WYOMING_QWEN3TTS_WEIGHTS", "bf16")
    assert load_settings(["--config", str(config)]).weights == "bf16"  # env over file
    with pytest.raises(SystemExit):
        load_settings(["--weights", "int4"])
    with pytest.raises(ValueError, match="unknown weights"):
        EngineOptions(weights="fp8")  # type: ignore[arg-type]


def test_max_streams_goes_up_to_the_batched_decoders_slots(capsys: pytest.CaptureFixture[str]) -> None:
    """max_streams may name any count the batched kernels step (auto already picks up to 64); one past is refused
    with a clear error, by the settings and by EngineOptions alike."""
    from wyoming_qwen3tts.backends.kernels.batched import MAX_SLOTS
    from wyoming_qwen3tts.options import MAX_STREAMS

    assert MAX_STREAMS == MAX_SLOTS == 64
    assert load_settings(["--max-streams", "64"]).engine_options().max_streams == 64
    assert EngineOptions(max_streams=24).max_streams == 24
    with pytest.raises(SystemExit):
        load_settings(["--max-streams", "65"])
    assert "less than or equal to 64" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"1\.\.64"):
        EngineOptions(max_streams=65)
