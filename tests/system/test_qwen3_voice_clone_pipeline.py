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

import numpy as np
import pytest

from client.triton_stream import TritonStreamError, synthesize
from omni_backend.models.qwen3_tts.adapter import REF_AUDIO_MAX_CHARS
from tests.metrics_scrape import metric
from tests.qwen3_voice_clone_reference import GREEDY, VOICE_TEXTS, CloneReference, hibari_voices, wav_data_url
from tests.system.concurrent_requests import at_once

pytestmark = pytest.mark.system
PIPELINE = "qwen3_tts_tiny_random_base"


@pytest.fixture(scope="module")
def voices():
    return hibari_voices()


@pytest.fixture(scope="module")
def reference(triton):
    """In-process engine, voice encoder and decoder on the same built-in checkpoint."""
    from omni_backend.deploy import default_deploy_path

    return CloneReference(PIPELINE, default_deploy_path(PIPELINE))


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
    together = at_once([lambda i=i: synthesize(triton.grpc_url, PIPELINE, texts[i], params[i]).audio
                        for i in range(4)])
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
