"""The toy family's one pipeline: writer -> shaper -> render."""
from __future__ import annotations

from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

PIPELINES = (
    PipelineConfig(
        name="toy_three_stage",
        family="toy",
        adapter="tests.toy_family.adapter.ToyAdapter",
        description="test-only family: three stages passing tensors",
        default_deploy="toy_three_stage",
        default_model="builtin:toy",
        sample_rate=8000,
        stages=(
            # TEXT_DELTA reaches the client as it arrives; ERROR carries the writer's errors over BLS
            StageConfig(stage_id=0, model_stage="writer", kind="stream",
                        outputs=(TensorSpec("TOKENS", "INT64", (-1,)), TensorSpec("TEXT_DELTA", "STRING", (1,)),
                                 TensorSpec("ERROR", "STRING", (1,))),
                        client_outputs=("TEXT_DELTA",),
                        triton_class="tests.toy_family.stages.Writer"),
            StageConfig(stage_id=1, model_stage="shaper", kind="stream", input_sources=(0,),
                        inputs=(TensorSpec("TOKENS", "INT64", (-1,)),),
                        outputs=(TensorSpec("FRAMES", "FP32", (-1, 2)),),
                        transfer="tests.toy_family.transfers.PieceByPiece",
                        triton_class="tests.toy_family.stages.Shaper"),
            StageConfig(stage_id=2, model_stage="render", kind="batched", input_sources=(1,), final_output=True,
                        inputs=(TensorSpec("FRAMES", "FP32", (-1, 2)), TensorSpec("GAIN", "FP32", (1,))),
                        outputs=(TensorSpec("AUDIO", "FP32", (-1,)),),
                        transfer="tests.toy_family.transfers.RenderEach",
                        triton_class="tests.toy_family.stages.Render"),
        ),
    ),
)
