"""The incremental sentence splitter: boundaries, and independence from how text is chunked."""

from __future__ import annotations

import random

import pytest

from wyoming_qwen3tts.text.sentences import SentenceSplitter, StreamCleaner, clean_client_text, split_sentences

TEXTS = [
    "Hello world. This is Dr. Smith, who paid $3.50 for it! Really?! Yes… fine",
    "你好。我是谁？「好」。And then\nnew line\n\nNew paragraph. 1. First item. e.g. this one.",
    "So did I. Then J. R. R. Tolkien wrote it... The end.\n- bullet one\n- bullet two",
    'He said "Stop." Then he left. Visit example.com today. Version 2.0 is out.',
    "Ein Satz, z.B. dieser. Noch einer ca. um drei Uhr. Ende!",
    " ".join(f"word{i}," for i in range(120)) + " end.",
]


def chunked(text: str, rng: random.Random) -> list[str]:
    """Cut text at random places, including mid-word and single characters."""
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 40))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("text", TEXTS)
def test_chunking_does_not_change_sentences(text: str) -> None:
    expected = split_sentences(text, max_chars=120)
    rng = random.Random(text)
    for _ in range(50):
        splitter = SentenceSplitter(max_chars=120)
        got: list[str] = []
        for part in chunked(text, rng):
            got += splitter.feed(part)
        got += splitter.finish()
        assert got == expected
    # One character at a time as well.
    splitter = SentenceSplitter(max_chars=120)
    got = [s for ch in text for s in splitter.feed(ch)] + splitter.finish()
    assert got == expected


def test_boundaries() -> None:
    assert split_sentences(TEXTS[0]) == [
        "Hello world.",
        "This is Dr. Smith, who paid $3.50 for it!",
        "Really?!",
        "Yes…",
        "fine",
    ]
    assert split_sentences(TEXTS[1]) == [
        "你好。",
        "我是谁？",
        "「好」。",
        "And then",
        "new line",
        "New paragraph.",
        "1. First item.",
        "e.g. this one.",
    ]
    assert split_sentences(TEXTS[2]) == [
        "So did I.",
        "Then J. R. R. Tolkien wrote it...",
        "The end.",
        "- bullet one",
        "- bullet two",
    ]
    assert split_sentences(TEXTS[3]) == [
        'He said "Stop."',
        "Then he left.",
        "Visit example.com today.",
        "Version 2.0 is out.",
    ]


def test_sentence_emitted_once_next_character_arrives() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("Hello world.") == []  # could still be "world.com"
    assert splitter.feed(" Sec") == ["Hello world."]
    assert splitter.feed("ond 3.") == []
    assert splitter.feed("5 items") == []  # a decimal, not a boundary
    assert splitter.feed("。") == []
    assert splitter.feed("x") == ["Second 3.5 items。"]
    assert splitter.feed("y\n") == ["xy"]  # a newline ends a line at once
    assert splitter.finish() == []


def test_long_sentence_split_at_clause_then_space() -> None:
    text = "alpha beta gamma, delta epsilon zeta eta theta iota kappa lambda mu"
    pieces = split_sentences(text, max_chars=40)
    assert pieces == ["alpha beta gamma,", "delta epsilon zeta eta theta iota kappa", "lambda mu"]
    assert all(len(p) <= 40 for p in pieces)
    unspaced = "字" * 100
    assert split_sentences(unspaced, max_chars=40) == ["字" * 40, "字" * 40, "字" * 20]


def test_markdown_and_empty_pieces_dropped() -> None:
    assert split_sentences("**Bold** claim. ... \n\n * \n") == ["Bold claim."]
    assert split_sentences("   ") == []


PATHOLOGICAL = {
    # The word before the period is 4,000 long: looking it up from the start of the buffer
    # was quadratic (0.7 s for this text on the event loop).
    "long-word-then-period": "a" * 3999 + "-. " + "b" * 990,
    "long-word-no-space": "a" * 4000 + "-." + "b" * 990,
    "only-periods": "." * 5000,
    "abbreviations": "Dr. " * 1250,
    "one-letter-sentences": "x. " * 1666,
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_texts_split_in_linear_time(name: str) -> None:
    """Whole and one character at a time, the same sentences, each within max_chars, fast.

    The time bound is a guard against quadratic work (hundreds of times the linear cost), not a
    performance figure."""
    import time

    text = PATHOLOGICAL[name]
    t0 = time.perf_counter()
    whole = split_sentences(text)
    elapsed = time.perf_counter() - t0
    splitter = SentenceSplitter()
    t0 = time.perf_counter()
    streamed = [s for ch in text for s in splitter.feed(ch)] + splitter.finish()
    elapsed_streamed = time.perf_counter() - t0
    assert streamed == whole
    assert all(len(s) <= 400 for s in whole)
    assert [c for c in "".join(whole) if c.isalnum()] == [c for c in text if c.isalnum()]  # no word lost
    assert elapsed < 0.1 and elapsed_streamed < 0.5, (elapsed, elapsed_streamed)


def test_stream_cleaner_equals_cleaning_the_joined_text_however_it_is_cut() -> None:
    """Random texts dense in marker pieces, cut at random points: the cleaned fragments joined are the
    joined text cleaned, so no marker survives a cut and no text is held back at the end."""
    rng = random.Random(7)
    pieces = ["<", "|", ">", "t", "s", "_", "a", " ", "\x00", "<tts_", "<|", "|>"]
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 4))))
        parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        cleaner = StreamCleaner()
        joined = "".join(cleaner.feed(part) for part in parts) + cleaner.finish()
        assert joined == clean_client_text(text), parts
