"""Qwen3-TTS pipelines: talker (+ code predictor) -> code2wav.

The talker streams codec frames (CODES [frames, 16]; a voice-clone prompt's own codes first as
CONTEXT_CODES); codec windows (omni_backend/triton/codec_windows.py) carry them to code2wav.
"""
from __future__ import annotations

from omni_backend.adapters.base import Param
from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

# Deploy defaults for the code predictor's sampling (codebooks 1..15); unset: the checkpoint's
# generation_config.json. A request's own subtalker_* parameters override them.
CODE_PREDICTOR_OPTIONS = (
    Param("subtalker_do_sample", bool),
    Param("subtalker_temperature", float, lo=1e-3, hi=5.0),
    Param("subtalker_top_k", int, lo=0, hi=2048),
    Param("subtalker_top_p", float, lo=1e-3, hi=1.0),
)
# How long a request whose text arrives in pieces (streaming_input) may wait for more text, for
# its first text token or, once running, with all text that arrived already read: then it ends
# with `invalid_request: text: ...` and frees its slot.
TEXT_WAIT_OPTION = Param("text_wait_s", float, default=30.0, lo=0.1, hi=3600.0,
                         help="seconds a streaming_input request may wait for more text")
# Where the codec decoder runs (talker_decoding.py): its own stage, batching windows across
# streams (throughput), or in the talker's process, which then streams AUDIO (first audio without
# the entry -> code2wav -> entry round trip), or both: the first window of a request alone in the
# talker there (its first audio), every other window in code2wav's stage.
CODE2WAV_PLACEMENT_OPTION = Param("code2wav", str, default="own_stage", choices=("own_stage", "in_talker", "adaptive"),
                                  help="where code2wav decodes: own_stage (batched across streams), "
                                       "in_talker (the talker's process decodes its own windows) or adaptive "
                                       "(the first window of a request alone in the talker there, every other "
                                       "window in its own stage)")
# torch.compile modes (inductor's) of the static frame step (compiled_step.py); on CUDA the engine's graphs
# capture the compiled step. Not inductor's reduce-overhead: the engine's own graphs do that.
COMPILE_MODES = ("none", "default", "max-autotune-no-cudagraphs")
COMPILE_OPTION = Param("compile", str, default="none", choices=COMPILE_MODES,
                       help="torch.compile of the frame step: none, default or max-autotune-no-cudagraphs "
                            "(inductor modes; runs the static step, captured in the engine's CUDA graphs)")
TALKER_OPTIONS = CODE_PREDICTOR_OPTIONS + (TEXT_WAIT_OPTION, CODE2WAV_PLACEMENT_OPTION, COMPILE_OPTION)


def _qwen3_tts(name: str, description: str, default_model: str | None) -> PipelineConfig:
    return PipelineConfig(
        name=name,
        family="qwen3_tts",
        adapter="omni_backend.models.qwen3_tts.adapter.Qwen3TTSAdapter",
        description=description,
        default_deploy=name,
        default_model=default_model,
        stages=(
            StageConfig(stage_id=0, model_stage="talker", kind="stream", options=TALKER_OPTIONS,
                        outputs=(TensorSpec("CODES", "INT64", (-1, -1)), TensorSpec("CONTEXT_CODES", "INT64", (-1, -1)),
                                 TensorSpec("AUDIO", "FP32", (-1,)),   # code2wav: in_talker / adaptive
                                 # code2wav: adaptive: the generated frames [first, end) AUDIO is of
                                 TensorSpec("AUDIO_SPAN", "INT64", (2,)),
                                 TensorSpec("ERROR", "STRING", (1,))),   # its errors, as data (triton/stage.py)
                        triton_class="omni_backend.models.qwen3_tts.talker_stage.Qwen3TalkerStage"),
            StageConfig(stage_id=1, model_stage="code2wav", kind="batched", input_sources=(0,), final_output=True,
                        inputs=(TensorSpec("CODES", "INT64", (-1, -1)), TensorSpec("LEFT_CONTEXT", "INT32", (1,))),
                        outputs=(TensorSpec("AUDIO", "FP32", (-1,)),),
                        transfer="omni_backend.triton.codec_windows.CodecWindows",
                        triton_class="omni_backend.models.qwen3_tts.code2wav_stage.Code2WavStage"),
        ),
    )


PIPELINES = (
    _qwen3_tts("qwen3_tts", "Qwen3-TTS 12 Hz (CustomVoice / VoiceDesign / Base): talker + code predictor -> "
                            "code2wav; needs --model PATH", None),
    _qwen3_tts("qwen3_tts_tiny_random", "Qwen3-TTS tiny RANDOM weights (speaks noise): the two-stage path out of "
                                        "the box", "builtin:qwen3_tts_tiny_random"),
    _qwen3_tts("qwen3_tts_tiny_random_base", "Qwen3-TTS tiny RANDOM weights, Base checkpoint (voice cloning from "
                                             "ref_audio; speaks noise)", "builtin:qwen3_tts_tiny_random_base"),
)
