"""Voices: speakers and presets as Wyoming voices, and the speaker/language/instruct choice."""

from __future__ import annotations

import pytest
from wyoming.tts import SynthesizeVoice

from wyoming_qwen3tts.errors import UnknownLanguageError, UnknownSpeakerError
from wyoming_qwen3tts.voices import (
    DEFAULT_LANGUAGES,
    SPEAKER_DESCRIPTIONS,
    VoiceCatalog,
    VoicePreset,
    language_name,
)

SPEAKERS = list(SPEAKER_DESCRIPTIONS)
PRESETS = [
    VoicePreset(name="ryan-calm", speaker="ryan", instruct="Speak calmly.", description="Ryan, calm"),
    VoicePreset(name="anna-ja", speaker="Ono_Anna", language="ja_JP"),
]


def catalog(**kwargs: object) -> VoiceCatalog:
    return VoiceCatalog(SPEAKERS, DEFAULT_LANGUAGES, PRESETS, version="1.0", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("en", "english"),
        ("en_US", "english"),
        ("en-gb", "english"),
        ("English", "english"),
        ("zh-Hans", "chinese"),
        ("zh_CN", "chinese"),
        ("ja", "japanese"),
        ("pt-BR", "portuguese"),
        ("auto", "auto"),
        ("", "auto"),
    ],
)
def test_language_name(value: str, expected: str) -> None:
    assert language_name(value, DEFAULT_LANGUAGES) == expected


def test_unknown_language() -> None:
    with pytest.raises(UnknownLanguageError):
        language_name("nl", DEFAULT_LANGUAGES)


def test_tts_voices() -> None:
    voices = catalog().tts_voices()
    assert [v.name for v in voices] == [*SPEAKERS, "ryan-calm", "anna-ja"]
    codes = ["zh", "en", "ja", "ko", "de", "fr", "ru", "pt", "es", "it"]
    for voice in voices[:9]:
        assert sorted(voice.languages) == sorted(codes)
        assert voice.installed and voice.version == "1.0"
        assert voice.attribution.name == "Qwen" and voice.attribution.url == "https://github.com/QwenLM/Qwen3-TTS"
    assert "Sichuan" in voices[SPEAKERS.index("eric")].description  # type: ignore[operator]
    assert voices[9].description == "Ryan, calm" and sorted(voices[9].languages) == sorted(codes)
    assert voices[10].languages == ["ja"] and voices[10].description == "anna-ja (Ono_Anna)"


def test_resolve() -> None:
    cat = catalog()
    assert cat.resolve(None) == cat.resolve(SynthesizeVoice()) and cat.resolve(None).speaker == "vivian"
    choice = cat.resolve(SynthesizeVoice(name="ryan-calm"))
    assert (choice.speaker, choice.language, choice.instruct) == ("ryan", "auto", "Speak calmly.")
    choice = cat.resolve(SynthesizeVoice(name="anna-ja"))
    assert (choice.speaker, choice.language, choice.instruct) == ("ono_anna", "japanese", None)
    # Voice names are matched case-insensitively for speakers; a speaker option overrides the speaker.
    assert cat.resolve(SynthesizeVoice(name="AIDEN")).speaker == "aiden"
    choice = cat.resolve(SynthesizeVoice(name="ryan-calm", speaker="sohee"))
    assert (choice.speaker, choice.instruct) == ("sohee", "Speak calmly.")
    # A language without a name is honoured.
    assert cat.resolve(SynthesizeVoice(language="fr-FR")).language == "french"
    with pytest.raises(UnknownSpeakerError):
        cat.resolve(SynthesizeVoice(name="nobody"))
    with pytest.raises(UnknownSpeakerError):
        cat.resolve(SynthesizeVoice(name="ryan", speaker="nobody"))


def test_default_voice_and_instruct_support() -> None:
    assert catalog(default_voice="anna-ja").resolve(None).language == "japanese"
    assert catalog(supports_instruct=False).resolve(SynthesizeVoice(name="ryan-calm")).instruct is None
    with pytest.raises(UnknownSpeakerError):
        catalog(default_voice="nobody")


@pytest.mark.parametrize(
    "preset",
    [
        VoicePreset(name="x", speaker="nobody"),
        VoicePreset(name="ryan", speaker="aiden"),
        VoicePreset(name="x", speaker="ryan", language="klingon"),
    ],
)
def test_bad_presets_rejected(preset: VoicePreset) -> None:
    with pytest.raises((UnknownSpeakerError, UnknownLanguageError, ValueError)):
        VoiceCatalog(SPEAKERS, DEFAULT_LANGUAGES, [preset])
    with pytest.raises(ValueError):
        VoiceCatalog(SPEAKERS, DEFAULT_LANGUAGES, [PRESETS[0], PRESETS[0]])
