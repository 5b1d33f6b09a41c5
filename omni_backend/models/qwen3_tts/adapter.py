"""Request fields of Qwen3-TTS (CustomVoice, VoiceDesign and Base (voice clone) checkpoints).

Base checkpoints clone the voice of ``ref_audio`` (a data URL or base64 of a wav / flac / mp3
file, 1..30 s, at most 10 MiB): in-context with its transcript ``ref_text`` (the default), or from
the speaker embedding alone with ``x_vector_only_mode``. The entry decodes the audio once to
check it; the talker stage encodes it (once per recording and mode, then from its cache).

Validation runs the real prompt builder (config + tokenizer, no weights), so an unknown speaker
or language, instructions on a checkpoint that takes none, or a VoiceDesign request without
instructions is rejected by the entry model before any stage is touched.

``streaming_input``: the text arrives in pieces while the request runs (the first piece is TEXT,
the rest come as ``CONTROL=append``, omni_backend/triton/text_input.py); it is read in
streaming-text mode (``non_streaming_mode`` false) and cannot be an in-context voice clone.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from omni_backend.adapters.base import MAX_PARAMS_BYTES, Param, TTSAdapter
from omni_backend.errors import InvalidRequest

if TYPE_CHECKING:
    from omni_backend.deploy import DeployConfig

TASK_TYPES = {"customvoice": "custom_voice", "voicedesign": "voice_design", "base": "base"}
TASK_NAMES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
DEFAULT_SPEAKER = "vivian"
SPEECH_TOKENIZER = "qwen3_tts_tokenizer_12hz"
REF_AUDIO_MAX_BYTES = 10 * 1024 * 1024
REF_AUDIO_MAX_CHARS = REF_AUDIO_MAX_BYTES * 4 // 3 + 256   # base64 of 10 MiB plus a data-URL header


def _check_speech_tokenizer(path: str) -> None:
    """The codec decoder is the 12 Hz tokenizer's (the reference also has a 25 Hz one): another is
    refused when the repository is built, not when the server loads it."""
    config = os.path.join(path, "speech_tokenizer", "config.json")
    if not os.path.exists(config):
        raise ValueError(f"{path}: no speech_tokenizer/config.json (a Qwen3-TTS checkpoint carries its codec there)")
    with open(config, encoding="utf-8") as f:
        kind = json.load(f).get("model_type")
    if kind != SPEECH_TOKENIZER:
        raise ValueError(f"{config}: model_type is {kind!r}; this pipeline decodes the codes of "
                         f"{SPEECH_TOKENIZER!r} (the Qwen3-TTS-12Hz checkpoints)")


class Qwen3TTSAdapter(TTSAdapter):
    max_params_bytes = REF_AUDIO_MAX_CHARS + MAX_PARAMS_BYTES   # room for ref_audio's base64
    params = (
        Param("voice", str, max_len=64, help="preset speaker (CustomVoice), case-insensitive"),
        Param("language", str, max_len=32, help="auto (default), a language the checkpoint knows, or its ISO 639-1 code"),
        Param("instructions", str, max_len=4096, help="style / voice description"),
        Param("task_type", str, max_len=16, help="CustomVoice | VoiceDesign (must match the checkpoint)"),
        Param("non_streaming_mode", bool, help="text all in the prompt (default for CustomVoice/VoiceDesign)"),
        Param("seed", int, lo=0, hi=2**63 - 1, help="sampling seed; unset = random"),
        Param("max_new_tokens", int, lo=1, hi=8192, help="frame limit (12.5 frames per second)"),
        Param("ignore_eos", bool, help="generate up to max_new_tokens, eos never ends it (benchmarks)"),
        Param("do_sample", bool),
        Param("temperature", float, lo=0.0, hi=5.0, help="0 = greedy"),
        Param("top_k", int, lo=0, hi=3072),
        Param("top_p", float, lo=1e-3, hi=1.0),
        Param("repetition_penalty", float, lo=1.0, hi=5.0),
        Param("subtalker_do_sample", bool),
        Param("subtalker_temperature", float, lo=1e-3, hi=5.0),
        Param("subtalker_top_k", int, lo=0, hi=2048),
        Param("subtalker_top_p", float, lo=1e-3, hi=1.0),
        Param("initial_chunk_frames", int, lo=0, hi=64, help="frames in the first audio chunk (0: a regular chunk)"),
        Param("chunk_frames", int, lo=1, hi=300, help="frames per later chunk"),
        Param("left_context_frames", int, lo=0, hi=300, help="codec context frames per window"),
        Param("ref_audio", str, max_len=REF_AUDIO_MAX_CHARS,
              help="Base: voice to clone, data URL or base64 of wav/flac/mp3 (1-30 s, <= 10 MiB)"),
        Param("ref_text", str, max_len=4096, help="Base: transcript of ref_audio (required unless x_vector_only_mode)"),
        Param("x_vector_only_mode", bool, help="Base: clone from the speaker embedding only (no ref_text)"),
        Param("speaker_embedding", list, max_len=4096,
              help="Base: a speaker embedding (x-vector) computed before, instead of ref_audio (x-vector-only mode)"),
        Param("streaming_input", bool, help="the text arrives in pieces while the request runs "
                                            "(CONTROL=append with this request's id; the last with end)"),
    )

    def __init__(self, context: dict[str, Any] | None = None):
        super().__init__(context)
        self.builder = self.context.get("prompt_builder")

    @classmethod
    def from_model(cls, model_path: str | None, deploy: "DeployConfig | None" = None) -> "Qwen3TTSAdapter":
        from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
        from omni_backend.models.qwen3_tts.config import load_config
        from omni_backend.models.qwen3_tts.prompt import PromptBuilder
        from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer

        if not model_path:
            raise ValueError("qwen3_tts needs a checkpoint folder (--model PATH)")
        path = resolve_checkpoint(model_path)
        _check_speech_tokenizer(path)
        builder = PromptBuilder(load_config(path), QwenTextTokenizer(path))
        return cls({"prompt_builder": builder, "model_path": path})

    @property
    def checkpoint_kind(self) -> str:
        """custom_voice, voice_design or base (config.json's tts_model_type)."""
        return self.builder.config.tts_model_type

    def describe(self) -> dict[str, Any]:
        """Preset speakers from config.json; only Base checkpoints clone voices (their clone
        fields are left out for the others), and only checkpoints that follow instructions list
        `instructions`."""
        clones = self.checkpoint_kind == "base"
        left_out = set() if clones else {"ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding"}
        if clones or self.builder.config.ignores_instructions:
            # the reference drops them there (0.6B CustomVoice) or takes none (Base): a client of
            # the speech API gets them named as ignored; PARAMS that carry them are refused
            left_out.add("instructions")
        return {"params": [p.to_dict() for p in self.params if p.name not in left_out],
                "voices": list(self.builder.speakers), "clones_voices": clones,
                "default_voice": None if clones else self.default_speaker()}

    def default_speaker(self) -> str | None:
        """The speaker of a request that names none (CustomVoice: the reference's default)."""
        if self.checkpoint_kind != "custom_voice":
            return None
        speakers = self.builder.speakers
        return DEFAULT_SPEAKER if DEFAULT_SPEAKER in speakers else (speakers[0] if speakers else None)

    def check(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        kind = self.checkpoint_kind
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
            params["voice"] = self.default_speaker()
        if params.get("voice"):
            params["voice"] = params["voice"].strip().lower()
        if params.get("language"):
            params["language"] = params["language"].strip().lower()
        if params.get("instructions") is not None and not params["instructions"].strip():
            params["instructions"] = None
        if params.get("instructions") and self.builder.config.ignores_instructions:
            raise InvalidRequest("instructions", "this checkpoint (0.6B CustomVoice) takes no instructions")
        clone = self._check_voice_clone(kind, params)
        streamed = None
        if params.get("streaming_input"):
            if params.get("non_streaming_mode"):
                raise InvalidRequest("non_streaming_mode", "streaming_input reads the text as it arrives "
                                                           "(streaming-text mode); non_streaming_mode must be false")
            params["non_streaming_mode"] = False
            streamed = tuple(self.builder.tokenizer.encode(f"assistant\n{text}"))   # stands in for the final ids
        # Builds the real prompt: raises InvalidRequest naming voice / language / instructions.
        self.builder.build(text, speaker=params.get("voice"), language=params.get("language"),
                           instruct=params.get("instructions"),
                           non_streaming_mode=params.get("non_streaming_mode"), voice_clone=clone,
                           streamed_ids=streamed)
        return params

    def _check_voice_clone(self, kind: str, params: dict[str, Any]):
        """Base: the reference audio decodes, is 1..30 s and <= 10 MiB, and ICL mode has a
        transcript. Returns a stand-in clone prompt (zeros of the right shapes) for the builder."""
        fields = ("ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding")
        if kind != "base":
            for name in fields:
                if params.get(name) is not None:
                    raise InvalidRequest(name, f"voice cloning needs a Base checkpoint; this one serves "
                                               f"{TASK_NAMES[kind]}")
            return None
        import torch

        from omni_backend.models.qwen3_tts.prompt import VoiceClonePrompt
        from omni_backend.reference_audio import ReferenceAudioLimits, decode_reference_audio

        hidden = self.builder.config.talker.hidden_size
        embedding = params.get("speaker_embedding")
        if embedding is not None:   # vLLM-Omni's: the x-vector itself, so x-vector-only mode
            for name in ("ref_audio", "ref_text"):
                if params.get(name) is not None:
                    raise InvalidRequest(name, "not with speaker_embedding (the voice is the embedding)")
            if params.get("x_vector_only_mode") is False:
                raise InvalidRequest("x_vector_only_mode", "speaker_embedding clones in x-vector-only mode")
            if len(embedding) != hidden:
                raise InvalidRequest("speaker_embedding", f"has {len(embedding)} numbers; this checkpoint's "
                                                          f"speaker embedding has {hidden}")
            params["x_vector_only_mode"] = True
            return VoiceClonePrompt(speaker_embedding=torch.tensor(embedding, dtype=torch.float32), ref_codes=None,
                                    x_vector_only=True, ref_text=None)
        if params.get("ref_audio") is None:
            raise InvalidRequest("ref_audio", "required by the Base (voice clone) checkpoint: a data URL or "
                                              "base64 of a wav / flac / mp3 recording (or a speaker_embedding)")
        x_vector_only = bool(params.get("x_vector_only_mode"))
        if params.get("ref_text") is not None and not params["ref_text"].strip():
            params["ref_text"] = None
        if not x_vector_only and not params.get("ref_text"):
            raise InvalidRequest("ref_text", "required for in-context voice cloning (the transcript of "
                                             "ref_audio), unless x_vector_only_mode is true")
        audio, rate = decode_reference_audio(params["ref_audio"], "ref_audio",
                                             ReferenceAudioLimits(max_bytes=REF_AUDIO_MAX_BYTES))
        frames = max(1, -(-int(round(audio.shape[0] * 24000 / rate)) // 1920))
        return VoiceClonePrompt(speaker_embedding=torch.zeros(hidden),
                                ref_codes=None if x_vector_only else torch.zeros(frames, 16, dtype=torch.long),
                                x_vector_only=x_vector_only, ref_text=params.get("ref_text"))
