"""Streamed LLM text in, spoken sentences out: Markdown blocks, sentence splitting, the front end.

    raw fragments -> MarkdownBlocks (list markers, headings, fences, tables; a block ends its line)
                  -> DotGuard (a "." that does not end a sentence is hidden from the splitter)
                  -> SentenceSplitter (sentences.py, unchanged)
                  -> speakable() per sentence (Markdown inline, links, numbers, symbols)

Every stage decides from what it has seen and holds back what it cannot decide yet, so the same
text gives the same sentences, and the same spoken words, however it is cut into fragments.

DotGuard covers what the splitter's own rules miss: a number never ends a sentence when what follows
shows it is an ordinal or a date ("am 3. Mai", "der 2. Platz"), nor does an abbreviation of any of
the ten languages ("z. B.", "Nr. 5", "p. ex.", "Sra.", "т. д."), nor a period followed by a
lowercase word ("5 p.m. today").  Decimals ("3.5", "1.000,50 €") never split: the splitter only
ends a sentence at a terminator followed by whitespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .language import detect_language
from .lexicon import LEXICONS
from .markdown import MarkdownBlocks
from .normalize import speakable
from .sentences import SentenceSplitter

# Stands in for a "." that must not end a sentence while the text passes the splitter.
_HIDDEN_DOT = "\ue000"
# Abbreviations that also end sentences ("... und so weiter usw."): they continue only into a
# lowercase word.
_FINAL_ABBREVIATIONS = frozenset(["etc.", "usw.", "ecc.", "т. д.", "т.д.", "т. п.", "т.п.", "u. a."])
_ABBREVIATIONS = sorted({a for lex in LEXICONS.values() for a in lex.abbreviations} - {"M."}, key=len, reverse=True)
_ENDS_WITH_ABBREVIATION = re.compile(rf"(?<![\w.])({'|'.join(map(re.escape, _ABBREVIATIONS))})$")
_MONTHS = frozenset(m.lower() for lex in LEXICONS.values() for m in lex.months)
_LONGEST_MONTH = max(map(len, _MONTHS))
# Words after which a German number with a dot is an ordinal ("am 3.", "der 2.", "zum 100.").
_ORDINAL_CONTEXT = frozenset("am im vom zum beim dem den des der die das zur ab seit bis bis zum".split())
_TOKEN_BEFORE = re.compile(r"(?:(\w+)\s+)?([\w.]+)$")
_NEXT_WORD = re.compile(r"[ \t\u00a0]+(\w*)(.?)")
_CONTEXT_CHARS = 48
# Servers run the front end on a thread for texts longer than this, so the event loop stays free
# for other clients (docs/reliability.md); shorter ones take well under a millisecond a sentence.
OFFLOAD_CHARS = 1000


@dataclass(frozen=True)
class Sentence:
    text: str  # as the client wrote it (after the Markdown blocks)
    spoken: str  # what the voice says
    language: str  # the language the front end read it in


class DotGuard:
    """Hides from the sentence splitter each "." that does not end a sentence (see the module doc)."""

    def __init__(self) -> None:
        self._pending = ""  # text from the first undecided "." on
        self._context = ""  # the end of what was released, to see the words before a "."

    def feed(self, text: str, final: bool = False) -> str:
        buf = self._pending + text
        out: list[str] = []
        start = 0
        index = buf.find(".")
        while index != -1:
            # Only the last _CONTEXT_CHARS before the dot count, so each dot costs the same however
            # long the text: the verdict is linear in the text and the same however it is cut.
            before = buf[max(0, index - _CONTEXT_CHARS) : index]
            if len(before) < _CONTEXT_CHARS:
                before = (self._context + before)[-_CONTEXT_CHARS:]
            verdict = self._hides(before, buf, index + 1, final)
            if verdict is None:
                break
            out.append(buf[start:index])
            out.append(_HIDDEN_DOT if verdict else ".")
            start = index + 1
            index = buf.find(".", start)
        else:
            index = len(buf)
        released = buf[:index]
        self._pending = buf[index:]
        self._context = (self._context + released)[-_CONTEXT_CHARS:]
        out.append(buf[start:index])
        return "".join(out)

    @staticmethod
    def _hides(before: str, buf: str, at: int, final: bool) -> bool | None:
        """Whether the "." between `before` and buf[at:] is hidden; None: undecided yet."""
        if at >= len(buf):
            return None if not final else False
        if buf[at] not in " \t\u00a0":
            return False  # "3.5", "e.g", "home-assistant.io": the splitter does not split there
        token = _TOKEN_BEFORE.search(before)
        if token is None:
            return False
        word_before, last = token.group(1) or "", token.group(2)
        abbreviation = _ENDS_WITH_ABBREVIATION.search(before + ".")
        if len(last) == 1 and last.isalpha() and last.islower():
            return True  # "z. B.", "d. h.", "p. ex.": no sentence ends in one small letter
        nxt = _NEXT_WORD.match(buf, at)
        if nxt is None:
            return None if not final else False  # only spaces so far
        word, follower = nxt.group(1), nxt.group(2)
        # The next word ends before the buffer does (a word longer than any month name is no month).
        complete = bool(follower) or final or len(word) > _LONGEST_MONTH
        if not word:
            return False if follower or final else None  # "3. (" or a newline: the splitter's call
        lowercase = word[0].islower()
        if abbreviation is not None:
            return lowercase or abbreviation.group(1) not in _FINAL_ABBREVIATIONS
        if last.isdigit() and len(last) <= 3:
            if lowercase or word_before.lower() in _ORDINAL_CONTEXT:
                return True
            if not complete:
                return None
            return word.lower() in _MONTHS
        return lowercase


class SpokenSentences:
    """feed() fragments of a reply, get Sentence objects back as they complete; finish() the rest.

    `language` is an engine language name, or "auto": then each sentence's language is detected
    (a Latin-script language, once recognised, stays the guess for the sentences after it).
    With `enabled` False this is the plain sentence splitter and the text is spoken as written.
    """

    def __init__(self, language: str = "auto", *, enabled: bool = True, max_chars: int = 400) -> None:
        self.language = language
        self.enabled = enabled
        self._blocks = MarkdownBlocks()
        self._dots = DotGuard()
        self._splitter = SentenceSplitter(max_chars)
        self._latin_default = "english"

    def feed(self, text: str) -> list[Sentence]:
        if not self.enabled:
            return self._speak(self._splitter.feed(text))
        return self._speak(self._splitter.feed(self._dots.feed(self._blocks.feed(text))))

    def finish(self) -> list[Sentence]:
        if not self.enabled:
            return self._speak(self._splitter.finish())
        tail = self._dots.feed(self._blocks.finish(), final=True)
        return self._speak(self._splitter.feed(tail) + self._splitter.finish())

    def _speak(self, sentences: list[str]) -> list[Sentence]:
        out = []
        for raw in sentences:
            text = raw.replace(_HIDDEN_DOT, ".")
            if not self.enabled:
                out.append(Sentence(text, text, self.language))
                continue
            language = self._language_of(text)
            spoken = speakable(text, language)
            if any(ch.isalnum() for ch in spoken):
                out.append(Sentence(text, spoken, language))
        return out

    def _language_of(self, text: str) -> str:
        if self.language in LEXICONS:
            return self.language
        language = detect_language(text, self._latin_default)
        if language in ("german", "french", "spanish", "italian", "portuguese", "english"):
            self._latin_default = language
        return language


def spoken_sentences(
    text: str, language: str = "auto", *, enabled: bool = True, max_chars: int = 400
) -> list[Sentence]:
    """A whole text at once: the same sentences a stream of it gives."""
    stream = SpokenSentences(language, enabled=enabled, max_chars=max_chars)
    return stream.feed(text) + stream.finish()
