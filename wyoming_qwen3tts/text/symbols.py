"""Characters the voice should not read: emoji and decorative symbols removed, URLs and e-mail
addresses shortened to their host, Markdown leftovers dropped, a few signs said as words.

Emoji are found by Unicode category (stdlib unicodedata) rather than a list: every emoji and
pictograph is a symbol ("So"), a skin-tone modifier ("Sk"), or a joiner / variation selector /
keycap / tag that only glues them, so new emoji are covered without a table to keep up to date.
"""

from __future__ import annotations

import re
import unicodedata

from .lexicon import LEXICONS

# "https://www.home-assistant.io/docs/x" -> host "home-assistant.io"; trailing punctuation stays text.
_NOT_AFTER_ASCII = r"(?<![A-Za-z0-9._%+-])"  # not \b: CJK text puts letters right before a link
_URL = re.compile(
    rf"{_NOT_AFTER_ASCII}(?:https?://|www\.)(?:www\.)?([A-Za-z0-9.-]+[A-Za-z0-9])(?::\d+)?"
    r"(?:[/?#][A-Za-z0-9\-._~%!$&*+,;=:@/?#\[\]]*[A-Za-z0-9\-_~%$&*+=@/#\]])?/?"
)
_TLDS = "com|org|net|io|dev|ai|app|de|fr|es|it|pt|ru|uk|ch|at|nl|eu|jp|cn|kr|br|info|gov|edu"
_BARE_DOMAIN = re.compile(rf"{_NOT_AFTER_ASCII}((?:[A-Za-z0-9-]+\.)+(?:{_TLDS}))(?![.-]?[A-Za-z0-9])")
_EMAIL = re.compile(
    rf"{_NOT_AFTER_ASCII}([A-Za-z0-9._%+-]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{{2,}})(?![A-Za-z0-9])"
)
# Glue inside emoji sequences: zero-width joiner, variation selectors, combining keycap.
_EMOJI_GLUE = frozenset("\u200d\ufe0e\ufe0f\u20e3")
# Markdown and ASCII-art leftovers that no one says.
_DECORATION = re.compile(r"[*`~^|\\#]+|(?<!\S)[-=+]{2,}(?!\S)")
_SPACE_BEFORE_STOP = re.compile(r"\s+(?=[.,。，、])")
_ARROWS = re.compile(r"\s*(?:[\u2190-\u21ff\u27f0-\u27ff\u2900-\u297f]|->|=>|<-)\s*")
_BULLETS = re.compile(r"\s*[•·▪◦‣]\s*")
_AMPERSAND = re.compile(r"\s*&\s*")
_SPACES = re.compile(r"\s+")


def _spoken_host(host: str, dot: str) -> str:
    return f" {dot} ".join(part for part in host.split(".") if part)


def shorten_links(text: str, language: str) -> str:
    """URLs to their host ("home-assistant dot io"), e-mail addresses to "name at host dot com"."""
    if "@" not in text and "." not in text:
        return text
    lex = LEXICONS[language]
    text = _EMAIL.sub(
        lambda m: f"{_spoken_host(m.group(1), lex.dot)} {lex.at} {_spoken_host(m.group(2), lex.dot)}", text
    )
    text = _URL.sub(lambda m: _spoken_host(m.group(1).removeprefix("www."), lex.dot), text)
    return _BARE_DOMAIN.sub(lambda m: _spoken_host(m.group(1), lex.dot), text)


def drop_symbols(text: str, language: str) -> str:
    """Emoji, pictographs and decoration removed; arrows and bullets become pauses; & is "and"."""
    lex = LEXICONS[language]
    if "&" in text:
        text = _AMPERSAND.sub(f" {lex.and_word} ", text)
    text = _ARROWS.sub(", ", text)
    if not text.isascii():
        text = _BULLETS.sub(", ", text)
        text = "".join(ch for ch in text if not _is_pictograph(ch))
    text = _DECORATION.sub("", text.replace("_", " "))
    text = _SPACE_BEFORE_STOP.sub("", text)
    return _SPACES.sub(" ", text).strip(" ,")


def _is_pictograph(ch: str) -> bool:
    if ch.isascii():
        return False
    if ch in _EMOJI_GLUE or "\U000e0000" <= ch <= "\U000e007f":  # tags (subdivision flags)
        return True
    category = unicodedata.category(ch)
    return category == "So" or category == "Sk" or category == "Co"
