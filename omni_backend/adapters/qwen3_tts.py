"""Request fields of Qwen3-TTS (CustomVoice and VoiceDesign checkpoints).

Validation runs the real prompt builder (config + tokenizer, no weights), so an unknown speaker
or language, instructions on a checkpoint that takes none, or a VoiceDesign request without
instructions is rejected by the entry model before any stage is touched.
"""
from __future__ import annotations

from typing import Any

from omni_backend.adapters.base import Param, TTSAdapter, register_adapter
from omni_backend.errors import InvalidRequest

TASK_TYPES = {"customvoice": "custom_voice", "voicedesign": "voice_design", "base": "base"}
TASK_NAMES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
DEFAULT_SPEAKER = "vivian"


@register_adapter
class Qwen3TTSAdapter(TTSAdapter):
    name = "qwen3_tts"
    params = (
        Param("voice", str, max_len=64, help="preset speaker (CustomVoice), case-insensitive"),
        Param("language", str, max_len=32, help="auto (default) or a language the checkpoint knows"),
        Param("instructions", str, max_len=4096, help="style / voice description"),
        Param("task_type", str, max_len=16, help="CustomVoice | VoiceDesign (must match the checkpoint)"),
        Param("non_streaming_mode", bool, help="text all in the prompt (default for CustomVoice/VoiceDesign)"),
        Param("seed", int, lo=0, hi=2**63 - 1, help="sampling seed; unset = random"),
        Param("max_new_tokens", int, lo=1, hi=8192, help="frame limit (12.5 frames per second)"),
        Param("do_sample", bool),
        Param("temperature", float, lo=1e-3, hi=5.0),
        Param("top_k", int, lo=0, hi=3072),
        Param("top_p", float, lo=1e-3, hi=1.0),
        Param("repetition_penalty", float, lo=1.0, hi=5.0),
        Param("subtalker_do_sample", bool),
        Param("subtalker_temperature", float, lo=1e-3, hi=5.0),
        Param("subtalker_top_k", int, lo=0, hi=2048),
        Param("subtalker_top_p", float, lo=1e-3, hi=1.0),
        Param("initial_chunk_frames", int, lo=1, hi=64, help="frames in the first audio chunk"),
        Param("chunk_frames", int, lo=1, hi=300, help="frames per later chunk"),
        Param("left_context_frames", int, lo=0, hi=300, help="codec context frames per window"),
    )

    def __init__(self, context: dict[str, Any] | None = None):
        super().__init__(context)
        self.builder = self.context.get("prompt_builder")

    @classmethod
    def from_model(cls, model_path: str | None) -> "Qwen3TTSAdapter":
        from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
        from omni_backend.models.qwen3_tts.config import load_config
        from omni_backend.models.qwen3_tts.prompt import PromptBuilder
        from omni_backend.models.qwen3_tts.tokenizer import QwenTextTokenizer

        if not model_path:
            raise ValueError("qwen3_tts needs a checkpoint folder (--model PATH)")
        path = resolve_checkpoint(model_path)
        builder = PromptBuilder(load_config(path), QwenTextTokenizer(path))
        return cls({"prompt_builder": builder, "model_path": path})

    @property
    def model_type(self) -> str:
        return self.builder.config.tts_model_type

    def check(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        kind = self.model_type
        task = params.get("task_type")
        if task is not None:
            canonical = TASK_TYPES.get(task.replace("_", "").replace("-", "").lower())
            if canonical is None:
                raise InvalidRequest("task_type", f"unknown task type {task!r}; use CustomVoice, VoiceDesign or Base")
            if canonical != kind:
                raise InvalidRequest("task_type", f"{task} needs a {canonical} checkpoint; this one serves "
                                                  f"{TASK_NAMES[kind]}")
        params["task_type"] = TASK_NAMES[kind]
        if kind == "custom_voice" and not params.get("voice"):
            speakers = self.builder.speakers
            params["voice"] = DEFAULT_SPEAKER if DEFAULT_SPEAKER in speakers else speakers[0]
        if params.get("voice"):
            params["voice"] = params["voice"].strip().lower()
        if params.get("language"):
            params["language"] = params["language"].strip().lower()
        if params.get("instructions") is not None and not params["instructions"].strip():
            params["instructions"] = None
        if params.get("instructions") and self.builder.config.ignores_instructions:
            raise InvalidRequest("instructions", "this checkpoint (0.6B CustomVoice) takes no instructions")
        # Builds the real prompt: raises InvalidRequest naming voice / language / instructions.
        self.builder.build(text, speaker=params.get("voice"), language=params.get("language"),
                           instruct=params.get("instructions"),
                           non_streaming_mode=params.get("non_streaming_mode"))
        return params
