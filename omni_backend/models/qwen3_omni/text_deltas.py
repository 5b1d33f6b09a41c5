"""The thinker's answer as text deltas, token by token.

Byte-level BPE splits characters across tokens (a Chinese character is often two or three), so the
text of the ids so far can end in an incomplete UTF-8 sequence (decoded as U+FFFD): that tail is
held back until the token that completes it arrives. Special tokens (``<|im_end|>``) decode to
nothing. The deltas concatenated equal the decode of the whole answer.
"""
from __future__ import annotations

from typing import Sequence

from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer

__all__ = ["TextDeltas"]

REPLACEMENT = "\ufffd"


class TextDeltas:
    def __init__(self, tokenizer: QwenTextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""   # the text handed out so far

    def add(self, ids: Sequence[int], last: bool = False) -> str:
        """The text the new ids complete (``last``: the answer ended, hand out everything)."""
        self.ids.extend(int(i) for i in ids)
        text = self.tokenizer.decode(self.ids)
        if not last and text.endswith(REPLACEMENT):
            text = text.rstrip(REPLACEMENT)
        if not text.startswith(self.sent):   # a decode that changed earlier text: only append
            common = 0
            while common < min(len(text), len(self.sent)) and text[common] == self.sent[common]:
                common += 1
            text = self.sent + text[common:]
        delta = text[len(self.sent):]
        self.sent = text
        return delta
