"""Text that arrives in pieces (an LLM still writing), tokenized exactly as the whole text.

The talker reads ``<|im_start|>assistant\\n{text}<|im_end|>...``; the tokenizer splits added tokens
out first, then cuts the rest into pre-tokenizer words and runs BPE inside each word. So the ids
of ``assistant\\n{text}`` are final word by word, except where later text can still change them:

* the last word can grow (``Hel`` + ``lo``), or a space before it can join the next word;
* a tail that begins an added token's text (``<|im_`` of ``<|im_end|>``) can still become one.

:class:`StreamedText` keeps that tail back and hands out the ids before it as they become final;
``finish()`` (the end of the input) settles the tail. The ids handed out, in order, equal
``encode("assistant\\n" + whole text)``: the whole text's ``input_ids[1:-5]`` as
:class:`~.prompt.PromptBuilder` tokenizes it. Only the held-back tail is re-tokenized per piece.
"""
from __future__ import annotations

from omni_backend.errors import InvalidRequest

from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer

__all__ = ["StreamedText", "ROLE_TEXT", "MAX_STREAMED_CHARS"]

# The text of the assistant turn after <|im_start|>, before the user's text (tokenizer.assistant_text).
ROLE_TEXT = "assistant\n"
ROLE_IDS = 2               # "assistant", "\n": the prompt's role ids after <|im_start|>
MAX_STREAMED_CHARS = 65536  # one request's whole text; the cache bounds what is spoken anyway


class StreamedText:
    """The ids of ``assistant\\n{text}`` for a text given piece by piece (``push``, then ``finish``)."""

    def __init__(self, tokenizer: QwenTextTokenizer, max_chars: int = MAX_STREAMED_CHARS) -> None:
        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self.ids: list[int] = []   # final ids so far (role ids first)
        self.chars = 0             # characters of text received
        self.ended = False
        self._tail = ROLE_TEXT     # text not yet turned into final ids
        self._longest_added = max((len(t) for t in tokenizer.added_tokens), default=0)

    @property
    def text_ids(self) -> list[int]:
        """The final ids of the text itself (after the role ids)."""
        return self.ids[ROLE_IDS:]

    def push(self, text: str) -> list[int]:
        """Add a piece; returns the ids that became final with it (maybe none)."""
        if self.ended:
            raise InvalidRequest("text", "the input has ended; no more text is taken")
        if self.chars + len(text) > self.max_chars:
            raise InvalidRequest("text", f"the streamed text would be {self.chars + len(text)} characters; "
                                         f"the limit is {self.max_chars}")
        self.chars += len(text)
        self._tail += text
        words = self.tokenizer.encode_words(self._tail)
        hold = min(words[-1][0] if words else 0, self._added_token_start(self._tail))
        keep = max((start for start, _ in words if start <= hold), default=0)   # a word boundary
        if keep == 0:
            return []
        new = [i for start, ids in words if start < keep for i in ids]
        self._tail = self._tail[keep:]
        self.ids.extend(new)
        return new

    def finish(self) -> list[int]:
        """The input is complete: the held-back tail's ids."""
        if self.ended:
            return []
        self.ended = True
        new = [i for _, ids in self.tokenizer.encode_words(self._tail) for i in ids] if self._tail else []
        self._tail = ""
        self.ids.extend(new)
        return new

    def _added_token_start(self, text: str) -> int:
        """Where a suffix of ``text`` starts that is the beginning of an added token's text (it
        may still become that token); ``len(text)`` when there is none."""
        for start in range(max(0, len(text) - self._longest_added + 1), len(text)):
            suffix = text[start:]
            if any(token.startswith(suffix) for token in self.tokenizer.added_tokens):
                return start
        return len(text)
