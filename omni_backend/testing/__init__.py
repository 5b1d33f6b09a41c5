"""Support for tests, benchmarks and device checks, kept out of the model packages: writers of
random-weight checkpoints in the released layouts, and diagnostics that compare engine paths.
(A family whose built-in pipelines serve random checkpoints keeps their writer in its own folder:
``omni_backend.models.qwen3_tts.random_checkpoint``, ``omni_backend.models.qwen3_omni.random_checkpoint``,
``omni_backend.models.voxcpm2.random_checkpoint``.)

* :mod:`.qwen3_tts_graph_check`: codes with CUDA graphs against the same step run eagerly;
* :mod:`.llama_random`: Llama checkpoints in the Hugging Face layout (plain causal-LM stages);
* :mod:`.orpheus_random`: Orpheus checkpoints (a Llama, a Llama 3-style tokenizer with the
  released ids, weights that walk the SNAC code bands) (``python -m omni_backend.testing.orpheus_random``);
* :mod:`.snac_random`: SNAC 24 kHz codec checkpoints (``python -m omni_backend.testing.snac_random``).
* :mod:`.long_streams`: a model repository whose tiny Qwen3-TTS streams run until their
  ``max_new_tokens`` (eos held back), for tests that kill or stop a server under streams.
"""
