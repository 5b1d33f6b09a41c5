"""Qwen3-Omni (thinker -> talker -> code2wav) in pure torch, loading the released
``Qwen3-Omni-30B-A3B-Instruct`` checkpoint layout unchanged; text, audio and image input (the
thinker's audio tower and vision encoder, :mod:`.audio_tower`, :mod:`.vision_encoder`).

Offline, one request (what the parity tests run)::

    from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint
    from omni_backend.models.qwen3_omni.generate import generate

    checkpoint = load_checkpoint(path)                  # thinker (+ encoders), talker, code2wav; float32 CPU
    result = generate(checkpoint, messages=[{"role": "user", "content": "Hi"}], speaker="Ethan")
    result.sequence     # prompt + answer token ids
    result.codes        # [num_code_groups, frames] int64
    result.waveform     # [samples] float32, 24 kHz

Streamed thinker -> talker hand-off: :class:`.prompt.TalkerInput` (``add`` the thinker's tokens as
they come; ``ready`` / ``prefill()`` / ``trailing``); stateless codec windows:
:meth:`.code2wav.Code2Wav.decode_window`.
"""
