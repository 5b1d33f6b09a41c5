"""Cutting text that arrives in pieces into units to speak one request each (the WebSocket
session's `split_granularity`, as vLLM-Omni names it).

`none`: one unit per utterance, at `input.done`. `sentence`: a unit ends at `.` `!` `?` followed
by whitespace (so `3.14`, `e.g.x` and a `.` at the very end of what arrived so far wait for more),
or at once at a CJK / Indic / Arabic sentence mark. `clause`: also at commas and semicolons
(`,` `;` after whitespace rules like `.`; `，` `；` `،` at once). `input.done` flushes the rest.
"""
from __future__ import annotations

GRANULARITIES = ("none", "sentence", "clause")
# Marks that may end a unit only once whitespace follows them (abbreviations, decimals).
_NEEDS_SPACE = {"sentence": ".!?", "clause": ".!?,;"}
# Marks that end a unit where they stand.
_AT_ONCE = {"sentence": "。！？…।॥؟", "clause": "。！？…।॥؟，；、،"}


class TextSplitter:
    def __init__(self, granularity: str):
        if granularity not in GRANULARITIES:
            raise ValueError(f"unknown split granularity {granularity!r}")
        self.granularity = granularity
        self._text = ""

    @property
    def pending(self) -> str:
        return self._text

    def feed(self, text: str) -> list[str]:
        """Add text; returns the units it completed (stripped, never blank)."""
        self._text += text
        if self.granularity == "none":
            return []
        units, rest = self._cut(self._text)
        self._text = rest
        return units

    def flush(self) -> list[str]:
        """The end of the utterance: whatever is left is the last unit."""
        text, self._text = self._text, ""
        if self.granularity == "none":
            return [text.strip()] if text.strip() else []
        units, rest = self._cut(text)
        return units + ([rest.strip()] if rest.strip() else [])

    def _cut(self, text: str) -> tuple[list[str], str]:
        needs_space, at_once = _NEEDS_SPACE[self.granularity], _AT_ONCE[self.granularity]
        units, start = [], 0
        for i, ch in enumerate(text):
            end = None
            if ch in at_once:
                end = i + 1
            elif ch in needs_space and i + 1 < len(text) and text[i + 1].isspace():
                end = i + 1
            if end is not None:
                unit = text[start:end].strip()
                if unit:
                    units.append(unit)
                start = end
        return units, text[start:]
