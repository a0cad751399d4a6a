"""Speakers and presets -> Wyoming voices, and the choice of speaker/language/instruct for a request.

Every CustomVoice speaker becomes one Wyoming voice named after the speaker id; presets from the
configuration add more voices (a speaker plus a fixed language and/or a style instruction).

Languages are advertised as two-letter ISO 639-1 codes ("en", "zh", ...).  Home Assistant lists
voices per language code and matches the assistant's language (e.g. "en-US", "de-DE", "zh-Hans")
against these codes by primary subtag, so a bare primary code shows every voice for every regional
variant; a regional code such as "en_US" would hide the voice from "en-GB" users.  The model speaks
each of its languages with every speaker, so each speaker voice lists all of them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field
from wyoming.info import Attribution, TtsVoice
from wyoming.tts import SynthesizeVoice

from .errors import UnknownLanguageError, UnknownSpeakerError

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


class VoicePreset(BaseModel):
    """A configured voice: one speaker with an optional fixed language and style instruction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="voice name shown in Home Assistant")
    speaker: str = Field(min_length=1, description="CustomVoice speaker id, e.g. 'ryan'")
    language: str | None = Field(default=None, description="language code or name; none: auto-detect")
    instruct: str | None = Field(default=None, description="style instruction (1.7B models only)")
    description: str | None = Field(default=None, description="text shown in Home Assistant")


@dataclass(frozen=True)
class VoiceChoice:
    """What one request is spoken with, in the engine's own names."""

    voice: str  # the Wyoming voice name, for logs
    speaker: str
    language: str
    instruct: str | None


def language_name(value: str, languages: list[str]) -> str:
    """Map a client's language ("en", "en_US", "en-us", "English", "auto") to an engine language name."""
    text = value.strip().lower()
    if not text:
        return AUTO
    if text in languages:
        return text
    primary = re.split(r"[-_]", text, maxsplit=1)[0]
    for name, code in LANGUAGE_CODES.items():
        if primary == code and name in languages:
            return name
    raise UnknownLanguageError(f"Unknown language {value!r}; this model speaks {', '.join(languages)}")


def language_code(name: str) -> str:
    """Engine language name -> the code advertised to clients (the name itself when not a known one)."""
    return LANGUAGE_CODES.get(name, name)


class VoiceCatalog:
    """The voices one model offers: its speakers plus the configured presets."""

    def __init__(
        self,
        speakers: list[str],
        languages: list[str],
        presets: list[VoicePreset],
        *,
        supports_instruct: bool = True,
        default_voice: str = "",
        version: str | None = None,
    ) -> None:
        self.speakers = list(speakers)
        self.languages = [lang.lower() for lang in languages]
        self.supports_instruct = supports_instruct
        self.version = version
        self._by_speaker = {s.lower(): s for s in self.speakers}
        self.presets: dict[str, VoicePreset] = {}
        for preset in presets:
            self._check_preset(preset)
            self.presets[preset.name] = preset
        self.default_voice = default_voice or (self.speakers[0] if self.speakers else "")
        if self.default_voice and self._find(self.default_voice) is None:
            raise UnknownSpeakerError(f"Default voice {self.default_voice!r} is neither a speaker nor a preset")

    def _check_preset(self, preset: VoicePreset) -> None:
        # Fail at startup, not on the first request, when the config names something unknown.
        if preset.speaker.lower() not in self._by_speaker:
            raise UnknownSpeakerError(
                f"Preset {preset.name!r} uses unknown speaker {preset.speaker!r}; speakers: {', '.join(self.speakers)}"
            )
        if preset.name.lower() in self._by_speaker:
            raise ValueError(f"Preset name {preset.name!r} clashes with a speaker name")
        if preset.name in self.presets:
            raise ValueError(f"Preset {preset.name!r} is defined twice")
        if preset.language is not None:
            language_name(preset.language, self.languages)
        if preset.instruct and not self.supports_instruct:
            _LOGGER.warning("Preset %r: this model ignores style instructions", preset.name)

    def _find(self, name: str) -> VoiceChoice | None:
        if name in self.presets:
            preset = self.presets[name]
            language = language_name(preset.language, self.languages) if preset.language else AUTO
            instruct = preset.instruct if (preset.instruct and self.supports_instruct) else None
            return VoiceChoice(name, self._by_speaker[preset.speaker.lower()], language, instruct)
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
        if voice is not None and voice.speaker:
            speaker = self._by_speaker.get(voice.speaker.lower())
            if speaker is None:
                raise UnknownSpeakerError(f"Unknown speaker {voice.speaker!r}")
            choice = VoiceChoice(choice.voice, speaker, choice.language, choice.instruct)
        if name is None and voice is not None and voice.language:
            choice = VoiceChoice(choice.voice, choice.speaker, language_name(voice.language, self.languages), choice.instruct)
        return choice

    def tts_voices(self) -> list[TtsVoice]:
        """One TtsVoice per speaker, then one per preset."""
        spoken = [language_code(lang) for lang in self.languages if lang != AUTO]
        voices = [
            TtsVoice(
                name=speaker,
                description=f"{speaker} ({SPEAKER_DESCRIPTIONS.get(speaker.lower(), 'Qwen3-TTS speaker')})",
                attribution=ATTRIBUTION,
                installed=True,
                version=self.version,
                languages=list(spoken),
            )
            for speaker in self.speakers
        ]
        for preset in self.presets.values():
            languages = (
                [language_code(language_name(preset.language, self.languages))]
                if preset.language and language_name(preset.language, self.languages) != AUTO
                else list(spoken)
            )
            style = f", {preset.instruct}" if preset.instruct else ""
            voices.append(
                TtsVoice(
                    name=preset.name,
                    description=preset.description or f"{preset.name} ({preset.speaker}{style})",
                    attribution=ATTRIBUTION,
                    installed=True,
                    version=self.version,
                    languages=languages,
                )
            )
        return voices
