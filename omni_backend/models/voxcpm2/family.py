"""VoxCPM2 pipelines (form C): a language model whose every step runs a diffusion side module ->
the AudioVAE decoder.

Stage 0 (``lm``) runs the MiniCPM4 backbone, residual LM, local diffusion transformer and local
encoder on the shared AR engine (:mod:`.runner`) and streams latent patches (LATENTS [frames, D]).
The transfer (:class:`.vae_windows.VAEWindows`) cuts them into stateless windows, which stage 1
(``vae``, Float32, batched across streams) decodes to 48 kHz audio.
"""
from __future__ import annotations

from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

OUTPUT_RATE = 48000   # the released AudioVAE's out_sample_rate: what every response is labelled


def _voxcpm2(name: str, description: str, default_model: str | None, deploy: str) -> PipelineConfig:
    return PipelineConfig(
        name=name,
        family="voxcpm2",
        adapter="omni_backend.models.voxcpm2.adapter.VoxCPM2Adapter",
        description=description,
        default_deploy=deploy,
        default_model=default_model,
        sample_rate=OUTPUT_RATE,
        stages=(
            StageConfig(stage_id=0, model_stage="lm", kind="stream",
                        outputs=(TensorSpec("LATENTS", "FP32", (-1, -1)),
                                 TensorSpec("CONTEXT", "INT32", (1,)),
                                 TensorSpec("PATCH_SIZE", "INT32", (1,)),
                                 TensorSpec("ERROR", "STRING", (1,))),   # its errors, as data (triton/stage.py)
                        triton_class="omni_backend.models.voxcpm2.lm_stage.VoxCPM2LMStage"),
            StageConfig(stage_id=1, model_stage="vae", kind="batched", input_sources=(0,), final_output=True,
                        inputs=(TensorSpec("LATENTS", "FP32", (-1, -1)), TensorSpec("LEFT_CONTEXT", "INT32", (1,))),
                        outputs=(TensorSpec("AUDIO", "FP32", (-1,)),),
                        transfer="omni_backend.models.voxcpm2.vae_windows.VAEWindows",
                        triton_class="omni_backend.models.voxcpm2.vae_stage.VAEStage"),
        ),
    )


PIPELINES = (
    _voxcpm2("voxcpm2", "VoxCPM2 (MiniCPM4 LM + diffusion side module per step -> AudioVAE 48 kHz); needs "
                        "--model PATH (the openbmb/VoxCPM2 folder)", None, "voxcpm2"),
    _voxcpm2("voxcpm2_tiny_random", "VoxCPM2 tiny RANDOM weights (speaks noise): the form-C path out of the box",
             "builtin:voxcpm2_tiny_random", "voxcpm2_tiny_random"),
)
