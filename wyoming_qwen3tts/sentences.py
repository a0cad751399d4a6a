"""Incremental sentence splitting of streamed text.

Text arrives in fragments cut anywhere (even mid-word).  A sentence is emitted as soon as it is
known to be complete: a terminator (. ! ? … or CJK 。！？) plus the next character, a newline, or
the end of the stream.  Decisions look at most one character ahead of a terminator run and only
backwards otherwise, so the same text gives the same sentences however it is chunked.
"""

from __future__ import annotations

import re

TERMINATORS = frozenset(".!?…。！？")
# Full-width terminators are unambiguous: no abbreviations or decimals use them.
CJK_TERMINATORS = frozenset("。！？")
# Closing quotes and brackets that belong to the sentence they end.
CLOSERS = frozenset("\"'”’)]}»」』）》")
# Soft break points for over-long sentences, best first.
CLAUSE_BREAKS = frozenset(",;:，；：、")

# Words that end with a period without ending the sentence (compared lower-case, without the dot).
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf approx fig dept inc ltd corp "
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s z.b d.h bzw usw ca".split()
)
# C0/C1 control characters (but tab, newline, carriage return), unpaired UTF-16 surrogates (JSON
# allows "\ud800"; they cannot be encoded as UTF-8) and non-characters.
_UNSPEAKABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_WORD_BEFORE = re.compile(r"([\w.]+)$")
_SPACES = re.compile(r"\s+")


def clean_client_text(text: str) -> str:
    """Client text made safe to split, log and tokenize: each unspeakable character becomes a space."""
    return _UNSPEAKABLE.sub(" ", text)


class SentenceSplitter:
    """feed() fragments, get complete sentences back; finish() returns what is left."""

    def __init__(self, max_chars: int = 400) -> None:
        self.max_chars = max_chars
        self._buffer = ""

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[str]:
        sentences = self._drain(final=True)
        rest, self._buffer = self._buffer, ""
        return sentences + _tidy([rest])

    def _drain(self, final: bool) -> list[str]:
        out: list[str] = []
        while True:
            # Leading whitespace would count against max_chars without being spoken.
            self._buffer = self._buffer.lstrip()
            end = self._boundary(final)
            if end is None:
                break
            out.append(self._buffer[:end])
            self._buffer = self._buffer[end:]
        return _tidy(out)

    def _boundary(self, final: bool) -> int | None:
        """End index of the first complete sentence in the buffer, or None."""
        end = _sentence_end(self._buffer, final)
        limit = self.max_chars
        if (end is None and len(self._buffer) > limit) or (end is not None and end > limit):
            return _soft_break(self._buffer, limit)
        return end


def _sentence_end(buf: str, final: bool) -> int | None:
    i = 0
    while i < len(buf):
        ch = buf[i]
        if ch == "\n":
            return i + 1
        if ch not in TERMINATORS:
            i += 1
            continue
        j = i
        while j < len(buf) and (buf[j] in TERMINATORS or buf[j] in CLOSERS):
            j += 1
        if j == len(buf):
            # The character after the terminator run decides; without it only the end of the
            # stream does.
            return j if final else None
        run = buf[i:j]
        if any(c in CJK_TERMINATORS for c in run):
            return j
        if buf[j].isspace() and not _is_abbreviation(buf, i, run):
            return j
        i = j
    return None


def _is_abbreviation(buf: str, i: int, run: str) -> bool:
    """Whether the '.' at buf[i] closes an abbreviation, an initial or a list number."""
    if not run.startswith(".") or run.startswith(".."):
        return False
    match = _WORD_BEFORE.search(buf[:i])
    if match is None:
        return False
    word = match.group(1)
    if word.lower() in ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper() and word != "I":
        return True  # an initial: "J. R. R. Tolkien" (but "So did I. Then" ends a sentence)
    # "1. First item" at the start of a sentence is a list number, not a sentence.
    return word.isdigit() and buf[: match.start()].strip() == ""


def _soft_break(buf: str, limit: int) -> int:
    """Where to cut an over-long sentence: the last clause break, else space, within the limit."""
    window = buf[: limit + 1]
    for candidates in (CLAUSE_BREAKS, None):
        for k in range(limit - 1, limit // 4, -1):
            ch = window[k]
            if candidates is None:
                if ch.isspace():
                    return k + 1
            elif ch in candidates and (window[k + 1].isspace() or ord(ch) > 0x2FFF):
                return k + 1
    return limit  # no break at all (e.g. unspaced text): cut hard


def _tidy(pieces: list[str]) -> list[str]:
    """Collapse whitespace, drop markdown emphasis, skip pieces with nothing to say."""
    out = []
    for piece in pieces:
        text = _SPACES.sub(" ", piece.replace("*", "")).strip()
        if any(c.isalnum() for c in text):
            out.append(text)
    return out


def split_sentences(text: str, max_chars: int = 400) -> list[str]:
    """Split a whole text at once."""
    splitter = SentenceSplitter(max_chars)
    return splitter.feed(text) + splitter.finish()
