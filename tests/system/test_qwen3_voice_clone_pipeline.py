"""Voice cloning served by a real tritonserver: the `qwen3_tts_tiny_random_base` pipeline (tiny
random Base checkpoint) with hibari speech as the reference recordings.

- served audio of an in-context clone equals the in-process engine + windowed decoder (the
  reference codes as codec left context, their audio cut), and the reference's non-streaming
  decode of ref + new codes after its cut to 1e-4;
- four concurrent clone requests with four different voices each equal their solo output;
- a voice used again is not re-encoded (``omni_voice_encodings_total``);
- bad reference audio is rejected naming the field.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile as sf
import torch

from client.triton_stream import TritonStreamError, synthesize
from omni_backend.models.qwen3_tts.adapter import REF_AUDIO_MAX_CHARS
from tests.metrics_scrape import metric

pytestmark = pytest.mark.system
PIPELINE = "qwen3_tts_tiny_random_base"
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


@pytest.fixture(scope="module")
def voices():
    from hibari import Hibari

    voice = Hibari()
    return [voice(text, seed=i) for i, text in enumerate(VOICE_TEXTS)]


@pytest.fixture(scope="module")
def reference(triton):
    """In-process engine, voice encoder and decoder on the same built-in checkpoint."""
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from omni_backend.deploy import default_deploy_path, load_deploy
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav
    from omni_backend.models.qwen3_tts.runner import create_engine
    from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request
    from omni_backend.models.qwen3_tts.voice_clone import VoiceEncoder
    from omni_backend.reference_audio import decode_reference_audio

    path = resolve_checkpoint(f"builtin:{PIPELINE}")
    deploy = load_deploy(default_deploy_path(PIPELINE))
    torch.set_num_threads(1)
    engine = create_engine(path, max_num_seqs=8)
    checkpoint = engine.runner.checkpoint
    encoder = VoiceEncoder.from_checkpoint(path, dict(checkpoint.config.speaker_encoder))
    defaults = dataclasses.replace(engine.default_params, **deploy.stage(0).default_sampling_params)
    adapter = Qwen3TTSAdapter.from_model(path)
    builder = checkpoint.prompt_builder()
    decoder = Code2Wav.from_checkpoint(f"{path}/speech_tokenizer")
    decoder.batch_invariant = True

    class Reference:
        def run(self, text, params):
            req = adapter.validate(text, {**GREEDY, **params})
            audio, rate = decode_reference_audio(req["ref_audio"])
            clone = encoder.encode(audio, rate, req.get("ref_text"), bool(req.get("x_vector_only_mode")))
            prompt = builder.build(req["text"], language=req["language"], voice_clone=clone)
            sp = sampling_params_from_request(defaults, req)   # as the talker stage maps its REQUEST
            rid = uuid.uuid4().hex
            codes = np.asarray(engine.generate([(rid, prompt, sp)])[rid], dtype=np.int64)
            context = None if clone.x_vector_only else clone.ref_codes.numpy()
            return codes, context

        def windowed_audio(self, codes, context):
            a = deploy.async_chunk
            schedule = a.chunk_schedule()
            offset = 0 if context is None else context.shape[0]
            full = codes if context is None else np.concatenate([context, codes])
            pieces, emitted = [], 0
            while (window := schedule.next_window(emitted, len(codes), True)) is not None:
                left = min(a.left_context_frames, offset + emitted)
                window_codes = torch.from_numpy(full[offset + emitted - left: offset + window.end_frame].T[None].copy())
                pieces.append(decoder.decode_window(window_codes, left)[0])
                emitted = window.end_frame
            return torch.cat(pieces).numpy()

        def full_decode_cut(self, codes, context):
            from omni_backend.models.qwen3_tts.prompt import reference_cut_samples

            full = np.concatenate([context, codes])
            audio = decoder.decode(torch.from_numpy(full.T[None].copy()))[0].numpy()
            return audio[reference_cut_samples(len(context), len(codes), audio.size):]

    return Reference()


def _clone(voices, i, **extra):
    return {**GREEDY, "ref_audio": wav_data_url(voices[i]), "ref_text": VOICE_TEXTS[i], "language": "english",
            "max_new_tokens": 20, **extra}


def test_served_clone_equals_in_process(triton, reference, voices):
    params = _clone(voices, 0)
    codes, context = reference.run("Cloned speech, served.", params)
    assert context is not None and len(codes) == 19
    res = synthesize(triton.grpc_url, PIPELINE, "Cloned speech, served.", params)
    assert res.sample_rate == 24000 and res.audio.size == len(codes) * 1920
    np.testing.assert_array_equal(res.audio, reference.windowed_audio(codes, context))
    cut = reference.full_decode_cut(codes, context)
    shift = cut.size - res.audio.size   # the reference's proportional cut may keep one more sample
    assert shift in (0, 1)
    assert np.abs(cut[shift:] - res.audio).max() <= 1e-4

    xparams = {**GREEDY, "ref_audio": params["ref_audio"], "x_vector_only_mode": True, "max_new_tokens": 12}
    codes, context = reference.run("Only the x-vector.", xparams)
    assert context is None
    res = synthesize(triton.grpc_url, PIPELINE, "Only the x-vector.", xparams)
    np.testing.assert_array_equal(res.audio, reference.windowed_audio(codes, None))


def test_a_voice_is_encoded_once(triton, voices):
    params = _clone(voices, 1, max_new_tokens=6)
    before = metric(triton.metrics_url, "omni_voice_encodings_total", model=f"{PIPELINE}__talker")
    first = synthesize(triton.grpc_url, PIPELINE, "First use.", params).audio
    after_first = metric(triton.metrics_url, "omni_voice_encodings_total", model=f"{PIPELINE}__talker")
    for text in ("Second use.", "Third use, a different text."):
        synthesize(triton.grpc_url, PIPELINE, text, params)
    again = synthesize(triton.grpc_url, PIPELINE, "First use.", params).audio
    after = metric(triton.metrics_url, "omni_voice_encodings_total", model=f"{PIPELINE}__talker")
    assert after_first == before + 1 and after == after_first
    np.testing.assert_array_equal(first, again)


def test_four_concurrent_voices_equal_their_solo_output(triton, voices):
    texts = ["One voice speaks.", "A second voice speaks.", "The third voice talks.", "And a fourth one."]
    params = [_clone(voices, i, max_new_tokens=16 + 2 * i) for i in range(4)]
    solo = [synthesize(triton.grpc_url, PIPELINE, t, p).audio for t, p in zip(texts, params)]
    assert all(not np.array_equal(solo[0][:1920 * 4], s[:1920 * 4]) for s in solo[1:])
    barrier = threading.Barrier(4)

    def run(i):
        barrier.wait()
        return synthesize(triton.grpc_url, PIPELINE, texts[i], params[i]).audio

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(run, range(4)))
    for i in range(4):
        np.testing.assert_array_equal(together[i], solo[i], err_msg=f"voice {i}")


def _bad_inputs(voices):
    noise = np.random.default_rng(0).standard_normal(24000 * 31).astype(np.float32) * 0.1
    return [
        ({"ref_audio": "data:audio/wav;base64," + base64.b64encode(b"not audio at all" * 40).decode(),
          "ref_text": "x"}, "ref_audio"),
        ({"ref_audio": "%%% not base64 %%%", "ref_text": "x"}, "ref_audio"),
        ({"ref_audio": wav_data_url(voices[0][:12000]), "ref_text": "x"}, "ref_audio"),      # 0.5 s
        ({"ref_audio": wav_data_url(noise), "ref_text": "x"}, "ref_audio"),                  # 31 s
        ({"ref_audio": "A" * (REF_AUDIO_MAX_CHARS + 4), "ref_text": "x"}, "ref_audio"),      # > 10 MiB
        ({"ref_audio": "A" * (15 * 1024 * 1024), "ref_text": "x"}, "params"),                # whole object too big
        ({"ref_audio": wav_data_url(voices[0])}, "ref_text"),                               # ICL without ref_text
        ({"ref_text": "x"}, "ref_audio"),                                                   # no audio at all
        ({"ref_audio": wav_data_url(voices[0]), "ref_text": "x", "voice": "ryan"}, "voice"),
    ]


def test_bad_reference_audio_is_named(triton, voices):
    for params, field in _bad_inputs(voices):
        with pytest.raises(TritonStreamError) as e:
            synthesize(triton.grpc_url, PIPELINE, "Hello.", {**GREEDY, **params})
        assert str(e.value).startswith(f"invalid_request: {field}:"), (field, str(e.value)[:200])
    with pytest.raises(TritonStreamError) as e:  # other checkpoints take no reference audio
        synthesize(triton.grpc_url, "qwen3_tts_tiny_random", "Hello.", {"ref_audio": wav_data_url(voices[0])})
    assert str(e.value).startswith("invalid_request: ref_audio:")
    # a flac at 16 kHz is resampled and served
    audio16 = voices[0][::3][: 16000 * 3]
    res = synthesize(triton.grpc_url, PIPELINE, "Resampled.", {**GREEDY, "max_new_tokens": 4,
                                                               "ref_audio": wav_data_url(audio16, 16000, "FLAC"),
                                                               "ref_text": VOICE_TEXTS[0]})
    assert res.audio.size == 3 * 1920
