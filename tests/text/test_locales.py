"""Languages as Home Assistant names them: locale tags accepted wherever a language is (voices/__init__.py,
the Wyoming voice's language, HTTP `language`), and voice lists per language led by the voices native to it."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine
from in_process_http import serve
from in_process_wyoming import read_until, start_server
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_qwen3tts.errors import UnknownLanguageError
from wyoming_qwen3tts.voices import (
    DEFAULT_LANGUAGES,
    SPEAKER_DESCRIPTIONS,
    VoiceCatalog,
    VoicePreset,
    language_code,
    language_name,
)

pytestmark = pytest.mark.timeout(60)

ENGINE_LANGUAGES = FakeEngine.languages


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("en-US", "english"),
        ("en-GB", "english"),
        ("EN_au", "english"),
        ("de-DE", "german"),
        ("de-CH", "german"),
        ("zh-CN", "chinese"),
        ("zh-Hans-CN", "chinese"),
        ("zh-TW", "chinese"),
        ("pt-BR", "portuguese"),
        ("pt_PT", "portuguese"),
        ("es-419", "spanish"),
        ("fr-CA", "french"),
        ("ja-JP", "japanese"),
        ("ko-KR", "korean"),
        ("ru-RU", "russian"),
        ("it-IT", "italian"),
        ("deu", "german"),
        ("ger", "german"),
        ("fre", "french"),
        ("zho", "chinese"),
        (" Japanese ", "japanese"),
        ("", "auto"),
    ],
)
def test_locale_tags_name_the_engine_language(tag: str, expected: str) -> None:
    assert language_name(tag, ENGINE_LANGUAGES) == expected


@pytest.mark.parametrize("tag", ["nl-NL", "sv", "e", "klingon", "us-EN"])
def test_other_languages_are_refused_with_the_list(tag: str) -> None:
    with pytest.raises(UnknownLanguageError, match="this model speaks"):
        language_name(tag, ENGINE_LANGUAGES)


def catalog() -> VoiceCatalog:
    presets = [
        VoicePreset(name="ryan-de", speaker="ryan", language="de-DE"),
        VoicePreset(name="sohee-calm", speaker="sohee", instruct="Calm."),
    ]
    return VoiceCatalog(list(SPEAKER_DESCRIPTIONS), DEFAULT_LANGUAGES, presets)


def test_describe_lists_each_voice_native_language_first() -> None:
    voices = {v.name: v.languages for v in catalog().tts_voices()}
    everything = sorted(voices["vivian"])
    assert voices["ryan"][0] == "en" and voices["aiden"][0] == "en" and voices["ono_anna"][0] == "ja"
    assert voices["sohee"][0] == "ko" and voices["eric"][0] == "zh" and voices["sohee-calm"][0] == "ko"
    assert all(sorted(v) == everything for name, v in voices.items() if name != "ryan-de")  # nothing dropped
    assert voices["ryan-de"] == ["de"]  # a preset's fixed language, given as a locale tag


@pytest.mark.parametrize(
    ("tag", "leading"),
    [
        ("en-US", ["ryan", "aiden"]),
        ("en-GB", ["ryan", "aiden"]),
        ("ja-JP", ["ono_anna"]),
        ("ko-KR", ["sohee", "sohee-calm"]),
        ("zh-CN", ["vivian", "serena", "uncle_fu", "dylan", "eric"]),
        ("de-DE", ["ryan-de"]),
        ("pt-BR", []),
    ],
)
def test_each_language_list_is_led_by_its_native_voices(tag: str, leading: list[str]) -> None:
    names = [v.name for v in catalog().voices_for(tag)]
    assert names[: len(leading)] == leading
    assert len(names) == len(set(names))
    code = language_code(language_name(tag, DEFAULT_LANGUAGES))
    expected = {v.name for v in catalog().tts_voices() if code in v.languages}
    assert set(names) == expected  # every voice that speaks it, and only those ("ryan-de" speaks German only)


async def test_wyoming_voice_language_as_a_locale_tag() -> None:
    engine = FakeEngine()
    server, port, service = await start_server(engine)
    try:
        for tag, expected in (("de-DE", "german"), ("pt-BR", "portuguese"), ("zh-Hans", "chinese")):
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Synthesize(text="Hallo.", voice=SynthesizeVoice(language=tag)).event())
                await read_until(client, "audio-stop")
            assert engine.requests[-1].language == expected
    finally:
        await server.stop()
        service.shutdown()


async def test_http_language_and_voice_list_per_locale() -> None:
    async with serve() as api:
        response = await api.speak(input="Olá.", voice="ryan", language="pt-BR", response_format="pcm")
        assert response.status == 200, await response.text()
        await response.read()
        assert api.engine.requests[-1].language == "portuguese"

        listed = await (await api.http.get(f"{api.url}/v1/audio/voices", params={"language": "ko-KR"})).json()
        assert listed["data"][0]["id"] == "sohee"
        assert all("ko" in v["languages"] for v in listed["data"])
        everything = await (await api.http.get(f"{api.url}/v1/audio/voices")).json()
        assert len(everything["data"]) >= len(listed["data"])
        bad = await api.http.get(f"{api.url}/v1/audio/voices", params={"language": "nl-NL"})
        assert bad.status == 400 and (await bad.json())["error"]["param"] == "language"
