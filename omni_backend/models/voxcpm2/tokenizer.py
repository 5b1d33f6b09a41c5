"""Text -> token ids as the reference: the checkpoint's Llama-style fast tokenizer
(``tokenizer.json``) without special tokens, each token made of two or more Chinese characters
split into its characters (``voxcpm``'s ``mask_multichar_chinese_tokens``)."""
from __future__ import annotations

import os

from tokenizers import Tokenizer


def _is_multichar_chinese(token: str) -> bool:
    return len(token) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in token)


class TextTokenizer:
    def __init__(self, path: str):
        self._tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self._unk = self._tok.token_to_id("<unk>")
        # as the reference: a token is split when its text without "▁" is itself such a vocabulary
        # token ("▁大人" stays whole unless "大人" is in the vocabulary)
        self._multichar = {t for t in self._tok.get_vocab(with_added_tokens=True) if _is_multichar_chinese(t)}

    def __call__(self, text: str) -> list[int]:
        ids = []
        for token in self._tok.encode(text, add_special_tokens=False).tokens:
            clean = token.replace("▁", "")
            pieces = list(clean) if clean in self._multichar else [token]
            for piece in pieces:
                i = self._tok.token_to_id(piece)
                ids.append(self._unk if i is None else i)
        return ids
