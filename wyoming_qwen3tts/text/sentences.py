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
# allows "\ud800"; they cannot be encoded as UTF-8) and non-characters; and the ChatML control markers
# ("<|", "|>", "<tts_"), which in the prompt would become control tokens. Markers go before the text
# front end sees the text, which would otherwise turn "<tts_" into "tts" and speak it.
_UNSPEAKABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]|<\\||\\|>|<tts_")
_SPACES = re.compile(r"\s+")
_NON_SPACE = re.compile(r"\S")
_CANDIDATE = re.compile("[\n" + re.escape("".join(sorted(TERMINATORS))) + "]")
_RUN = re.compile("[" + re.escape("".join(sorted(TERMINATORS | CLOSERS))) + "]+")
# Longest word before a dot that can make it no sentence end: an abbreviation ("approx") or a
# list number ("12345678.").
_LONGEST_WORD = max(8, *map(len, ABBREVIATIONS))


_MARKERS = ("<|", "|>", "<tts_")
# What may still become a marker once more text arrives: every proper prefix of one.
_MARKER_STARTS = frozenset(m[:i] for m in _MARKERS for i in range(1, len(m)))
_LONGEST_MARKER = max(map(len, _MARKERS))


def clean_client_text(text: str) -> str:
    """Client text made safe to split, log and tokenize: each unspeakable character and control marker
    becomes a space."""
    return _UNSPEAKABLE.sub(" ", text)


class StreamCleaner:
    """clean_client_text for text that arrives in fragments: feed() returns the cleaned text that is
    settled, holding back a tail that may be the start of a control marker ("<tt" before "s_"), so the
    joined output equals clean_client_text of the joined input however the text was cut."""

    def __init__(self) -> None:
        self._tail = ""

    def feed(self, fragment: str) -> str:
        text = self._tail + fragment
        window = max(0, len(text) - _LONGEST_MARKER + 1)
        # Markers and characters the regex takes whole that reach into the last few characters.
        near_end = [(m.start(), m.end()) for m in _UNSPEAKABLE.finditer(text) if m.end() > window]
        cut = len(text)
        for start in range(window, len(text)):
            inside = any(a < start < b for a, b in near_end)
            if not inside and text[start:] in _MARKER_STARTS:
                cut = start  # the regex would try a marker here: wait for the rest
                break
        self._tail = text[cut:]
        return clean_client_text(text[:cut])

    def finish(self) -> str:
        tail, self._tail = self._tail, ""
        return clean_client_text(tail)


class SentenceSplitter:
    """feed() fragments, get complete sentences back; finish() returns what is left.

    Linear in the text however it is chunked: between calls the buffer holds at most one
    unfinished sentence (max_chars characters), scanning resumes where the last feed stopped,
    and no decision looks further back than a short word.
    """

    def __init__(self, max_chars: int = 400) -> None:
        self.max_chars = max_chars
        self._buffer = ""  # text not yet emitted
        self._scanned = 0  # the buffer up to here holds no sentence end (for the sentence at its start)

    def feed(self, text: str) -> list[str]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[str]:
        sentences = self._drain(final=True)
        rest, self._buffer, self._scanned = self._buffer, "", 0
        return sentences + _tidy([rest])

    def _drain(self, final: bool) -> list[str]:
        buf = self._buffer
        out: list[str] = []
        start = 0
        scanned = self._scanned
        while (first := _NON_SPACE.search(buf, start)) is not None:
            # Leading whitespace would count against max_chars without being spoken.
            start = first.start()
            scanned = max(scanned, start)
            end, scanned = self._boundary(buf, start, scanned, final)
            if end is None:
                break
            out.append(buf[start:end])
            start = scanned = end
        else:
            start = len(buf)
        self._buffer = buf[start:]
        self._scanned = max(scanned - start, 0)
        return _tidy(out)

    def _boundary(self, buf: str, start: int, scanned: int, final: bool) -> tuple[int | None, int]:
        """(end of the sentence starting at `start`, or None; where the next scan resumes)."""
        limit = start + self.max_chars  # the furthest a sentence may end
        # A terminator run ending at `limit` is decided by the character after it.
        stop = min(len(buf), limit + 1)
        end, resume = _sentence_end(buf, start, scanned, stop, final)
        if end is not None and end <= limit:
            return end, end
        if len(buf) > limit:  # no end within max_chars: cut the sentence short
            return _soft_break(buf, start, self.max_chars), start
        return None, resume


def _sentence_end(buf: str, start: int, i: int, stop: int, final: bool) -> tuple[int | None, int]:
    """The first sentence end in buf[i:stop] (the sentence began at `start`) and where to resume."""
    while (found := _CANDIDATE.search(buf, i, stop)) is not None:
        i = found.start()
        if buf[i] == "\n":
            return i + 1, i + 1
        run_match = _RUN.match(buf, i, stop)
        assert run_match is not None  # buf[i] is a terminator
        j = run_match.end()
        if j == stop:
            # The character after the terminator run decides; without it only the end of the
            # stream does.  Rescan the run once more text has come.
            return (j if final and stop == len(buf) else None), i
        run = buf[i:j]
        if any(c in CJK_TERMINATORS for c in run):
            return j, j
        if buf[j].isspace() and not _is_abbreviation(buf, start, i, run):
            return j, j
        i = j
    return None, stop


def _is_abbreviation(buf: str, start: int, i: int, run: str) -> bool:
    """Whether the '.' at buf[i] closes an abbreviation, an initial or a list number."""
    if not run.startswith(".") or run.startswith(".."):
        return False
    # The word before the dot ([\w.]+), looked for no further back than the longest word that
    # can matter: a longer one is none of the three.
    floor = max(start, i - _LONGEST_WORD - 1)
    k = i
    while k > floor and _is_word_char(buf[k - 1]):
        k -= 1
    if k == i or (k > start and _is_word_char(buf[k - 1])):
        return False
    word = buf[k:i]
    if word.lower() in ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper() and word != "I":
        return True  # an initial: "J. R. R. Tolkien" (but "So did I. Then" ends a sentence)
    # "1. First item" at the start of a sentence is a list number, not a sentence.
    return word.isdigit() and k == start


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_."


def _soft_break(buf: str, start: int, limit: int) -> int:
    """Where to cut an over-long sentence: the last clause break, else space, within the limit."""
    for candidates in (CLAUSE_BREAKS, None):
        for k in range(start + limit - 1, start + limit // 4, -1):
            ch = buf[k]
            if candidates is None:
                if ch.isspace():
                    return k + 1
            elif ch in candidates and (buf[k + 1].isspace() or ord(ch) > 0x2FFF):
                return k + 1
    return start + limit  # no break at all (e.g. unspaced text): cut hard


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
