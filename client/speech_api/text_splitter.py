"""Cutting text that arrives in pieces into units to speak one request each (the WebSocket
session's `split_granularity`, as vLLM-Omni names it).

`none`: one unit per utterance, at `input.done`. `sentence`: a unit ends at `.` `!` `?` followed
by whitespace (so `3.14`, `e.g.x` and a `.` at the very end of what arrived so far wait for more),
or at once at a CJK / Indic / Arabic sentence mark. `clause`: also at commas and semicolons
(`,` `;` after whitespace rules like `.`; `，` `；` `،` at once). `input.done` flushes the rest.

No unit is longer than a request to the pipeline may be (`max_chars`, the entry's 4,096 characters): text that
reaches it without a unit end is cut at its last sentence end, else its last whitespace, else at
the limit (a `none` utterance too, which is then spoken as several requests). Only text that
arrived since the last piece is scanned, so an utterance costs time linear in its length however
it is cut into pieces.
"""
from __future__ import annotations

from omni_backend.adapters.base import MAX_TEXT_CHARS

GRANULARITIES = ("none", "sentence", "clause")
# Marks that may end a unit only once whitespace follows them (abbreviations, decimals).
_NEEDS_SPACE = {"sentence": ".!?", "clause": ".!?,;"}
# Marks that end a unit where they stand.
_AT_ONCE = {"sentence": "。！？…।॥؟", "clause": "。！？…।॥؟，；、،"}


class TextSplitter:
    def __init__(self, granularity: str, max_chars: int = MAX_TEXT_CHARS):
        if granularity not in GRANULARITIES:
            raise ValueError(f"unknown split granularity {granularity!r}")
        self.granularity = granularity
        self.max_chars = max_chars
        self._text = ""
        self._scanned = 0   # no unit ends before this index of _text

    @property
    def pending(self) -> str:
        return self._text

    def feed(self, text: str) -> list[str]:
        """Add text; returns the units it completed (stripped, never blank)."""
        self._text += text
        if self.granularity == "none":
            return []
        units, rest = self._cut(self._text, self._scanned)
        bounded, rest = self._bounded(rest)
        self._text = rest
        # a mark at the very end is decided by the next character
        self._scanned = max(0, len(rest) - 1)
        return units + bounded

    def flush(self) -> list[str]:
        """The end of the utterance: whatever is left is the last unit (or units, past `max_chars`)."""
        text, self._text, scanned, self._scanned = self._text, "", self._scanned, 0
        units: list[str] = []
        if self.granularity != "none":
            units, text = self._cut(text, scanned)
        bounded, rest = self._bounded(text)
        return units + bounded + ([rest.strip()] if rest.strip() else [])

    def _cut(self, text: str, begin: int) -> tuple[list[str], str]:
        needs_space, at_once = _NEEDS_SPACE[self.granularity], _AT_ONCE[self.granularity]
        units: list[str] = []
        start = 0
        for i in range(begin, len(text)):
            ch = text[i]
            end = None
            if ch in at_once:
                end = i + 1
            elif ch in needs_space and i + 1 < len(text) and text[i + 1].isspace():
                end = i + 1
            if end is not None:
                pieces, last = self._bounded(text[start:end])
                units += pieces + ([last.strip()] if last.strip() else [])
                start = end
        return units, text[start:]

    def _bounded(self, text: str) -> tuple[list[str], str]:
        """Units of at most `max_chars` cut off the front of `text` while it is longer; the rest."""
        units: list[str] = []
        while len(text) > self.max_chars:
            window = text[:self.max_chars]
            cut = _last_sentence_end(window) or _last_space(window) or self.max_chars
            unit, text = window[:cut].strip(), text[cut:]
            if unit:
                units.append(unit)
        return units, text


def _last_sentence_end(window: str) -> int:
    """The index just past the window's last sentence end (0: none)."""
    for i in range(len(window) - 1, 0, -1):
        ch = window[i - 1]
        if ch in _AT_ONCE["sentence"] or (ch in _NEEDS_SPACE["sentence"] and window[i].isspace()):
            return i
    return 0


def _last_space(window: str) -> int:
    """The index just past the window's last whitespace (0: none)."""
    for i in range(len(window) - 1, 0, -1):
        if window[i].isspace():
            return i + 1
    return 0
