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
