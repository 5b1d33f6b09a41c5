"""The Qwen text tokenizer of a Qwen3-TTS or Qwen3-Omni checkpoint, through the ``tokenizers`` package.

It produces the ids the reference produces with its transformers processor
(``Qwen2TokenizerFast`` loaded by ``AutoProcessor.from_pretrained(dir, fix_mistral_regex=True)``).
One quirk of that loader matters: transformers 4.57.3 replaces the pre-tokenizer's split regex
with a corrected "Mistral" regex when the checkpoint's ``config.json`` is *not* recognised as
safe, which for a local folder means: a ``transformers_version`` that is missing, or newer than
4.57.2 and older than 5.0.0, or at most 4.57.2 with a Mistral-family ``model_type``. The
released configs written by transformers 4.57.3 fall in the first case, so this matters for
real checkpoints; :func:`uses_patched_split` reproduces the rule.

Prompt texts are built as the reference wrappers build them (:func:`assistant_text`,
:func:`instruct_text`).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

__all__ = [
    "QwenTextTokenizer",
    "assistant_text",
    "instruct_text",
    "ref_text",
    "uses_patched_split",
    "PATCHED_SPLIT_REGEX",
]

# The split regex transformers 4.57.3 installs when it patches the pre-tokenizer.
PATCHED_SPLIT_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The Qwen2 split regex (what tokenizer.json carries; used when only vocab.json + merges.txt exist).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def ref_text(text: str) -> str:
    """The reference transcript of a voice-clone prompt (ICL)."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def _version_tuple(version: str) -> tuple:
    parts = []
    for piece in version.split("."):
        match = re.match(r"\d+", piece)
        parts.append(int(match.group()) if match else 0)
        if not match or match.group() != piece:
            break
    return tuple(parts)


def uses_patched_split(model_config: Mapping[str, Any] | None) -> bool:
    """Whether the reference loader replaces the split regex for a checkpoint folder with this
    ``config.json`` content (``None``: the folder has no config.json)."""
    if model_config is None:
        return False
    version = model_config.get("transformers_version")
    model_type = model_config.get("model_type")
    if version:
        parsed = _version_tuple(str(version))
        if parsed <= (4, 57, 2):
            if model_type is not None and model_type not in _MISTRAL_MODEL_TYPES:
                return False
        elif parsed >= (5, 0, 0):
            return False
    return True


class QwenTextTokenizer:
    """Text -> ids, equal to the reference's ``Qwen3TTSModel._tokenize_texts([text])[0]``."""

    def __init__(self, checkpoint_dir: str, model_config: Mapping[str, Any] | None = None) -> None:
        from tokenizers import Regex, Tokenizer, pre_tokenizers

        if model_config is None:
            path = os.path.join(checkpoint_dir, "config.json")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as handle:
                    model_config = json.load(handle)
        self.patched_split = uses_patched_split(model_config)
        path = os.path.join(checkpoint_dir, "tokenizer.json")
        if os.path.isfile(path):
            tokenizer = Tokenizer.from_file(path)
        else:
            vocab_path = os.path.join(checkpoint_dir, "vocab.json")
            merges_path = os.path.join(checkpoint_dir, "merges.txt")
            if not (os.path.isfile(vocab_path) and os.path.isfile(merges_path)):
                raise FileNotFoundError(f"{checkpoint_dir}: no tokenizer.json and no vocab.json + merges.txt")
            tokenizer = Tokenizer.from_str(json.dumps(self._spec_from_vocab(checkpoint_dir, vocab_path, merges_path)))
        if self.patched_split:
            # what transformers does: replace the first pre-tokenizer (the split) in place
            if not isinstance(tokenizer.pre_tokenizer, pre_tokenizers.Sequence):
                raise ValueError(f"{checkpoint_dir}: expected a Sequence pre-tokenizer (Qwen BPE)")
            tokenizer.pre_tokenizer[0] = pre_tokenizers.Split(pattern=Regex(PATCHED_SPLIT_REGEX), behavior="isolated")
        self._tokenizer = tokenizer

    @staticmethod
    def _spec_from_vocab(checkpoint_dir: str, vocab_path: str, merges_path: str) -> dict:
        """A tokenizer.json equivalent of the slow Qwen2 tokenizer files."""
        with open(vocab_path, encoding="utf-8") as handle:
            vocab = json.load(handle)
        merges = []
        with open(merges_path, encoding="utf-8") as handle:
            for line in handle:
                line = line.rstrip("\n")
                if not line or line.startswith("#version"):
                    continue
                merges.append(line)
        added = []
        config_path = os.path.join(checkpoint_dir, "tokenizer_config.json")
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as handle:
                decoder = json.load(handle).get("added_tokens_decoder", {})
            for index, token in sorted(decoder.items(), key=lambda kv: int(kv[0])):
                added.append({"id": int(index), "content": token["content"],
                              "single_word": token.get("single_word", False), "lstrip": token.get("lstrip", False),
                              "rstrip": token.get("rstrip", False), "normalized": token.get("normalized", False),
                              "special": token.get("special", True)})
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT_REGEX}, "behavior": "Isolated", "invert": False},
                byte_level,
            ]},
            "post_processor": byte_level,
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges},
        }

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text; an incomplete UTF-8 sequence at the end shows as U+FFFD."""
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_words(self, text: str) -> list[tuple[int, list[int]]]:
        """``encode(text)`` grouped by pre-tokenizer word (BPE never merges across words; an
        added token is a word of its own): ``(start character in text, the word's ids)`` each."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        words: list[tuple[int, list[int]]] = []
        last = None
        for token, word, (start, _end) in zip(encoding.ids, encoding.word_ids, encoding.offsets):
            if word is None or word != last or not words:
                words.append((start, [token]))
                last = word
            else:
                words[-1][1].append(token)
        return words

    @property
    def added_tokens(self) -> tuple[str, ...]:
        """The added (special) tokens' texts: matched in the raw text before any other rule."""
        if not hasattr(self, "_added"):
            self._added = tuple(t.content for t in self._tokenizer.get_added_tokens_decoder().values())
        return self._added

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)
