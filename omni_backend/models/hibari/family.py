"""The hibari family's pipeline: one stream stage that speaks a sentence per response."""
from __future__ import annotations

from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

PIPELINES = (
    PipelineConfig(
        name="hibari",
        family="hibari",
        adapter="omni_backend.models.hibari.adapter.HibariAdapter",
        description="English voice embedded in the hibari-tts wheel (one stage, one chunk per sentence)",
        default_deploy="hibari",
        default_model="builtin:hibari",
        openai_default=True,   # the voice that needs no checkpoint speaks for tts-1 & co.
        stages=(
            StageConfig(stage_id=0, model_stage="synthesizer", kind="stream", final_output=True,
                        outputs=(TensorSpec("AUDIO", "FP32", (-1,)),
                                 TensorSpec("ERROR", "STRING", (1,))),   # its errors, as data (triton/stage.py)
                        triton_class="omni_backend.models.hibari.stage.HibariStage"),
        ),
    ),
)
