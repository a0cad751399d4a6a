"""Which of the model's ten languages a piece of text is in, guessed cheaply from its letters.

The script decides most of it: kana means Japanese (kanji alone cannot tell Japanese from Chinese,
so Han without kana is Chinese), Hangul Korean, Cyrillic Russian.  Latin script is German, French,
Spanish, Italian, Portuguese or English; a count of each language's commonest function words
and its own letters (ß, ñ, ã) tells them apart when one clearly leads, otherwise the caller's default stands (English unless
told).  One pass over the characters and one over the words: linear, a few microseconds a sentence.
"""

from __future__ import annotations

import re

LANGUAGES = (
    "chinese",
    "english",
    "japanese",
    "korean",
    "german",
    "french",
    "russian",
    "portuguese",
    "spanish",
    "italian",
)

# Short, frequent words that are unique to one of these languages.  Words shared by two of them
# ("la", "de", "que", "es", "il", "para", "die", "do") are left out: one of them must be enough.
_FUNCTION_WORDS: dict[str, frozenset[str]] = {
    "english": frozenset("the and is are to of you it this that with for was have not your will can i'm it's".split()),
    "german": frozenset(
        "der das und ist nicht ich sie mit auf für ein eine den dem auch sich wird bitte heute gibt".split()
    ),
    "french": frozenset(
        "les et est une des pas vous elle avec pour sur dans ce qui très être au aux du je nous sont "
        "c'est cette comme aujourd'hui fait votre vos ont peut aussi ici chez".split()
    ),
    "spanish": frozenset("el los las y pero muy hoy hay usted".split()),
    "italian": frozenset("gli è di che sono per della anche oggi molto questo alle".split()),
    "portuguese": frozenset("os é não um uma com você muito hoje também às".split()),
}
# Letters only one of the Latin-script languages uses.
_LETTERS: dict[str, str] = {"german": "äöüß", "spanish": "ñ¿¡", "portuguese": "ãõ", "french": "œ"}
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")


def script_language(text: str) -> str | None:
    """The language the script alone says (CJK, kana, Hangul, Cyrillic), or None for Latin/none."""
    han = 0
    for ch in text:
        o = ord(ch)
        if o < 0x0400:
            continue
        if 0x3040 <= o <= 0x30FA or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9D:
            return "japanese"
        if 0xAC00 <= o <= 0xD7A3 or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F:
            return "korean"
        if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF:
            han += 1
        elif 0x0400 <= o <= 0x04FF and han == 0:
            # Cyrillic, unless Han came first (mixed text follows its first script).
            return "russian"
    return "chinese" if han else None


def detect_language(text: str, default: str = "english") -> str:
    """The language of `text`: from its script, else from its function words, else `default`."""
    by_script = script_language(text)
    if by_script is not None:
        return by_script
    counts = dict.fromkeys(_FUNCTION_WORDS, 0)
    lowered = text.lower()
    if not lowered.isascii():
        for language, letters in _LETTERS.items():
            counts[language] += sum(lowered.count(ch) for ch in letters)
    for word in _WORD.findall(lowered):
        for language, words in _FUNCTION_WORDS.items():
            if word in words:
                counts[language] += 1
    ranked = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    (best, top), (_, second) = ranked[0], ranked[1]
    if top > second and best != default:
        return best
    return default
