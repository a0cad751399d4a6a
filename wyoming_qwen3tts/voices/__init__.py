"""Speakers and presets -> Wyoming voices, and the choice of speaker/language/instruct for a request.

Every CustomVoice speaker becomes one Wyoming voice named after the speaker id; presets from the
configuration add more voices: a speaker plus a fixed language and/or a style instruction
(CustomVoice), a cloned voice from a reference clip (Base: `reference_audio`, its transcript
`reference_text`, or `x_vector_only`), or a designed voice (VoiceDesign: `design`, the voice's
description). A voices folder adds cloned voices without editing the config: NAME.wav (or .flac,
.ogg, .mp3) with its transcript in NAME.txt and optional settings in NAME.toml (scan_voice_folder).
A model serves the voices of its kind; the others are listed in the log as skipped.

Languages are advertised as two-letter ISO 639-1 codes ("en", "zh", ...).  Home Assistant lists
voices per language code and matches the assistant's language (e.g. "en-US", "de-DE", "zh-Hans")
against these codes by primary subtag, so a bare primary code shows every voice for every regional
variant; a regional code such as "en_US" would hide the voice from "en-GB" users.  The model speaks
each of its languages with every speaker, so each speaker voice lists all of them, its native
language first.  Clients may name a language as a locale tag ("en-US", "pt_BR", "zh-Hans-CN"), an
ISO 639-1 or 639-2 code ("de", "deu", "ger") or the engine's name ("german"); a list of voices for one
language (voices_for) leads with the voices native to it.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from wyoming.info import Attribution, TtsVoice
from wyoming.tts import SynthesizeVoice

from ..errors import UnknownLanguageError, UnknownSpeakerError
from ..model.config import MODEL_TYPE_NAMES, voice_kind

_LOGGER = logging.getLogger(__name__)

AUTO = "auto"
ATTRIBUTION = Attribution(name="Qwen", url="https://github.com/QwenLM/Qwen3-TTS")

# The CustomVoice speakers of every released Qwen3-TTS-12Hz CustomVoice checkpoint (model doc
# §2.4).  Used to answer describe before the model is loaded and for the human descriptions.
SPEAKER_DESCRIPTIONS: dict[str, str] = {
    "vivian": "Chinese; bright, slightly edgy young female",
    "serena": "Chinese; warm, gentle young female",
    "uncle_fu": "Chinese; seasoned low, mellow male",
    "dylan": "Chinese (Beijing dialect); youthful male",
    "eric": "Chinese (Sichuan dialect); lively Chengdu male, slightly husky",
    "ryan": "English; dynamic male",
    "aiden": "English; sunny American male",
    "ono_anna": "Japanese; playful female",
    "sohee": "Korean; warm female",
}

# Engine language name <-> ISO 639-1 code.  Order is the order voices list their languages.
LANGUAGE_CODES: dict[str, str] = {
    "chinese": "zh",
    "english": "en",
    "japanese": "ja",
    "korean": "ko",
    "german": "de",
    "french": "fr",
    "russian": "ru",
    "portuguese": "pt",
    "spanish": "es",
    "italian": "it",
}
DEFAULT_LANGUAGES: list[str] = [AUTO, *LANGUAGE_CODES]
# ISO 639-2 codes (bibliographic and terminology forms) of the engine's languages, for clients that send them.
_ISO639_2: dict[str, str] = {
    "zho": "chinese",
    "chi": "chinese",
    "eng": "english",
    "jpn": "japanese",
    "kor": "korean",
    "deu": "german",
    "ger": "german",
    "fra": "french",
    "fre": "french",
    "rus": "russian",
    "por": "portuguese",
    "spa": "spanish",
    "ita": "italian",
}
# The language each CustomVoice speaker speaks natively (model doc §2.4; dialect speakers: Chinese).
NATIVE_LANGUAGES: dict[str, str] = {
    "vivian": "chinese",
    "serena": "chinese",
    "uncle_fu": "chinese",
    "dylan": "chinese",
    "eric": "chinese",
    "ryan": "english",
    "aiden": "english",
    "ono_anna": "japanese",
    "sohee": "korean",
}


VoiceKind = Literal["custom_voice", "base", "voice_design"]  # the tts_model_type that speaks it
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
# A voice name becomes a Wyoming voice name and, for folder voices, a file stem: letters, digits, _ - . and spaces.
_VOICE_NAME = re.compile(r"\w[\w .-]{0,63}")


def check_voice_name(name: str) -> str:
    """`name` if it can be a voice name (and so a folder voice's file stem); ValueError saying why otherwise."""
    if not _VOICE_NAME.fullmatch(name):  # the whole name: "$" would let a trailing newline through
        raise ValueError(f"voice name {name!r}: use letters, digits, spaces, '_', '-' or '.' (64 at most)")
    return name


class VoicePreset(BaseModel):
    """A configured voice: a speaker with an optional fixed language and style instruction (CustomVoice), a
    cloned voice (Base: reference_audio), or a designed voice (VoiceDesign: design)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, description="voice name shown in Home Assistant")
    speaker: str | None = Field(default=None, min_length=1, description="CustomVoice speaker id, e.g. 'ryan'")
    reference_audio: Path | None = Field(default=None, description="Base: clip to clone (WAV/FLAC/OGG/MP3, 1-30 s)")
    reference_text: str | None = Field(default=None, description="Base: what is said in the clip (in-context cloning)")
    x_vector_only: bool = Field(
        default=False, description="Base: clone from the speaker embedding alone (no transcript)"
    )
    design: str | None = Field(default=None, min_length=1, description="VoiceDesign: the voice's description")
    language: str | None = Field(default=None, description="language code or name; none: auto-detect")
    instruct: str | None = Field(default=None, description="style instruction (1.7B CustomVoice models only)")
    description: str | None = Field(default=None, description="text shown in Home Assistant")

    @model_validator(mode="after")
    def _one_kind(self) -> VoicePreset:
        check_voice_name(self.name)
        given = [key for key in ("speaker", "reference_audio", "design") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(
                f"voice {self.name!r} needs exactly one of speaker, reference_audio or design, got {given or 'none'}"
            )
        if self.reference_audio is None and (self.reference_text is not None or self.x_vector_only):
            raise ValueError(f"voice {self.name!r}: reference_text and x_vector_only belong to a reference_audio voice")
        if self.instruct and self.speaker is None:
            raise ValueError(
                f"voice {self.name!r}: instruct is for speaker voices (a designed voice's style is its design)"
            )
        return self

    @property
    def kind(self) -> VoiceKind:
        return voice_kind(cloned=self.reference_audio is not None, speaker=self.design is None)  # type: ignore[return-value]


def scan_voice_folder(folder: Path) -> tuple[list[VoicePreset], list[str]]:
    """The cloned voices of a voices folder, and a message per file that could not become one.

    NAME.wav (.flac, .ogg, .mp3) is a voice named NAME; NAME.txt holds the clip's transcript (in-context
    cloning); NAME.toml may set language, description and x_vector_only. Only the folder's own files count
    (no subfolders, no links out of it), and only the headers of files are read here: the clips are checked
    when the model clones them.
    """
    voices: list[VoicePreset] = []
    problems: list[str] = []
    if not folder.is_dir():
        return voices, problems
    root = folder.resolve()
    for clip in sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES):
        try:
            if not clip.is_file() or clip.resolve().parent != root:
                raise ValueError("not a regular file inside the voices folder")
            extra: dict[str, Any] = {}
            settings = clip.with_suffix(".toml")
            if settings.is_file():
                extra = tomllib.loads(settings.read_text(encoding="utf-8"))
                unknown = set(extra) - {"language", "description", "x_vector_only"}
                if unknown:
                    raise ValueError(f"{settings.name}: unknown keys {sorted(unknown)}")
            transcript = clip.with_suffix(".txt")
            text = transcript.read_text(encoding="utf-8").strip() if transcript.is_file() else None
            voices.append(VoicePreset(name=clip.stem, reference_audio=clip, reference_text=text or None, **extra))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError, ValidationError) as err:
            problems.append(f"voices folder: {clip.name}: {err}")
    return voices, problems


@dataclass(frozen=True)
class VoiceChoice:
    """What one request is spoken with, in the engine's own names."""

    voice: str  # the Wyoming voice name, for logs
    speaker: str  # a CustomVoice speaker ("" for cloned and designed voices)
    language: str
    instruct: str | None  # style instruction; a designed voice's description
    clone: Any = None  # a cloned voice's ClonePrompt (model/prompt.py; not imported here: no torch at startup)


def language_name(value: str, languages: list[str]) -> str:
    """Map a client's language ("en", "en_US", "en-us", "pt-BR", "deu", "English", "auto") to an engine language name."""
    text = value.strip().lower()
    if not text:
        return AUTO
    if text in languages:
        return text
    primary = re.split(r"[-_]", text, maxsplit=1)[0]  # a locale tag's language subtag: en-US, pt_BR, zh-Hans-CN
    name = _ISO639_2.get(primary) or next((n for n, code in LANGUAGE_CODES.items() if code == primary), None)
    if name is not None and name in languages:
        return name
    raise UnknownLanguageError(f"Unknown language {value!r}; this model speaks {', '.join(languages)}")


def language_code(name: str) -> str:
    """Engine language name -> the code advertised to clients (the name itself when not a known one)."""
    return LANGUAGE_CODES.get(name, name)


class VoiceCatalog:
    """The voices one model offers: its speakers plus the presets of its kind.

    `model_type` None (the model is still loading): every preset is listed, so Home Assistant sees the
    configured voices from the start. Once it is known, presets of another kind are skipped with an error
    in the log (`skipped`), as are cloned voices without a prompt in `clones` (their clip failed to clone).
    """

    def __init__(
        self,
        speakers: list[str],
        languages: list[str],
        presets: list[VoicePreset],
        *,
        supports_instruct: bool = True,
        default_voice: str = "",
        version: str | None = None,
        model_type: VoiceKind | set[str] | None = "custom_voice",
        clones: dict[str, Any] | None = None,
    ) -> None:
        self.speakers = list(speakers)
        self.languages = [lang.lower() for lang in languages]
        self.supports_instruct = supports_instruct
        self.version = version
        # The kinds of voice the loaded models speak (None: not known yet, while loading).
        self.model_types: set[str] | None = {model_type} if isinstance(model_type, str) else model_type
        self.model_type = model_type if isinstance(model_type, str) else None  # the one kind, if one
        self.clones = dict(clones or {})
        self._by_speaker = {s.lower(): s for s in self.speakers}
        self.presets: dict[str, VoicePreset] = {}
        self.skipped: dict[str, str] = {}  # voice name -> why it is not offered
        for preset in presets:
            reason = self._unfit(preset)
            if reason is not None:
                self.skipped[preset.name] = reason
                _LOGGER.error("Voice %r is not offered: %s", preset.name, reason)
                continue
            self._check_preset(preset)
            self.presets[preset.name] = preset
        first = self.speakers[0] if self.speakers else next(iter(self.presets), "")
        self.default_voice = default_voice or first
        if self.default_voice and self._find(self.default_voice) is None:
            raise UnknownSpeakerError(f"Default voice {self.default_voice!r} is neither a speaker nor a preset")

    def _unfit(self, preset: VoicePreset) -> str | None:
        """Why the loaded models cannot speak the preset, or None."""
        kinds = self.model_types
        if kinds is None:
            return None
        if preset.kind in kinds:
            if preset.kind == "base" and preset.name not in self.clones:
                return "its reference clip could not be cloned (the log says why)"
            return None
        loaded = " and ".join(MODEL_TYPE_NAMES.get(k, k) for k in sorted(kinds))
        return f"it needs a {MODEL_TYPE_NAMES[preset.kind]} model, and the server loaded {loaded} only"

    def _check_preset(self, preset: VoicePreset) -> None:
        # Fail at startup, not on the first request, when the config names something unknown.
        if preset.name in self.presets:
            raise ValueError(f"Preset {preset.name!r} is defined twice")
        if preset.name.lower() in self._by_speaker:
            raise ValueError(f"Preset name {preset.name!r} clashes with a speaker name")
        if preset.language is not None:
            language_name(preset.language, self.languages)
        if preset.speaker is None:
            return
        if preset.speaker.lower() not in self._by_speaker:
            raise UnknownSpeakerError(
                f"Preset {preset.name!r} uses unknown speaker {preset.speaker!r}; speakers: {', '.join(self.speakers)}"
            )
        if preset.instruct and not self.supports_instruct:
            _LOGGER.warning("Preset %r: this model ignores style instructions", preset.name)

    def _find(self, name: str) -> VoiceChoice | None:
        if name in self.presets:
            preset = self.presets[name]
            language = language_name(preset.language, self.languages) if preset.language else AUTO
            if preset.kind == "base":
                return VoiceChoice(name, "", language, None, clone=self.clones.get(name))
            if preset.kind == "voice_design":
                return VoiceChoice(name, "", language, preset.design)
            assert preset.speaker is not None
            instruct = preset.instruct if (preset.instruct and self.supports_instruct) else None
            return VoiceChoice(name, self._by_speaker.get(preset.speaker.lower(), preset.speaker), language, instruct)
        speaker = self._by_speaker.get(name.lower())
        if speaker is not None:
            return VoiceChoice(speaker, speaker, AUTO, None)
        return None

    def resolve(self, voice: SynthesizeVoice | None) -> VoiceChoice:
        """Pick speaker, language and instruct for a request's voice.

        Home Assistant sends a name (and maybe a speaker option) but never a language, so the
        preset's language or auto-detection applies; a language is honoured only when a client
        sends one without a name.  A `speaker` option replaces the voice's speaker.
        """
        name = voice.name if voice and voice.name else None
        choice = self._find(name or self.default_voice)
        if choice is None:
            raise UnknownSpeakerError(f"Unknown voice {name!r}")
        if voice is not None and voice.speaker and choice.speaker:  # a speaker option for speaker voices only
            speaker = self._by_speaker.get(voice.speaker.lower())
            if speaker is None:
                raise UnknownSpeakerError(f"Unknown speaker {voice.speaker!r}")
            choice = replace(choice, speaker=speaker)
        if name is None and voice is not None and voice.language:
            choice = replace(choice, language=language_name(voice.language, self.languages))
        return choice

    def native_language(self, voice: str) -> str | None:
        """The engine language a voice speaks natively: its speaker's (model doc §2.4), or the language a preset
        fixes; None when unknown (a cloned or designed voice without a language)."""
        preset = self.presets.get(voice)
        if preset is not None:
            if preset.language and language_name(preset.language, self.languages) != AUTO:
                return language_name(preset.language, self.languages)
            voice = preset.speaker or ""
        native = NATIVE_LANGUAGES.get(voice.lower())
        return native if native in self.languages else None

    def tts_voices(self) -> list[TtsVoice]:
        """One TtsVoice per speaker, then one per preset; each lists its native language first."""
        spoken = [lang for lang in self.languages if lang != AUTO]
        voices = []
        for speaker in self.speakers:
            voices.append(
                self._tts_voice(
                    speaker, f"{speaker} ({SPEAKER_DESCRIPTIONS.get(speaker.lower(), 'Qwen3-TTS speaker')})", spoken
                )
            )
        for preset in self.presets.values():
            fixed = language_name(preset.language, self.languages) if preset.language else AUTO
            if preset.kind == "base":
                what = f"cloned from {preset.reference_audio.name if preset.reference_audio else 'a clip'}"
            elif preset.kind == "voice_design":
                what = f"designed: {preset.design}"
            else:
                what = f"{preset.speaker}, {preset.instruct}" if preset.instruct else str(preset.speaker)
            voices.append(
                self._tts_voice(
                    preset.name, preset.description or f"{preset.name} ({what})", [fixed] if fixed != AUTO else spoken
                )
            )
        return voices

    def _tts_voice(self, name: str, description: str, languages: list[str]) -> TtsVoice:
        native = self.native_language(name)
        ordered = sorted(languages, key=lambda lang: lang != native)  # stable: the model's order after the native one
        return TtsVoice(
            name=name,
            description=description,
            attribution=ATTRIBUTION,
            installed=True,
            version=self.version,
            languages=[language_code(lang) for lang in ordered],
        )

    def voices_for(self, language: str) -> list[TtsVoice]:
        """The voices that speak `language` (a code, locale tag or name), those native to it first, each group in
        describe's order. Raises UnknownLanguageError for a language the model does not speak."""
        name = language_name(language, self.languages)
        if name == AUTO:
            return self.tts_voices()
        code = language_code(name)
        voices = [v for v in self.tts_voices() if code in v.languages]
        return sorted(voices, key=lambda v: self.native_language(v.name) != name)
