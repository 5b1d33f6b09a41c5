"""The built-in pipelines."""
from __future__ import annotations

from omni_backend.pipeline import PipelineConfig, StageConfig, register

HIBARI = register(PipelineConfig(
    name="hibari",
    model_type="hibari",
    description="English voice embedded in the hibari-tts wheel (one stage, one chunk per sentence)",
    default_deploy="hibari",
    default_model="builtin:hibari",
    stages=(
        StageConfig(stage_id=0, model_stage="synthesizer", execution_type="generator",
                    engine_output_type="audio", final_output=True, owns_tokenizer=True,
                    triton_class="omni_backend.triton.hibari_stage.HibariStage"),
    ),
))


def _qwen3_tts(name: str, description: str, default_model: str | None) -> PipelineConfig:
    return PipelineConfig(
        name=name,
        model_type="qwen3_tts",
        description=description,
        default_deploy=name,
        default_model=default_model,
        stages=(
            StageConfig(stage_id=0, model_stage="talker", execution_type="llm_ar",
                        engine_output_type="latent", owns_tokenizer=True, stop_token_ids=(2150,),
                        triton_class="omni_backend.triton.qwen3_talker_stage.Qwen3TalkerStage"),
            StageConfig(stage_id=1, model_stage="code2wav", execution_type="llm_generation",
                        engine_output_type="audio", input_sources=(0,), final_output=True,
                        decoupled=False,
                        triton_class="omni_backend.triton.code2wav_stage.Code2WavStage"),
        ),
    )


QWEN3_TTS = register(_qwen3_tts(
    "qwen3_tts", "Qwen3-TTS 12 Hz (CustomVoice / VoiceDesign): talker + code predictor -> code2wav; "
                 "needs --model PATH", None))
QWEN3_TTS_TINY_RANDOM = register(_qwen3_tts(
    "qwen3_tts_tiny_random", "Qwen3-TTS tiny RANDOM weights (speaks noise): the two-stage path out of "
                             "the box", "builtin:qwen3_tts_tiny_random"))
QWEN3_TTS_TINY_RANDOM_BASE = register(_qwen3_tts(
    "qwen3_tts_tiny_random_base", "Qwen3-TTS tiny RANDOM weights, Base checkpoint (voice cloning from ref_audio; "
                                  "speaks noise)", "builtin:qwen3_tts_tiny_random_base"))
