"""The shim's voice registry (no server): storage that survives a reload, the checks of an upload,
and what a request naming a registered voice sends to a pipeline that clones voices."""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import soundfile as sf

from client.speech_api.catalog import FieldSpec, PipelineInfo
from client.speech_api.errors import ApiError
from client.speech_api.request import build_triton_params, parse_speech_body
from client.speech_api.voices import VoiceRegistry


def wav(seconds: float, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


CLONING = PipelineInfo(name="clone", fields={n: FieldSpec(name=n) for n in
                                             ("voice", "ref_audio", "ref_text", "x_vector_only_mode", "language")})


def test_registry_persists_and_deletes(tmp_path):
    registry = VoiceRegistry(tmp_path)
    voice = registry.add("Alice", wav(2.0), "Hello there.", "true")
    assert voice.name == "alice" and voice.duration_s == 2.0 and voice.format == "wav"
    registry.add("bob", wav(1.5, 16000), None, "yes")
    reloaded = VoiceRegistry(tmp_path)
    assert [v.name for v in reloaded.list()] == ["alice", "bob"]
    assert reloaded.get("ALICE").ref_text == "Hello there."
    url = reloaded.data_url(reloaded.get("alice"))
    assert url.startswith("data:audio/wav;base64,") and base64.b64decode(url.split(",", 1)[1]) == wav(2.0)
    assert reloaded.remove("bob") and not reloaded.remove("bob")
    assert [v.name for v in VoiceRegistry(tmp_path).list()] == ["alice"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("name,audio,consent,field", [
    ("a", b"not audio", "true", "audio"), ("a", wav(0.5), "true", "audio"), ("a", wav(31), "true", "audio"),
    ("a", wav(2), None, "consent"), ("a", wav(2), "denied", "consent"), ("a", wav(2), " ", "consent"), ("no spaces", wav(2), "true", "name"),
    ("nova", wav(2), "true", "name"), ("", wav(2), "true", "name"),
])
def test_bad_uploads(tmp_path, name, audio, consent, field):
    with pytest.raises(ApiError) as e:
        VoiceRegistry(tmp_path).add(name, audio, "text", consent)
    assert e.value.status == 400 and e.value.param == field


def test_duplicate_name(tmp_path):
    registry = VoiceRegistry(tmp_path)
    registry.add("same", wav(2), None, "true")
    with pytest.raises(ApiError) as e:
        registry.add("SAME", wav(2), None, "true")
    assert e.value.param == "name"


def test_request_naming_a_registered_voice(tmp_path):
    registry = VoiceRegistry(tmp_path)
    registry.add("alice", wav(2), "Hello there.", "true")
    registry.add("bob", wav(2), None, "true")
    body = {"model": "clone", "input": "Hi.", "voice": "Alice"}
    params = build_triton_params(parse_speech_body(body), CLONING, registry).params
    assert params["ref_audio"] == registry.data_url(registry.get("alice")) and params["ref_text"] == "Hello there."
    assert "voice" not in params
    params = build_triton_params(parse_speech_body({**body, "voice": "bob"}), CLONING, registry).params
    assert params["x_vector_only_mode"] is True and "ref_text" not in params
    own = build_triton_params(parse_speech_body({**body, "voice": "alloy", "ref_audio": "data:audio/wav;base64,AAAA",
                                                 "ref_text": "x"}), CLONING, registry).params
    assert own["ref_audio"] == "data:audio/wav;base64,AAAA"
    with pytest.raises(ApiError) as e:
        build_triton_params(parse_speech_body({**body, "voice": "carol"}), CLONING, registry)
    assert e.value.param == "voice" and "alice, bob" in e.value.message


def test_mp3_upload_and_decode(tmp_path):
    import lameenc   # a pinned dependency of the project: never skipped
    t = np.arange(48000) / 24000
    pcm = (0.1 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16).tobytes()
    encoder = lameenc.Encoder()
    encoder.set_bit_rate(64)
    encoder.set_in_sample_rate(24000)
    encoder.set_channels(1)
    mp3 = bytes(encoder.encode(pcm) + encoder.flush())
    voice = VoiceRegistry(tmp_path).add("mp3-voice", mp3, None, "true")
    assert voice.format == "mp3" and 1.9 < voice.duration_s < 2.2
    from omni_backend.reference_audio import decode_reference_audio

    audio, rate = decode_reference_audio(VoiceRegistry(tmp_path).data_url(voice))
    assert rate == 24000 and 1.9 < audio.size / rate < 2.2


def test_a_cloning_pipeline_without_preset_voices_refuses_an_unknown_voice(tmp_path):
    """A model that only clones (no voice field, as VoxCPM2) must not take an unknown name silently:
    it is a registered voice, one of OpenAI's stock names (the model's own default), or a 400."""
    registry = VoiceRegistry(tmp_path)
    registry.add("alice", wav(2), "Hello there.", "true")
    only_clones = PipelineInfo(name="clone_only", fields={n: FieldSpec(name=n) for n in ("ref_audio", "ref_text")})
    body = {"model": "clone_only", "input": "Hi."}
    with pytest.raises(ApiError) as e:
        build_triton_params(parse_speech_body({**body, "voice": "nonexistent"}), only_clones, registry)
    assert e.value.status == 400 and e.value.param == "voice" and "alice" in e.value.message
    assert build_triton_params(parse_speech_body({**body, "voice": "alloy"}), only_clones, registry).params == {}
    params = build_triton_params(parse_speech_body({**body, "voice": "alice"}), only_clones, registry).params
    assert params["ref_text"] == "Hello there." and "voice" not in params


def test_a_speaker_embedding_voice(tmp_path):
    """vLLM-Omni's embedding upload: stored, listed (its dimension, no recording), kept over a
    reload, sent as `speaker_embedding` to a pipeline that takes one; a pipeline that clones
    from recordings only refuses it naming `voice`; bad embeddings name the field."""
    registry = VoiceRegistry(tmp_path)
    voice = registry.add_embedding("narrator", "[0.5, -1, 2.25]", "consent-record-7")
    assert voice.is_embedding and voice.embedding_dim == 3 and voice.public()["embedding_dim"] == 3
    assert voice.uploaded()["embedding_source"] == "direct" and voice.uploaded()["mime_type"] == "application/json"
    reloaded = VoiceRegistry(tmp_path)
    assert reloaded.embedding(reloaded.get("narrator")) == [0.5, -1.0, 2.25]
    takes = PipelineInfo(name="base", fields={n: FieldSpec(name=n) for n in ("voice", "ref_audio", "ref_text",
                                                                           "speaker_embedding")})
    body = {"model": "base", "input": "Hi.", "voice": "Narrator"}
    assert build_triton_params(parse_speech_body(body), takes, reloaded).params == {"speaker_embedding": [0.5, -1.0, 2.25]}
    with pytest.raises(ApiError) as e:
        build_triton_params(parse_speech_body({**body, "model": "clone"}), CLONING, reloaded)
    assert e.value.param == "voice" and "speaker embedding" in e.value.message
    for bad in ("not json [", "[]", '[1, "x"]', "[1, NaN]", "[true]", '{"a": 1}', json.dumps([0.1] * 4097)):
        with pytest.raises(ApiError) as e:
            registry.add_embedding("other", bad, "true")
        assert e.value.param == "speaker_embedding", bad
