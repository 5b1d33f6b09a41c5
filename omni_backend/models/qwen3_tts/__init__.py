"""Qwen3-TTS (12 Hz) in pure torch: talker + code predictor (the AR stage) and the code2wav codec
decoder, loading the released checkpoint layout unchanged.

AR stage, as the Triton stage uses it::

    from omni_backend.engine import AsyncEngine, SamplingParams
    from omni_backend.models.qwen3_tts.checkpoint import load_checkpoint
    from omni_backend.models.qwen3_tts.runner import create_engine, sampling_params_from_defaults

    checkpoint = load_checkpoint(path, dtype="float32", device="cpu")
    builder = checkpoint.prompt_builder()            # validation errors: prompt.PromptError
    engine = AsyncEngine(create_engine(checkpoint, max_num_seqs=8, max_model_len=2048, num_threads=2))
    prompt = builder.build(text, speaker="vivian", language="auto", instruct=None)
    params = sampling_params_from_defaults(checkpoint.generation, seed=7, max_new_tokens=2048)
    async for event in engine.add_request(request_id, prompt, params):
        event.codes      # 16 codebook ids of one frame (None on an end event without a frame)
        event.finished   # last event; event.finish_reason: stop | length | cancelled | error
    engine.cancel(request_id)

Random checkpoints for tests: ``python -m omni_backend.models.qwen3_tts.random_checkpoint``.
"""
