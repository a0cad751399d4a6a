"""Streamed replies keep their sentences: the same text cut anywhere gives the same spoken sentences.

A number or abbreviation never ends a sentence ("3.5", "1.000,50 €", "Dr.", "z. B.", "am 3. Mai"),
a Markdown list item, heading or table row is a sentence of its own, and code is not read.
"""

from __future__ import annotations

import random

import pytest
from llm_replies import REPLIES

from wyoming_qwen3tts.text.sentences import split_sentences
from wyoming_qwen3tts.text.stream import DotGuard, SpokenSentences, spoken_sentences


def _stream(text: str, rng: random.Random, language: str, largest: int) -> list:
    stream = SpokenSentences(language)
    out = []
    i = 0
    while i < len(text):
        n = rng.randint(1, largest)
        out += stream.feed(text[i : i + n])
        i += n
    return out + stream.finish()


@pytest.mark.parametrize("language", sorted(REPLIES))
@pytest.mark.parametrize("given", ["auto", "own"])
def test_random_fragments_give_the_one_shot_sentences(language, given):
    text = REPLIES[language]
    language_arg = language if given == "own" else "auto"
    whole = spoken_sentences(text, language_arg)
    assert len(whole) >= 3
    rng = random.Random(f"{language}-{given}")
    for trial in range(60):
        assert _stream(text, rng, language_arg, largest=(1, 3, 8, 40)[trial % 4]) == whole


def test_every_character_alone():
    text = REPLIES["german"]
    stream = SpokenSentences("german")
    pieces = [s for ch in text for s in stream.feed(ch)] + stream.finish()
    assert pieces == spoken_sentences(text, "german")


def test_english_reply_sentences():
    spoken = [s.spoken for s in spoken_sentences(REPLIES["english"], "english")]
    assert spoken == [
        "Your morning",
        "Good morning!",
        "It's twenty-one point five degrees Celsius in the living room.",
        "Call Doctor Smith at five P M. today (for example about the third invoice).",
        "Buy two liters of milk for three dollars and fifty cents at example dot com.",
        "The U.S. office opens on May third, twenty twenty-four.",
        "Room: Kitchen, Temp: nineteen degrees Celsius.",
        "Room: Bath, Temp: twenty-three point five degrees Celsius.",
        "That's all.",
        "Anything else?",
    ]


def test_german_numbers_and_abbreviations_never_split():
    sentences = spoken_sentences(REPLIES["german"], "german")
    assert [s.text for s in sentences] == [
        "Wetter heute",
        "Das ist z. B. ein Test.",
        "Wir treffen uns am 3. Mai in Berlin.",
        "Der 2. Platz geht an Nr. 5 hier.",
        "Es kostet 3.5 Euro oder 1.000,50 €, d. h. ca. 12 % mehr.",
        "Erstens: 21 °C",
        "Zweitens: 14:30 Uhr",
        "Hinweis: bzw. morgen -3 °C.",
        "Fertig.",
        "Bis bald!",  # the emoji after it is a piece of its own, with nothing to say
    ]
    assert sentences[2].spoken == "Wir treffen uns am dritten Mai in Berlin."
    assert sentences[4].spoken == (
        "Es kostet drei Komma fünf Euro oder tausend Euro und fünfzig Cent, das heißt circa zwölf Prozent mehr."
    )
    assert all(s.language == "german" for s in sentences)


def test_list_items_are_sentences():
    text = "Steps:\n- Open the app\n- Tap Settings\n1. Pick a room\n2. Done"
    assert [s.spoken for s in spoken_sentences(text, "english")] == [
        "Steps:",
        "Open the app",
        "Tap Settings",
        "Pick a room",
        "Done",
    ]


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("It costs 3.5 euros. Then stop.", ["It costs 3.5 euros.", "Then stop."]),
        ("Es kostet 1.000,50 €. Gut.", ["Es kostet 1.000,50 €.", "Gut."]),
        ("Ask Dr. Who. Then go.", ["Ask Dr. Who.", "Then go."]),
        ("Das ist z. B. gut. Ja.", ["Das ist z. B. gut.", "Ja."]),
        ("Am 3. Mai. Dann.", ["Am 3. Mai.", "Dann."]),
        ("Es waren 3. Dann kam Nr. 4.", ["Es waren 3.", "Dann kam Nr. 4."]),
        ("Wait until 5 p.m. today. Ok.", ["Wait until 5 p.m. today.", "Ok."]),
        ("Bis 5 p.m. Then home.", ["Bis 5 p.m.", "Then home."]),
        ("Er kam usw. Dann ging er.", ["Er kam usw. Dann ging er."]),  # the splitter's own list keeps "usw."
        ("Il a vu M. Dupont. Bien.", ["Il a vu M. Dupont.", "Bien."]),
        ("La Sra. García vino. Bien.", ["La Sra. García vino.", "Bien."]),
        ("Это т. е. тест. Да.", ["Это т. е. тест.", "Да."]),
        ("Version 2.0. Fine.", ["Version 2.0.", "Fine."]),
    ],
)
def test_sentence_boundaries(text, sentences):
    assert [s.text for s in spoken_sentences(text)] == sentences
    rng = random.Random(text)
    for _ in range(20):
        assert [s.text for s in _stream(text, rng, "auto", 4)] == sentences


def test_dot_guard_waits_for_the_next_word():
    guard = DotGuard()
    assert guard.feed("Seite 3") == "Seite 3"
    assert guard.feed(". ") == ""  # "3." may still be an ordinal
    assert guard.feed("Ma") == ""
    assert guard.feed("i ") == "\ue000 Mai "
    assert guard.feed("am 4. Tag. Dann", final=True) == "am 4\ue000 Tag. Dann"  # "am": an ordinal at once
    assert DotGuard().feed("Seite 3. Dann", final=True) == "Seite 3. Dann"


def test_turned_off_it_is_the_plain_splitter():
    text = REPLIES["english"]
    sentences = spoken_sentences(text, "english", enabled=False)
    assert [s.text for s in sentences] == split_sentences(text)
    assert all(s.spoken == s.text for s in sentences)


def test_auto_language_sticks_to_a_recognised_latin_language():
    text = "Das Wetter ist schön. Morgen sind es 25 Grad. Tesla Model 3."
    sentences = spoken_sentences(text, "auto")
    assert [s.language for s in sentences] == ["german", "german", "german"]
    assert sentences[1].spoken == "Morgen sind es fünfundzwanzig Grad."


def test_sentences_with_nothing_to_say_are_dropped():
    assert spoken_sentences("🎉🎉\n---\n```\ncode\n```\n* * *\n") == []
