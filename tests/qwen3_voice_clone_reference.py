"""What the Qwen3-TTS voice-clone system tests share: reference recordings (hibari speech, as data
URLs) and the in-process reference of a clone request on a Base pipeline's built-in checkpoint
(engine, voice encoder and windowed decoder, as the served pipeline runs them)."""
from __future__ import annotations

import base64
import dataclasses
import io
import uuid
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

GREEDY = {"do_sample": False, "subtalker_do_sample": False}
VOICE_TEXTS = [
    "Hello there, this is a short reference recording of my voice.",
    "Good morning, everyone. I hope the trains run on time today.",
    "The weather is lovely, so we will walk to the park after lunch.",
    "Please leave a message after the tone, and I will call you back.",
]


def wav_data_url(audio: np.ndarray, rate: int = 24000, fmt: str = "WAV") -> str:
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format=fmt)
    mime = {"WAV": "audio/wav", "FLAC": "audio/flac"}[fmt]
    return f"data:{mime};base64," + base64.b64encode(buffer.getvalue()).decode()


def hibari_voices() -> list[np.ndarray]:
    """One recording of each of VOICE_TEXTS, each with its own seed (so four different voices)."""
    from hibari import Hibari

    voice = Hibari()
    return [voice(text, seed=i) for i, text in enumerate(VOICE_TEXTS)]


class CloneReference:
    """In-process engine, voice encoder and decoder on a Base pipeline's built-in checkpoint, with
    the sampling defaults and chunk schedule of `deploy_path` (one torch thread, as the deploys)."""

    def __init__(self, pipeline: str, deploy_path: str | Path):
        from omni_backend.deploy import load_deploy
        from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
        from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
        from omni_backend.models.qwen3_tts.code2wav import Code2Wav
        from omni_backend.models.qwen3_tts.runner import create_engine
        from omni_backend.models.qwen3_tts.voice_clone import VoiceEncoder

        path = resolve_checkpoint(f"builtin:{pipeline}")
        self.deploy = load_deploy(deploy_path)
        torch.set_num_threads(1)
        self.engine = create_engine(path, max_num_seqs=8)
        checkpoint = self.engine.runner.checkpoint
        self.encoder = VoiceEncoder.from_checkpoint(path, dict(checkpoint.config.speaker_encoder))
        self.defaults = dataclasses.replace(self.engine.default_params, **self.deploy.stage(0).default_sampling_params)
        self.adapter = Qwen3TTSAdapter.from_model(path)
        self.builder = checkpoint.prompt_builder()
        self.decoder = Code2Wav.from_checkpoint(f"{path}/speech_tokenizer")
        self.decoder.batch_invariant = True

    def run(self, text: str, params: dict) -> tuple[np.ndarray, np.ndarray | None]:
        """Greedy codes [frames, 16] of a clone request, and its reference codes (None: x-vector only)."""
        from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request
        from omni_backend.reference_audio import decode_reference_audio

        req = self.adapter.validate(text, {**GREEDY, **params})
        audio, rate = decode_reference_audio(req["ref_audio"])
        clone = self.encoder.encode(audio, rate, req.get("ref_text"), bool(req.get("x_vector_only_mode")))
        prompt = self.builder.build(req["text"], language=req["language"], voice_clone=clone)
        sp = sampling_params_from_request(self.defaults, req)   # as the talker stage maps its REQUEST
        rid = uuid.uuid4().hex
        codes = np.asarray(self.engine.generate([(rid, prompt, sp)])[rid], dtype=np.int64)
        context = None if clone.x_vector_only else clone.ref_codes.numpy()
        return codes, context

    def windowed_audio(self, codes: np.ndarray, context: np.ndarray | None, params: dict | None = None) -> np.ndarray:
        """The codes decoded window by window as the deploy's schedule cuts them (with the chunk
        fields of the request's `params`), the reference codes as codec left context whose audio
        is never emitted."""
        params = params or {}
        schedule = self.deploy.async_chunk.chunk_schedule(params.get("initial_chunk_frames"), params.get("chunk_frames"),
                                                          params.get("left_context_frames"))
        offset = 0 if context is None else context.shape[0]
        full = codes if context is None else np.concatenate([context, codes])
        pieces, emitted = [], 0
        while (window := schedule.next_window(emitted, len(codes), True)) is not None:
            left = min(schedule.left_context_frames, offset + emitted)
            window_codes = torch.from_numpy(full[offset + emitted - left: offset + window.end_frame].T[None].copy())
            pieces.append(self.decoder.decode_window(window_codes, left)[0])
            emitted = window.end_frame
        return torch.cat(pieces).numpy()

    def full_decode_cut(self, codes: np.ndarray, context: np.ndarray) -> np.ndarray:
        """The reference package's way: ref + new codes decoded at once, the reference part cut off."""
        from omni_backend.models.qwen3_tts.prompt import reference_cut_samples

        full = np.concatenate([context, codes])
        audio = self.decoder.decode(torch.from_numpy(full.T[None].copy()))[0].numpy()
        return audio[reference_cut_samples(len(context), len(codes), audio.size):]
