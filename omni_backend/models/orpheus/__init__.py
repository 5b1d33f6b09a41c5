"""Orpheus TTS: a Llama LM that emits SNAC codes (7 tokens per 2048-sample frame) and the SNAC
24 kHz codec decoder that turns them into audio (:mod:`.snac`).

Random-weight checkpoints (the built-in `orpheus_tiny_random` serves them, tests use them):
:mod:`.random_checkpoint` (the LM and its tokenizer, ``python -m omni_backend.models.orpheus.random_checkpoint OUT``),
on :mod:`.random_llama` (any Llama in the Hugging Face layout), and :mod:`.random_snac` (the codec,
``python -m omni_backend.models.orpheus.random_snac OUT``).
"""
