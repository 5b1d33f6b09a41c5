"""The voice registry of the speech API, through a real shim and tritonserver, on the tiny random
Base pipeline (`qwen3_tts_tiny_random_base`) with hibari speech as the uploaded recordings:
upload (multipart), list, use by name, reuse without re-encoding, survive a shim restart,
delete; every bad upload is a 400 naming its field; four concurrent requests with four
registered voices each equal their solo output.
"""
from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import soundfile as sf

from client.speech_api.process import ShimProcess
from tests.metrics_scrape import metric
from tests.system.concurrent_requests import at_once

pytestmark = pytest.mark.system
MODEL = "qwen3_tts_tiny_random_base"
TEXTS = [
    "Hello there, this is a short reference recording of my voice.",
    "Good morning, everyone. I hope the trains run on time today.",
    "The weather is lovely, so we will walk to the park after lunch.",
    "Please leave a message after the tone, and I will call you back.",
]
GREEDY = {"max_new_tokens": 10, "seed": 0}


def audio_bytes(audio: np.ndarray, rate: int = 24000, fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format=fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def recordings():
    from hibari import Hibari

    voice = Hibari()
    return [voice(text, seed=10 + i) for i, text in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


def _start(triton, voices_dir, log) -> ShimProcess:
    server = ShimProcess([triton.grpc_url], log_path=log, extra_args=["--voices-dir", str(voices_dir)])
    server.start()
    return server


@pytest.fixture(scope="module")
def voice_shim(triton, voices_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("voice_shim") / "shim.log"
    box = {"server": _start(triton, voices_dir, log)}

    def restart():
        box["server"].stop()
        box["server"] = _start(triton, voices_dir, log)
        return box["server"]

    box["restart"] = restart
    try:
        yield box
    finally:
        box["server"].stop()


def upload(url, name, audio: bytes | None, ref_text="x", consent="true", filename="voice.wav"):
    data = {k: v for k, v in (("name", name), ("ref_text", ref_text), ("consent", consent)) if v is not None}
    files = {"audio": (filename, audio, "application/octet-stream")} if audio is not None else None
    return httpx.post(f"{url}/v1/audio/voices", data=data, files=files, timeout=60)


def speech(url, voice, text="Cloned by name.", **extra):
    r = httpx.post(f"{url}/v1/audio/speech", json={"model": MODEL, "voice": voice, "input": text,
                                                   "response_format": "pcm", **GREEDY, **extra}, timeout=120)
    assert r.status_code == 200, r.text[:300]
    return r.content


def test_register_use_restart_delete(voice_shim, triton, recordings):
    url = voice_shim["server"].url
    r = upload(url, "Alice", audio_bytes(recordings[0]), ref_text=TEXTS[0])
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "alice" and r.json()["ref_text"] == TEXTS[0]
    r = upload(url, "bob-flac", audio_bytes(recordings[1][::2], 12000, "FLAC"), ref_text=None, filename="b.flac")
    assert r.status_code == 201, r.text
    listed = httpx.get(f"{url}/v1/audio/voices", params={"model": MODEL}).json()
    assert {"alice", "bob-flac"} <= set(listed["voices"]) and listed["clones_voices"]
    assert {v["id"] for v in listed["registered"]} >= {"alice", "bob-flac"}

    label = {"model": f"{MODEL}__talker"}
    before = metric(triton.metrics_url, "omni_voice_encodings_total", **label)
    by_name = speech(url, "alice")
    assert metric(triton.metrics_url, "omni_voice_encodings_total", **label) == before + 1
    again = speech(url, {"id": "alice"})
    inline = speech(url, "alloy", ref_audio="data:audio/wav;base64," + base64.b64encode(
        audio_bytes(recordings[0])).decode(), ref_text=TEXTS[0])
    assert by_name == again == inline and len(by_name) == 9 * 1920 * 2
    assert metric(triton.metrics_url, "omni_voice_encodings_total", **label) == before + 1  # reused
    xvec = speech(url, "bob-flac")  # no transcript: the x-vector alone
    assert len(xvec) == 9 * 1920 * 2 and xvec != by_name

    server = voice_shim["restart"]()
    url = server.url
    assert {"alice", "bob-flac"} <= {v["id"] for v in httpx.get(f"{url}/v1/audio/voices").json()["registered"]}
    assert speech(url, "alice") == by_name
    assert metric(triton.metrics_url, "omni_voice_encodings_total", **label) == before + 2  # bob, alice only

    assert httpx.delete(f"{url}/v1/audio/voices/bob-flac").status_code == 200
    assert httpx.get(f"{url}/v1/audio/voices/bob-flac").status_code == 404
    assert httpx.delete(f"{url}/v1/audio/voices/bob-flac").status_code == 404
    r = httpx.post(f"{url}/v1/audio/speech", json={"model": MODEL, "voice": "bob-flac", "input": "Hi.", **GREEDY})
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice"
    server = voice_shim["restart"]()
    assert "bob-flac" not in {v["id"] for v in httpx.get(f"{server.url}/v1/audio/voices").json()["registered"]}


def test_a_preset_voice_beside_ref_audio_is_the_recordings_voice(voice_shim, recordings):
    """vLLM-Omni's speech clients send a preset speaker with every cloning request (and its
    benchmark `task_type: Base`); the recording is the voice: the same audio as with no voice, and
    the preset name is reported as ignored."""
    url = voice_shim["server"].url
    clone = {"model": MODEL, "input": "Cloned inline.", "response_format": "pcm", "task_type": "Base",
             "ref_audio": "data:audio/wav;base64," + base64.b64encode(audio_bytes(recordings[2])).decode(),
             "ref_text": TEXTS[2], **GREEDY}
    plain = httpx.post(f"{url}/v1/audio/speech", json=clone, timeout=120)
    named = httpx.post(f"{url}/v1/audio/speech", json={**clone, "voice": "vivian"}, timeout=120)
    speaker = httpx.post(f"{url}/v1/audio/speech", json={**clone, "speaker": "Vivian"}, timeout=120)
    for r in (plain, named, speaker):
        assert r.status_code == 200, r.text[:300]
    assert named.headers["x-omni-ignored-fields"] == "voice" and "x-omni-ignored-fields" not in plain.headers
    assert plain.content == named.content == speaker.content and len(plain.content) > 0


@pytest.fixture
def recording_site(recordings):
    """A local web server with one recording (audio/wav) and one page (text/html)."""
    import http.server
    import threading

    wav = audio_bytes(recordings[1])

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body, kind = {"/voice.wav": (wav, "audio/wav"), "/page": (b"<html></html>", "text/html")}.get(
                self.path, (b"", "text/plain"))
            self.send_response(200 if body else 404)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_ref_audio_as_bare_base64_or_a_fetched_url(voice_shim, triton, recordings, recording_site, tmp_path):
    """vLLM-Omni's `ref_audio` may be bare base64 or a URL: base64 clones as the data URL does; an
    http(s) URL is fetched only by a server whose operator allowed its host (else a 400 naming
    `ref_audio`), and clones the same; a page that is no audio, or a file path, is a 400."""
    url = voice_shim["server"].url
    encoded = base64.b64encode(audio_bytes(recordings[1])).decode()
    clone = {"model": MODEL, "input": "Cloned from anywhere.", "response_format": "pcm", "ref_text": TEXTS[1],
             **GREEDY}
    inline = httpx.post(f"{url}/v1/audio/speech", json={**clone, "ref_audio": "data:audio/wav;base64," + encoded},
                        timeout=120)
    bare = httpx.post(f"{url}/v1/audio/speech", json={**clone, "ref_audio": encoded}, timeout=120)
    assert inline.status_code == bare.status_code == 200, bare.text[:300]
    assert bare.content == inline.content and len(inline.content) > 0
    remote = {**clone, "ref_audio": f"{recording_site}/voice.wav"}
    refused = httpx.post(f"{url}/v1/audio/speech", json=remote, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "ref_audio"
    assert "fetches no URL" in refused.json()["error"]["message"]
    for bad in ("file:///etc/passwd", "ftp://example.com/voice.wav"):
        r = httpx.post(f"{url}/v1/audio/speech", json={**clone, "ref_audio": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio", r.text
    fetching = ShimProcess([triton.grpc_url], log_path=tmp_path / "shim.log",
                           extra_args=["--fetch-allow-host", "127.0.0.1", "--fetch-allow-private"])
    fetching.start()
    try:
        fetched = httpx.post(f"{fetching.url}/v1/audio/speech", json=remote, timeout=120)
        assert fetched.status_code == 200, fetched.text[:300]
        assert fetched.content == inline.content
        page = httpx.post(f"{fetching.url}/v1/audio/speech", json={**clone, "ref_audio": f"{recording_site}/page"},
                          timeout=60)
        assert page.status_code == 400 and page.json()["error"]["param"] == "ref_audio"
        assert "is not audio" in page.json()["error"]["message"]
    finally:
        fetching.stop()


def test_vllm_omni_upload_form_and_listing(voice_shim, recordings):
    """vLLM-Omni's upload form (`audio_sample`, a consent record id, `speaker_description`), its
    answer (`success`, `voice`) and listing (`uploaded_voices`); the voice then speaks by name."""
    url = voice_shim["server"].url
    r = httpx.post(f"{url}/v1/audio/voices", timeout=60,
                   data={"name": "narrator", "consent": "user_consent_id", "ref_text": TEXTS[3],
                         "speaker_description": "warm narrator"},
                   files={"audio_sample": ("voice_sample.wav", audio_bytes(recordings[3]), "audio/wav")})
    assert r.status_code == 201, r.text
    assert r.json()["success"] is True and r.json()["voice"]["name"] == "narrator"
    listed = httpx.get(f"{url}/v1/audio/voices", params={"model": MODEL}).json()
    entry = next(v for v in listed["uploaded_voices"] if v["name"] == "narrator")
    assert entry["consent"] == "user_consent_id" and entry["speaker_description"] == "warm narrator"
    assert entry["mime_type"] == "audio/wav" and entry["ref_text"] == TEXTS[3]
    assert speech(url, "narrator") == speech(url, "alloy", ref_text=TEXTS[3], ref_audio="data:audio/wav;base64,"
                                             + base64.b64encode(audio_bytes(recordings[3])).decode())
    assert httpx.delete(f"{url}/v1/audio/voices/narrator").status_code == 200


def test_a_speaker_embedding_clones_as_its_recording_does(voice_shim, recordings):
    """vLLM-Omni's `speaker_embedding`: the x-vector computed before (here by the checkpoint's
    own speaker encoder) speaks as the recording does in x-vector-only mode, bit for bit; its
    length must be the checkpoint's, and it goes alone (not with ref_audio)."""
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.config import load_config
    from omni_backend.models.qwen3_tts.voice_clone import VoiceEncoder

    path = resolve_checkpoint(f"builtin:{MODEL}")
    encoder = VoiceEncoder.from_checkpoint(path, dict(load_config(path).speaker_encoder))
    xvector = encoder.encode_audio(recordings[1], 24000, with_codes=False)[0].tolist()
    url = voice_shim["server"].url
    recording = "data:audio/wav;base64," + base64.b64encode(audio_bytes(recordings[1])).decode()
    by_recording = speech(url, "alloy", ref_audio=recording, x_vector_only_mode=True)
    by_embedding = speech(url, "vivian", speaker_embedding=xvector, task_type="Base")
    assert by_embedding == by_recording and len(by_embedding) == 9 * 1920 * 2
    for extra, param in (({"speaker_embedding": xvector[:-1]}, "speaker_embedding"),
                         ({"speaker_embedding": xvector, "ref_audio": recording}, "ref_audio"),
                         ({"speaker_embedding": ["x"] * len(xvector)}, "speaker_embedding"),
                         ({"speaker_embedding": 5}, "speaker_embedding")):
        r = httpx.post(f"{url}/v1/audio/speech", json={"model": MODEL, "input": "Hi.", **GREEDY, **extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (param, r.text[:300])


def test_a_voice_uploaded_as_a_speaker_embedding(voice_shim, recordings):
    """vLLM-Omni's embedding upload (`speaker_embedding`, JSON, instead of a recording): listed
    with its dimension for the models that take one, and a request naming it speaks as the same
    embedding sent inline; VoxCPM2 (recordings only) refuses it naming `voice`; with a recording,
    with NaN or as bad JSON it is a 400 naming the field."""
    import json

    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.config import load_config
    from omni_backend.models.qwen3_tts.voice_clone import VoiceEncoder

    path = resolve_checkpoint(f"builtin:{MODEL}")
    encoder = VoiceEncoder.from_checkpoint(path, dict(load_config(path).speaker_encoder))
    xvector = encoder.encode_audio(recordings[3], 24000, with_codes=False)[0].tolist()
    url = voice_shim["server"].url
    form = {"name": "embedded", "consent": "consent-record-1", "speaker_embedding": json.dumps(xvector)}
    r = httpx.post(f"{url}/v1/audio/voices", data=form, timeout=60)
    assert r.status_code == 201, r.text
    assert r.json()["voice"]["embedding_source"] == "direct" and r.json()["voice"]["embedding_dim"] == len(xvector)
    try:
        listing = httpx.get(f"{url}/v1/audio/voices", params={"model": MODEL}, timeout=30).json()
        assert "embedded" in listing["voices"] and "embedded" not in listing["models"]["voxcpm2_tiny_random"]
        assert speech(url, "embedded") == speech(url, "alloy", speaker_embedding=xvector)
        r = httpx.post(f"{url}/v1/audio/speech", timeout=60, json={"model": "voxcpm2_tiny_random", "input": "Hi.",
                                                                  "voice": "embedded"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "voice", r.text
        for data, files, param in (
                ({**form, "name": "both"}, {"audio": ("v.wav", audio_bytes(recordings[0]), "audio/wav")},
                 "speaker_embedding"),
                ({**form, "name": "nan", "speaker_embedding": json.dumps(xvector[:-1] + [float("nan")])}, None,
                 "speaker_embedding"),
                ({**form, "name": "garbled", "speaker_embedding": "[[["}, None, "speaker_embedding")):
            r = httpx.post(f"{url}/v1/audio/voices", data=data, files=files, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    finally:
        assert httpx.delete(f"{url}/v1/audio/voices/embedded", timeout=30).status_code == 200


def test_bad_uploads_are_named(voice_shim, recordings):
    url = voice_shim["server"].url
    good = audio_bytes(recordings[2])
    noise = (np.random.default_rng(1).standard_normal(24000 * 31) * 0.1).astype(np.float32)
    cases = [
        (dict(name="x1", audio=b"this is not audio" * 100), "audio"),
        (dict(name="x2", audio=audio_bytes(recordings[2][:12000])), "audio"),       # 0.5 s
        (dict(name="x3", audio=audio_bytes(noise)), "audio"),                       # 31 s
        (dict(name="x4", audio=b"\0" * (10 * 1024 * 1024 + 10)), "audio"),          # > 10 MiB
        (dict(name="x5", audio=None), "audio"),
        (dict(name="x6", audio=good, consent=None), "consent"),
        (dict(name="x7", audio=good, consent="no"), "consent"),
        (dict(name="bad name!", audio=good), "name"),
        (dict(name="alloy", audio=good), "name"),
    ]
    for kwargs, field in cases:
        r = upload(url, **kwargs)
        assert r.status_code == 400, (field, r.status_code, r.text[:200])
        assert r.json()["error"]["param"] == field, (field, r.json())
    assert upload(url, "dup", good).status_code == 201
    r = upload(url, "DUP", good)
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"
    r = httpx.post(f"{url}/v1/audio/voices", json={"name": "j"})
    assert r.status_code == 400
    # a clone request that names no registered voice and carries no audio
    r = httpx.post(f"{url}/v1/audio/speech", json={"model": MODEL, "voice": "alloy", "input": "Hi.", **GREEDY})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio"


def test_four_registered_voices_concurrently_equal_solo(voice_shim, recordings):
    url = voice_shim["server"].url
    names = [f"v{i}" for i in range(4)]
    for i, name in enumerate(names):
        assert upload(url, name, audio_bytes(recordings[i]), ref_text=TEXTS[i]).status_code == 201
    texts = ["One voice speaks.", "A second voice speaks.", "The third voice talks.", "And a fourth one."]
    solo = [speech(url, n, t) for n, t in zip(names, texts)]
    assert len(set(solo)) == 4
    together = at_once([lambda i=i: speech(url, names[i], texts[i]) for i in range(4)])
    assert together == solo
