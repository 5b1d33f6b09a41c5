"""Orpheus TTS: a Llama LM that emits SNAC codes (7 tokens per 2048-sample frame) and the SNAC
24 kHz codec decoder that turns them into audio (:mod:`.snac`).

Random SNAC checkpoints for tests: ``python -m omni_backend.testing.snac_random OUT``.
"""
