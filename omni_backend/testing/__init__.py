"""Support for tests, benchmarks and device checks, kept out of the model packages: writers of
random-weight checkpoints in the released layouts, and diagnostics that compare engine paths.
(A family whose built-in pipelines serve random checkpoints keeps their writer in its own folder:
``omni_backend.models.qwen3_tts.random_checkpoint``, ``omni_backend.models.qwen3_omni.random_checkpoint``,
``omni_backend.models.voxcpm2.random_checkpoint``, ``omni_backend.models.orpheus.random_checkpoint``.)

* :mod:`.qwen3_tts_graph_check`: codes with CUDA graphs against the same step run eagerly;
* :mod:`.long_streams`: a model repository whose tiny Qwen3-TTS streams run until their
  ``max_new_tokens`` (eos held back), for tests that kill or stop a server under streams.
"""
