"""The text front end's entry: one sentence of an LLM's reply -> the words the voice should say.

Order matters: Markdown goes first (a link's URL is not read), then links are shortened (their
digits are not numbers), then numbers are written out (they need "°", "%" and "€", which the last
step, symbol removal, would drop).
"""

from __future__ import annotations

import re
from functools import lru_cache

from .language import detect_language
from .lexicon import LEXICONS
from .markdown import inline_text
from .numbers import write_out_numbers
from .symbols import drop_symbols, shorten_links

# Full-width digits and signs (common in CJK text) as their ASCII forms, so numbers are found.
_FULL_WIDTH = str.maketrans({chr(0xFF10 + i): str(i) for i in range(10)} | {"％": "%", "＄": "$", "＋": "+", "－": "-"})
# Reference marks in LLM answers ("... as reported [1].") are not said.
_CITATION = re.compile(r"\s?\[\d{1,3}\]")


@lru_cache(maxsize=16)
def _abbreviations(language: str) -> tuple[re.Pattern[str], dict[str, str]] | None:
    table = LEXICONS[language].abbreviations
    if not table:
        return None
    alternatives = "|".join(re.escape(a) for a in sorted(table, key=len, reverse=True))
    return re.compile(rf"(?<![\w.])(?:{alternatives})(?!\w)"), table


def speakable(text: str, language: str = "auto") -> str:
    """`text` (one sentence; Markdown, emoji, links, numbers allowed) as words to speak in
    `language` (an engine language name; anything else: detected from the text)."""
    if language not in LEXICONS:
        language = detect_language(text)
    text = text.translate(_FULL_WIDTH)
    text = inline_text(text)
    if "[" in text:
        text = _CITATION.sub("", text)
    text = shorten_links(text, language)
    abbreviations = _abbreviations(language)
    if abbreviations is not None:
        pattern, table = abbreviations
        text = pattern.sub(lambda m: table[m.group(0)], text)
    text = write_out_numbers(text, language)
    return drop_symbols(text, language)
