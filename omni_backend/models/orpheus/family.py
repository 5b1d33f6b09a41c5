"""Orpheus pipelines: a Llama LM writing SNAC codes as tokens -> the SNAC 24 kHz decoder.

Stage 0 (``lm``) runs the LM on the torch engine or on vLLM (``engine: vllm``) and streams the
SNAC codes its tokens carry (``CODES`` [n], int64; token rules in :mod:`.tokens`). The transfer
(:class:`.snac_windows.SnacWindows`) cuts them into the released 4-frame windows, which stage 1
(``snac``, batched across streams, Float32) decodes into the audio of each window's second frame.
"""
from __future__ import annotations

from omni_backend.adapters.base import Param
from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

from .tokens import VOICES

# The voices the checkpoint was finetuned on (each request's prompt starts "{voice}: "); read by
# the entry's adapter, which checks a request's voice against them.
VOICES_OPTION = Param("voices", str, default=", ".join(VOICES), max_len=4096,
                      help="the checkpoint's voices, comma-separated, the first the default; "
                           "empty for a checkpoint that takes none (the pretrained one)")
# Where the SNAC 24 kHz folder (config.json + pytorch_model.bin) is; unset: <model>/snac_24khz.
SNAC_OPTIONS = (Param("snac_path", str, max_len=4096, help="SNAC 24 kHz checkpoint folder"),)


def _orpheus(name: str, description: str, default_model: str | None, deploy: str) -> PipelineConfig:
    return PipelineConfig(
        name=name,
        family="orpheus",
        adapter="omni_backend.models.orpheus.adapter.OrpheusAdapter",
        description=description,
        default_deploy=deploy,
        default_model=default_model,
        sample_rate=24000,
        stages=(
            StageConfig(stage_id=0, model_stage="lm", kind="stream", engines=("torch", "vllm"),
                        options=(VOICES_OPTION,),
                        outputs=(TensorSpec("CODES", "INT64", (-1,)),
                                 TensorSpec("ERROR", "STRING", (1,))),   # its errors, as data (triton/stage.py)
                        triton_class="omni_backend.models.orpheus.lm_stage.OrpheusLMStage"),
            StageConfig(stage_id=1, model_stage="snac", kind="batched", input_sources=(0,), final_output=True,
                        options=SNAC_OPTIONS,
                        inputs=(TensorSpec("CODES", "INT64", (-1,)), TensorSpec("NOISE_SEED", "INT64", (1,))),
                        outputs=(TensorSpec("AUDIO", "FP32", (-1,)),),
                        transfer="omni_backend.models.orpheus.snac_windows.SnacWindows",
                        triton_class="omni_backend.models.orpheus.snac_stage.SnacStage"),
        ),
    )


PIPELINES = (
    _orpheus("orpheus", "Orpheus TTS (Llama 3 LM -> SNAC 24 kHz) on vLLM; needs --model PATH "
                        "(the LM folder; SNAC in PATH/snac_24khz or the snac stage's snac_path)", None, "orpheus"),
    _orpheus("orpheus_tiny_random", "Orpheus tiny RANDOM weights (speaks noise) on vLLM: the LM -> SNAC path "
                                    "out of the box", "builtin:orpheus_tiny_random", "orpheus_tiny_random"),
)
