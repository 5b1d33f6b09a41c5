"""What the Qwen3 speech families (:mod:`omni_backend.models.qwen3_tts`,
:mod:`omni_backend.models.qwen3_omni`) share: the modules that hold a Qwen3 decoder layer's tensors
(:mod:`.layers`), the code predictor's decoder (:mod:`.code_predictor`), the codec decoder's
building blocks (:mod:`.code2wav_layers`), the text tokenizer (:mod:`.tokenizer`), the talker's
trailing-text rows (:mod:`.trailing_text`), the settings both ``config.json`` readers share
(:mod:`.config`), the checkpoint dtype names (:mod:`.dtype`), and what both families' random-weight
writers share (:mod:`.random_weights`, :mod:`.distance_head`).

It is not a family: it declares no pipeline and is registered nowhere. The families import it and
never each other.
"""
