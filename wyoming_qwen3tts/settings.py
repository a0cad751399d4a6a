"""Server settings: command line over environment (WYOMING_QWEN3TTS_*) over TOML file over defaults.

The command line is an argparse parser generated from the Settings fields, so every setting has
exactly one name in all three places: field `first_chunk_frames` is `--first-chunk-frames`,
`WYOMING_QWEN3TTS_FIRST_CHUNK_FRAMES` and `first_chunk_frames = ...` in the TOML file.  Voice
presets (`[[voices]]`) are a list of tables, so they come from the TOML file or from the
environment as JSON, not from the command line.
"""

from __future__ import annotations

import argparse
import contextvars
import logging
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from . import __version__
from .announcements import AnnouncementCache
from .model.config import DEFAULT_MODEL
from .options import MAX_STREAMS, QUEUED_MIN, QUEUED_PER_STREAM, Backend, EngineOptions, TextOptions, Weights
from .request import SamplingOverrides
from .voices import VoicePreset

ENV_PREFIX = "WYOMING_QWEN3TTS_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
DEFAULT_ZEROCONF_NAME = "qwen3-tts"

# The TOML file of the Settings being built; a context variable because pydantic-settings asks
# the class (not the instance) for its sources.
_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("toml_file", default=None)


class Settings(BaseSettings):
    """Every setting of the server, with its default."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    # --- server ---
    uri: str = Field("tcp://0.0.0.0:10200", description="where to listen: tcp://HOST:PORT, unix://PATH or stdio://")
    zeroconf: str | None = Field(None, description="announce the server over mDNS under this name (tcp:// only)")
    streaming: bool = Field(True, description="accept streamed text (synthesize-start/-chunk/-stop)")
    debug: bool = Field(False, description="log at DEBUG level")
    log_format: str = Field(logging.BASIC_FORMAT, description="Python logging format string")
    # --- HTTP: OpenAI-compatible speech API, web page, metrics (wyoming_qwen3tts/http) ---
    http: str | None = Field(
        None, description="also serve the OpenAI speech API, web page and /metrics here: tcp://HOST:PORT (none: off)"
    )
    api_key: SecretStr | None = Field(
        None, description="HTTP clients must send 'Authorization: Bearer KEY' (none: no key)"
    )
    # --- limits (docs/reliability.md) ---
    max_connections: int = Field(
        64, ge=1, description="most client connections at once; more are refused with an error"
    )
    max_event_bytes: int = Field(
        1_048_576, ge=4096, description="largest event a client may send (header + data + payload)"
    )
    idle_timeout: float = Field(
        120.0, gt=0, description="seconds a client may stay silent while no request of its is being spoken"
    )
    write_timeout: float = Field(
        60.0, gt=0, description="seconds a client may take to accept audio before it is dropped"
    )
    drain_seconds: float = Field(
        8.0, ge=0, description="on SIGTERM, seconds to finish requests in progress before cancelling them"
    )
    max_pending_requests: int = Field(
        8,
        ge=1,
        description="most requests one connection may have queued or in progress; one more ends it with an error",
    )
    max_uploads: int = Field(2, ge=1, description="HTTP voice uploads received at once; one more is refused with 429")
    upload_timeout: float = Field(
        120.0, gt=0, description="seconds an HTTP voice upload may take to arrive whole; then 408"
    )
    max_queued_streams: int | None = Field(
        None,
        ge=0,
        description=f"most requests waiting for a decode slot, all connections together; one more is refused at once with an error (none: {QUEUED_PER_STREAM} x max_streams, at least {QUEUED_MIN})",
    )
    # --- model ---
    model: str = Field(DEFAULT_MODEL, description="Hugging Face repo id or local directory")
    extra_models: list[str] = Field(
        default_factory=list,
        description="more models to load beside model, one of each type (e.g. a Base model for cloned voices)",
    )
    data_dir: Path | None = Field(None, description="where downloaded models are kept (default: Hugging Face cache)")
    device: str = Field(EngineOptions.device, description="torch device: auto, cuda, cuda:1, cpu")
    dtype: str = Field(EngineOptions.dtype, description="weights dtype: auto, bfloat16, float16, float32")
    backend: Backend = Field(EngineOptions.backend, description="decode loop: fused kernels or plain torch")
    weights: Weights = Field(
        EngineOptions.weights,
        description="the Talker's and CodePredictor's matrices: bf16 (as loaded, in dtype) or int8 (quantized at load: half their bytes and memory)",
    )
    max_streams: int = Field(
        EngineOptions.max_streams,
        ge=0,
        le=MAX_STREAMS,
        description="requests decoded at once on the GPU's batched kernels (0: as many as the GPU's free memory holds; 1: one at a time)",
    )
    batch_invariant: bool = Field(
        EngineOptions.batch_invariant,
        description="a request's audio never depends on other requests decoded beside it (a request decoding alone is then ~13 % slower, 32 or more at once up to 2x slower: they stay off the vendor BLAS)",
    )
    prefix_cache_mb: int = Field(
        EngineOptions.prefix_cache_mb,
        ge=0,
        description="MiB of voices' prompt-prefix K/V kept on the device, so a voice's fixed prompt positions are prefilled once (0: off)",
    )
    # --- streaming audio ---
    first_chunk_frames: int = Field(
        EngineOptions.first_chunk_frames, ge=1, description="frames (80 ms each) in the first audio chunk"
    )
    chunk_frames: int = Field(
        EngineOptions.chunk_frames,
        ge=1,
        description="largest later audio chunk (groups double from the first up to this)",
    )
    max_frames: int = Field(
        EngineOptions.max_frames, ge=1, description="most frames spoken per sentence (12.5 frames = 1 s)"
    )
    stop_runaway: bool = Field(
        EngineOptions.stop_runaway,
        description="end a sentence at a frame budget from its length, or earlier when its codes loop",
    )
    # --- text ---
    max_text_chars: int = Field(EngineOptions.max_text_chars, ge=1, description="longest text accepted per request")
    max_sentence_chars: int = Field(
        TextOptions.max_sentence_chars, ge=20, description="longer sentences are split at a comma or space"
    )
    text_frontend: bool = Field(
        TextOptions.text_frontend,
        description="speak Markdown, emoji, links and numbers as words (off: the text as written)",
    )
    # --- voices ---
    voice: str = Field("", description="voice used when a request names none (empty: the first speaker)")
    voices: list[VoicePreset] = Field(default_factory=list, description="voice presets ([[voices]] tables)")
    voices_dir: Path | None = Field(
        None, description="folder of cloned voices, NAME.wav + NAME.txt (default: DATA_DIR/voices)"
    )
    watch_voices: bool = Field(
        True,
        description="offer voices added to the voices folder (and withdraw removed ones) while running, without a restart",
    )
    # --- announcement cache (announcements.py) ---
    announcement_cache: bool = Field(
        True,
        description="replay the audio of a sentence spoken before with the same voice, language, style and sampling instead of synthesizing it again (a sampled voice keeps its first take)",
    )
    announcement_cache_mb: float = Field(
        64.0, ge=0, description="memory for replayed sentences, in MB (least recently used dropped first)"
    )
    announcement_disk_mb: float = Field(
        512.0,
        ge=0,
        description="disk for replayed sentences under DATA_DIR/announcements, in MB (0, or no data_dir: memory only)",
    )
    # --- sampling (unset: the model's generation_config.json) ---
    seed: int | None = Field(TextOptions.seed, description="random seed for every sentence (none: random)")
    greedy: bool = Field(False, description="greedy decoding instead of sampling")
    temperature: float | None = Field(None, gt=0, description="sampling temperature")
    top_k: int | None = Field(None, ge=0, description="top-k (0: off)")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling threshold")
    repetition_penalty: float | None = Field(None, gt=0, description="repetition penalty")
    subtalker_temperature: float | None = Field(None, gt=0, description="code predictor temperature")
    subtalker_top_k: int | None = Field(None, ge=0, description="code predictor top-k")
    subtalker_top_p: float | None = Field(None, gt=0, le=1, description="code predictor top-p")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init = the command line; earlier sources win.
        toml_file = _TOML_FILE.get()
        if toml_file is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=toml_file))

    def values_for(self, options: type) -> dict[str, Any]:
        """These settings' values for the fields of an options dataclass that bear their names."""
        names = {f.name for f in fields(options)} & set(type(self).model_fields)
        return {name: getattr(self, name) for name in names}

    def sampling(self) -> SamplingOverrides:
        """The sampling settings given, over the model's generation_config.json."""
        return SamplingOverrides(**self.values_for(SamplingOverrides))

    def voice_folder(self) -> Path | None:
        """The voices folder: voices_dir, else DATA_DIR/voices, else none."""
        if self.voices_dir is not None:
            return self.voices_dir
        return self.data_dir / "voices" if self.data_dir is not None else None

    def announcements(self) -> AnnouncementCache:
        """The announcement cache these settings ask for (its disk tier indexed now, before serving)."""
        folder = self.data_dir / "announcements" if self.data_dir is not None else None
        return AnnouncementCache(
            memory_mb=self.announcement_cache_mb,
            folder=folder,
            disk_mb=self.announcement_disk_mb,
            enabled=self.announcement_cache,
        )

    def engine_options(self) -> EngineOptions:
        folder = self.voice_folder()
        cache = folder / ".prompts" if folder is not None else None
        return EngineOptions(**self.values_for(EngineOptions), sampling=self.sampling(), voice_cache_dir=cache)


_SAMPLING = {f.name for f in fields(SamplingOverrides)} - {"greedy"}


def _scalar_type(annotation: Any) -> Any:
    """int | None -> int, so argparse can convert the value."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def build_parser() -> argparse.ArgumentParser:
    """One flag per scalar setting; defaults are SUPPRESSed so only given flags override."""
    parser = argparse.ArgumentParser(
        prog="wyoming-qwen3tts",
        description="Wyoming text-to-speech server for Qwen3-TTS CustomVoice",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", type=Path, help=f"TOML settings file (also ${CONFIG_ENV})")
    parser.add_argument("--version", action="version", version=__version__)
    for name, info in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = info.get_default(call_default_factory=True)
        # argparse %-formats help strings; the log format default contains %(...)s.
        shown = "the model's generation_config.json" if name in _SAMPLING else repr(default)
        help_text = f"{info.description} (default: {shown})".replace("%", "%%")
        kind = _scalar_type(info.annotation)
        if name == "voices":
            continue
        if name == "extra_models":
            parser.add_argument(flag, nargs="*", metavar="MODEL", help=help_text)
            continue
        if name == "zeroconf":
            parser.add_argument(flag, nargs="?", const=DEFAULT_ZEROCONF_NAME, metavar="NAME", help=help_text)
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        elif typing.get_origin(kind) is Literal:
            parser.add_argument(flag, choices=typing.get_args(kind), help=help_text)
        else:
            parser.add_argument(flag, type=kind, help=help_text)
    return parser


def load_settings(argv: Sequence[str] | None = None) -> Settings:
    """Parse the command line and build Settings from all sources (errors exit via argparse)."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    config = args.pop("config", None) or os.environ.get(CONFIG_ENV) or None
    config_path = Path(config) if config else None
    if config_path is not None and not config_path.is_file():
        # TomlConfigSettingsSource silently ignores a missing file; a typo must not.
        parser.error(f"config file not found: {config_path}")
    token = _TOML_FILE.set(config_path)
    try:
        return Settings(**args)
    except ValidationError as err:
        parser.error(str(err))
    finally:
        _TOML_FILE.reset(token)
