"""Support for tests, benchmarks and device checks, kept out of the model packages: writers of
random-weight checkpoints in the released layouts, and diagnostics that compare engine paths.

* :mod:`.qwen3_tts_random`: Qwen3-TTS checkpoints (``python -m omni_backend.testing.qwen3_tts_random``);
* :mod:`.qwen3_tts_random_speech_tokenizer`: their ``speech_tokenizer/`` folder (the codec);
* :mod:`.qwen3_tts_graph_check`: codes with CUDA graphs against the same step run eagerly;
* :mod:`.long_streams`: a model repository whose tiny Qwen3-TTS streams run until their
  ``max_new_tokens`` (eos held back), for tests that kill or stop a server under streams.
"""
