"""Several loaded models behind the one engine interface the server uses: each request goes to the model of its
voice's kind (a speaker: CustomVoice, a cloned voice: Base, a designed voice: VoiceDesign).

The server's worker thread runs every job, so the models take turns on the GPU sentence by sentence, as the
requests of one model do; each keeps its own weights, decode backend and codec.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from .announcements import combined_identity
from .errors import VoiceError
from .model.config import MODEL_TYPE_NAMES, voice_kind
from .request import AudioChunk, SynthesisRequest

if TYPE_CHECKING:
    from .engine import Engine, Validated
    from .model.prompt import ClonePrompt
    from .voices import VoicePreset


class Speaker(Protocol):
    """What the service and the entry point need of the loaded model(s): an Engine, or an EngineSet."""

    @property
    def speakers(self) -> list[str]: ...

    @property
    def languages(self) -> list[str]: ...

    @property
    def supports_instruct(self) -> bool: ...

    @property
    def model_types(self) -> set[str]: ...  # the kinds of voice it speaks (voice_kind's values)

    @property
    def max_streams(self) -> int: ...  # requests decoded at once

    @property
    def clone_prompts(self) -> dict[str, ClonePrompt]: ...  # cloned voices by name (the Base model's)

    def clone_voices(self, presets: Sequence[VoicePreset]) -> dict[str, str]: ...

    def announcement_identity(self) -> str: ...  # what identifies its audio in the announcement cache's keys

    def warm_up(self) -> float: ...  # before serving: the first request pays for no capture or lazy init

    def warm_thread(self) -> None: ...  # on each synthesis thread before serving

    def synthesize(self, request: SynthesisRequest, cancel: threading.Event | None = None) -> Iterator[AudioChunk]: ...

    def validate(self, request: SynthesisRequest) -> Validated: ...


class EngineSet:
    """One engine per model type; the first given is the one whose voices a request without a kind gets."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("no engine")
        self.by_kind: dict[str, Engine] = {}
        for engine in engines:
            if engine.model_type in self.by_kind:
                raise VoiceError(
                    f"two {MODEL_TYPE_NAMES[engine.model_type]} models are configured; load one model of each type"
                )
            self.by_kind[engine.model_type] = engine
        self.engines = list(engines)

    # -- what the catalog reads ----------------------------------------------------------------------
    @property
    def model_types(self) -> set[str]:
        return set(self.by_kind)

    @property
    def speakers(self) -> list[str]:
        custom = self.by_kind.get("custom_voice")
        return list(custom.speakers) if custom is not None else []

    @property
    def languages(self) -> list[str]:
        seen: dict[str, None] = {}
        for engine in self.engines:
            seen.update(dict.fromkeys(engine.languages))
        return list(seen)

    @property
    def supports_instruct(self) -> bool:
        custom = self.by_kind.get("custom_voice")
        return custom.supports_instruct if custom is not None else True

    @property
    def max_streams(self) -> int:
        """Requests decoded at once, all engines together (each routes its voices' requests to its own slots)."""
        return sum(engine.max_streams for engine in self.engines)

    @property
    def clone_prompts(self) -> dict[str, ClonePrompt]:
        base = self.by_kind.get("base")
        return base.clone_prompts if base is not None else {}  # the Base engine's own: the server adds and removes

    def clone_voices(self, presets: Sequence[VoicePreset]) -> dict[str, str]:
        base = self.by_kind.get("base")
        return base.clone_voices(presets) if base is not None else {}

    # -- requests ------------------------------------------------------------------------------------
    def engine_for(self, request: SynthesisRequest) -> Engine:
        kind = voice_kind(cloned=request.clone is not None, speaker=bool(request.speaker))
        engine = self.by_kind.get(kind)
        if engine is None:
            raise VoiceError(f"this voice needs a {MODEL_TYPE_NAMES[kind]} model, which is not loaded")
        return engine

    def synthesize(self, request: SynthesisRequest, cancel: threading.Event | None = None) -> Iterator[AudioChunk]:
        return self.engine_for(request).synthesize(request, cancel)

    def validate(self, request: SynthesisRequest) -> Validated:
        return self.engine_for(request).validate(request)

    def announcement_identity(self) -> str:
        return combined_identity([engine.announcement_identity() for engine in self.engines])

    def warm_up(self) -> float:
        return sum(engine.warm_up() for engine in self.engines)

    def warm_thread(self) -> None:
        for engine in self.engines:
            engine.warm_thread()
