"""Tiny random Orpheus checkpoints in the released layout (the built-in `orpheus_tiny_random`, tests).

An Orpheus checkpoint is a Llama folder (``config.json``, ``model.safetensors``,
``generation_config.json``) with a Llama 3 tokenizer extended by ``<custom_token_N>``
(``tokenizer.json``, ``tokenizer_config.json``), ids as released: ``<|begin_of_text|>`` 128000,
``<|eot_id|>`` 128009, ``<custom_token_0>`` 128256, vocabulary 156940. The Llama 3 vocabulary is
not ours to ship, so the tokenizer here is a byte-level BPE trained on a few sentences, padded to
the same ids; the special and custom tokens sit where the released ones do.

Weights are random, with one structure so that greedy decoding speaks: SNAC codes are written at
frame positions 0..6, each in its own band of custom tokens. Every band's embeddings share a
direction, and the LM head favours the next position's band for it, so generated tokens walk the
7 bands in order (valid codes, audio in every window) while the code chosen inside a band comes
from the random weights and the context (attention, cache, batching are all exercised).

    python -m omni_backend.models.orpheus.random_checkpoint OUT [--shape tiny|tiny2] [--seed N]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from omni_backend.models.orpheus.tokens import CODEBOOK_SIZE, CODE_OFFSET, FRAME_TOKENS

BOS, EOT, CUSTOM_BASE = 128000, 128009, 128256
VOCAB = 156940
SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
_CORPUS = [
    "Hello world, this is a test of the speech server. How are you today?",
    "The quick brown fox jumps over the lazy dog. I'm fine, thanks; we'll see you soon!",
    "tara: leah: jess: leo: dan: mia: zac: zoe: numbers 1234567890 and more text",
    "你好，世界。今天天气很好！Speech synthesis streams audio while it writes.",
]

SHAPES = {
    # hidden, layers, heads, kv heads, head_dim, intermediate, tied, llama3 rope scaling
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=32, intermediate_size=128,
                 tie_word_embeddings=False, rope_scaling=None),
    "tiny2": dict(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256,
                  tie_word_embeddings=False,
                  rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    # a mid-size Llama for GPU checks (~0.3 B parameters with the 157k vocabulary)
    "medium": dict(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, head_dim=64, intermediate_size=2816,
                   tie_word_embeddings=False,
                   rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
}


def write_tokenizer(out: Path) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json`` with the released Orpheus ids."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), BOS):           # pad to Llama 3's base vocabulary size
        vocab[f"<|filler_{i}|>"] = i
    names = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>",
             9: "<|eot_id|>"}
    added = [(BOS + i, names.get(i, f"<|reserved_special_token_{i}|>"), True) for i in range(256)]
    added += [(CUSTOM_BASE + n, f"<custom_token_{n}>", False) for n in range(VOCAB - CUSTOM_BASE)]
    data["added_tokens"] = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": special} for i, s, special in added]
    data["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}},
                                       {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                                       {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [BOS],
                                                                       "tokens": ["<|begin_of_text|>"]}}}
    tok = Tokenizer.from_str(json.dumps(data))
    assert tok.token_to_id("<custom_token_0>") == CUSTOM_BASE and tok.get_vocab_size() == VOCAB
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
        "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                             "eos_token": "<|eot_id|>"}, indent=2))


def _speaking_weights(hidden: int, seed: int):
    """The band structure (see the module docstring) as a weights hook."""
    def hook(state: dict[str, torch.Tensor]) -> None:
        g = torch.Generator().manual_seed(seed + 7)
        directions = torch.linalg.qr(torch.randn(hidden, FRAME_TOKENS, generator=g))[0].T   # [7, hidden], orthonormal
        embed = state["model.embed_tokens.weight"]
        head = state["lm_head.weight"]
        strength = 2.0 * hidden ** 0.5        # embeddings are randn: norm ~ sqrt(hidden)
        for p in range(FRAME_TOKENS):
            first = CUSTOM_BASE + CODE_OFFSET + p * CODEBOOK_SIZE + 1
            band = slice(first, first + CODEBOOK_SIZE - 1)
            embed[band] += strength * directions[p]
            head[band] += 3.0 * directions[(p - 1) % FRAME_TOKENS]
        embed[CUSTOM_BASE + 1] += strength * directions[FRAME_TOKENS - 1]   # start of speech -> position 0
    return hook


def write_random_orpheus(out_dir: str | Path, shape: str = "tiny", seed: int = 0) -> Path:
    from omni_backend.models.orpheus.random_llama import write_random_llama

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = SHAPES[shape]
    write_random_llama(out, vocab_size=VOCAB, hidden_size=s["hidden_size"], num_layers=s["num_layers"],
                       num_heads=s["num_heads"], num_kv_heads=s["num_kv_heads"], head_dim=s["head_dim"],
                       intermediate_size=s["intermediate_size"], tie_word_embeddings=s["tie_word_embeddings"],
                       rope_theta=500000.0, rope_scaling=s["rope_scaling"], max_position_embeddings=4096,
                       seed=seed, weights_hook=_speaking_weights(s["hidden_size"], seed))
    config = json.loads((out / "config.json").read_text())
    config.update(bos_token_id=BOS, eos_token_id=[CUSTOM_BASE + 2, EOT])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    # sampling values of the base Llama's file, as a fine-tune inherits them: the package ignores
    # them (sampling.py), and so must the server
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": BOS, "eos_token_id": [CUSTOM_BASE + 2, EOT],
                                                            "do_sample": True, "temperature": 0.6, "top_p": 0.9},
                                                           indent=2))
    write_tokenizer(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(write_random_orpheus(args.out, args.shape, args.seed))


if __name__ == "__main__":
    main()
