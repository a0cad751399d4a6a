"""Markdown reduced to the words it carries, for text that arrives a fragment at a time.

Inline Markdown (emphasis, links, code spans, images, HTML, escapes, entities) is parsed by
markdown-it-py, one sentence at a time.  Blocks are handled here, line by line, because a stream
cannot wait for a whole document to parse it: each line's start is classified as soon as enough of
it has arrived (a few characters: "## ", "- ", "12. ", "```", "|"), the marker is removed and the
rest of the line flows on at once, so a long list item or paragraph is still spoken sentence by
sentence.  A heading, list item or table row ends at its newline, which the sentence splitter
takes as a sentence boundary.  Code fences are not read (code is not speech); a table row is read
as "header: cell, header: cell".
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

_MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])
# Characters without which a sentence has no inline Markdown (parsing costs ~100 us a sentence).
_INLINE_MARKS = frozenset("*_`[]<>~\\&")
_FENCE = re.compile(r"\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"\s{0,3}#{1,6}(?:\s+|$)")
_LIST_ITEM = re.compile(r"\s*(?:[-*+•◦▪‣]|\d{1,9}[.)])\s+")
_QUOTE = re.compile(r"\s{0,3}>\s?")
_RULE = re.compile(r"\s{0,3}(?:(?:-\s*){3,}|(?:\*\s*){3,}|(?:_\s*){3,}|=+)\s*$")
_TABLE_DIVIDER = re.compile(r"\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
# The longest line start that can still turn out to be a marker ("123456789. ", "###### ").
# Possessive quantifiers: nested or adjacent ones that can trade characters (as "[-]+(?:\s*[-]+)*"
# did) backtrack exponentially on a long run of dashes that ends in a letter.
_UNDECIDED = re.compile(r"\s*+(?:#{1,6}|[-*+_=•◦▪‣]++[-*+_=\s]*+|`{1,2}|~{1,2}|\d{1,9}[.)]?|>)?\s*$")


def inline_text(text: str) -> str:
    """One line or sentence of inline Markdown as plain text: link text without its URL (a bare
    or autolinked URL is kept for the symbol pass to shorten), code spans as their content,
    images and HTML tags dropped."""
    if not any(ch in _INLINE_MARKS for ch in text):
        return text
    out: list[str] = []
    for block in _MD.parseInline(text):
        for token in block.children or ():
            if token.type in ("text", "code_inline"):
                out.append(token.content)
            elif token.type in ("softbreak", "hardbreak"):
                out.append(" ")
    return "".join(out)


class MarkdownBlocks:
    """feed() raw text, get text without block markup; finish() flushes what is held."""

    def __init__(self) -> None:
        self._line = ""  # the start of the current line while its kind is undecided
        self._kind = "start"  # start | text | table | fence-line | code | code-start | skip
        self._fence = ""  # the marker that closes the open code fence
        self._header: list[str] = []  # the current table's header cells

    def feed(self, text: str) -> str:
        out: list[str] = []
        for piece in re.split(r"(\n)", text.replace("\r", "")):
            if piece == "\n":
                out.append(self._end_line())
            elif piece:
                out.append(self._add(piece))
        return "".join(out)

    def finish(self) -> str:
        return self._end_line() if (self._line or self._kind not in ("start", "code-start")) else ""

    # -- within a line ------------------------------------------------------------------------
    def _add(self, piece: str) -> str:
        if self._kind == "text":
            return piece
        if self._kind in ("table", "fence-line", "code", "skip"):
            self._line += piece
            return ""
        self._line += piece
        return self._classify(final=False)

    def _classify(self, final: bool) -> str:
        """Decide what the held line start is; returns the text it releases now."""
        line = self._line
        if self._kind == "code-start":
            if (fence := _FENCE.match(line)) and fence.group(1)[0] * 3 == self._fence[:3]:
                self._kind = "skip"  # the closing fence
                return ""
            if not final and _could_close(line, self._fence):
                return ""
            self._kind = "code"
            return ""
        if not final and _UNDECIDED.fullmatch(line):
            return ""
        if line.lstrip().startswith("|"):
            self._kind = "table"
            return ""
        fence = _FENCE.match(line)
        if fence:
            self._kind, self._fence = "fence-line", fence.group(1)
            return ""
        if _RULE.match(line):
            if final:
                return ""
            self._kind = "skip"
            return ""
        self._header = []
        rest = line
        while True:
            quote = _QUOTE.match(rest)
            if not quote:
                break
            rest = rest[quote.end() :]
        for marker in (_HEADING, _LIST_ITEM):
            match = marker.match(rest)
            if match:
                rest = rest[match.end() :]
                break
        self._kind = "text"
        self._line = ""
        return rest

    # -- at the end of a line -----------------------------------------------------------------
    def _end_line(self) -> str:
        kind = self._kind
        released = ""
        if kind in ("start", "code-start"):
            released = self._classify(final=True)
            kind = self._kind
        line, self._line = self._line, ""
        if kind == "fence-line":
            self._kind = "code-start"
            return ""
        if kind in ("code", "code-start"):
            self._kind = "code-start"
            return ""
        self._kind = "start"
        if kind == "table":
            return _table_row(line, self._header)
        if kind == "skip":
            return ""
        return released + "\n"


def _could_close(line: str, fence: str) -> bool:
    """Whether `line` (so far) may still become the fence that closes `fence`."""
    stripped = line.lstrip(" ")
    return len(line) - len(stripped) <= 3 and stripped == fence[0] * len(stripped) and len(stripped) < 3


def _table_row(line: str, header: list[str]) -> str:
    """A table row as a sentence; the first row of a table is its header, the divider is skipped."""
    if _TABLE_DIVIDER.fullmatch(line):
        return ""
    cells = [inline_text(cell).strip() for cell in line.strip().strip("|").split("|")]
    if not header:
        header.extend(cells)
        return ""
    parts = [f"{name}: {cell}" if name else cell for name, cell in zip(header + [""] * len(cells), cells) if cell]
    return ", ".join(parts) + ".\n" if parts else ""
