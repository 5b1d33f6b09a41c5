"""Qwen3-Omni pipelines: thinker -> talker (+ code predictor) -> code2wav.

Stage 0 (``thinker``, fed the client's chat turn; its audio tower and vision encoder encode the
recordings and images in it)
streams the answer: its prompt ids first (PROMPT_IDS, with PROMPT_HIDDEN: the hidden states the
talker reads at media placeholders, and PROMPT_GRIDS: the images' patch grids), then per token TOKEN_IDS and the text it completes (TEXT_DELTA, to the client as it
arrives), and FINISH_REASON with the last. The transfer :class:`.answer_handoff.AnswerHandoff`
opens one talker stream per request and hands it the thinker's tokens in chunks of the talker's
``thinker_chunk_tokens`` while both run; the talker starts once its prefill can be built and waits,
without holding up the rest of its batch, when it has read all the text that arrived. Stage 1
(``talker``) streams codec frames (CODES [frames, 16]); :class:`.codec_windows.ReferenceChunkWindows`
cuts them into windows for stage 2 (``code2wav``, batched across streams, Float32).
"""
from __future__ import annotations

from omni_backend.adapters.base import Param
from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec

# exact: each sequence alone in the reference's shapes (bit-exact, whatever it is served with);
# throughput: the rows of a decode step share forward passes (throughput_runner.py)
BATCH_MODE = Param("batch_mode", str, default="exact", choices=("exact", "throughput"),
                   help="exact: each sequence runs alone, bit-exact; throughput: the rows of a decode step share "
                        "forward passes (batched attention, MoE experts once per step), differing from solo only "
                        "by floating-point order")
THINKER_OPTIONS = (BATCH_MODE,)
TALKER_OPTIONS = (
    Param("thinker_chunk_tokens", int, default=4, lo=1, hi=4096,
          help="thinker tokens handed to the talker per message (the hand-off's chunk)"),
    Param("text_wait_s", float, default=60.0, lo=0.1, hi=3600.0,
          help="seconds the talker waits for the thinker's next tokens before the request fails"),
    BATCH_MODE,
)


def _qwen3_omni(name: str, description: str, default_model: str | None) -> PipelineConfig:
    return PipelineConfig(
        name=name,
        family="qwen3_omni",
        adapter="omni_backend.models.qwen3_omni.adapter.Qwen3OmniAdapter",
        description=description,
        default_deploy=name,
        default_model=default_model,
        stages=(
            StageConfig(stage_id=0, model_stage="thinker", kind="stream", options=THINKER_OPTIONS,
                        outputs=(TensorSpec("PROMPT_IDS", "INT64", (-1,)), TensorSpec("PROMPT_HIDDEN", "FP32", (-1, -1)),
                                 TensorSpec("PROMPT_GRIDS", "INT64", (-1, 3)), TensorSpec("TOKEN_IDS", "INT64", (-1,)),
                                 TensorSpec("TEXT_DELTA", "STRING", (1,)), TensorSpec("FINISH_REASON", "STRING", (1,)),
                                 TensorSpec("ERROR", "STRING", (1,))),   # its errors, as data (triton/stage.py)
                        client_outputs=("TEXT_DELTA", "FINISH_REASON"),
                        triton_class="omni_backend.models.qwen3_omni.thinker_stage.ThinkerStage"),
            StageConfig(stage_id=1, model_stage="talker", kind="stream", input_sources=(0,), options=TALKER_OPTIONS,
                        inputs=(TensorSpec("PROMPT_IDS", "INT64", (-1,), optional=True),
                                TensorSpec("PROMPT_HIDDEN", "FP32", (-1, -1), optional=True),
                                TensorSpec("PROMPT_GRIDS", "INT64", (-1, 3), optional=True),
                                TensorSpec("TOKEN_IDS", "INT64", (-1,), optional=True)),
                        outputs=(TensorSpec("CODES", "INT64", (-1, -1)), TensorSpec("ERROR", "STRING", (1,))),
                        transfer="omni_backend.models.qwen3_omni.answer_handoff.AnswerHandoff",
                        triton_class="omni_backend.models.qwen3_omni.talker_stage.TalkerStage"),
            StageConfig(stage_id=2, model_stage="code2wav", kind="batched", input_sources=(1,), final_output=True,
                        inputs=(TensorSpec("CODES", "INT64", (-1, -1)), TensorSpec("LEFT_CONTEXT", "INT32", (1,)),
                                TensorSpec("RIGHT_CONTEXT", "INT32", (1,))),
                        outputs=(TensorSpec("AUDIO", "FP32", (-1,)),),
                        transfer="omni_backend.models.qwen3_omni.codec_windows.ReferenceChunkWindows",
                        triton_class="omni_backend.models.qwen3_omni.code2wav_stage.Code2WavStage"),
        ),
    )


PIPELINES = (
    _qwen3_omni("qwen3_omni", "Qwen3-Omni (thinker -> talker -> code2wav): chat in (text, audio, images), "
                              "text and speech out; needs --model PATH", None),
    _qwen3_omni("qwen3_omni_tiny_random", "Qwen3-Omni tiny RANDOM weights (writes and speaks nonsense): the "
                                          "three-stage path out of the box", "builtin:qwen3_omni_tiny_random"),
)
