"""Bad input straight to Triton's entry models over gRPC (tritonclient, no shim), one server.

Each case asserts the exact code and field a client sees: the entry model's own error message
(`invalid_request: <field>: ...`, sent by Triton as it is), or, for Triton's own checks of the
tensors (dtype, shape, unknown input, unknown model), the code `client.triton_stream` gives
Triton's uncoded message. After the batch the server still serves and logged no traceback.
"""
from __future__ import annotations

import base64
import io
import json
import queue
import wave

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.triton_stream import TritonStreamError, synthesize

pytestmark = pytest.mark.system

HIBARI = "hibari"
QWEN3 = "qwen3_tts_tiny_random"
QWEN3_BASE = "qwen3_tts_tiny_random_base"


def tensor(name: str, value, dtype: str = "BYTES") -> grpcclient.InferInput:
    data = value if isinstance(value, np.ndarray) else np.array([value], dtype=np.object_)
    t = grpcclient.InferInput(name, list(data.shape), dtype)
    t.set_data_from_numpy(data)
    return t


def request(text: bytes | None = b"Hello.", params: bytes | str | None = None) -> list:
    inputs = [] if text is None else [tensor("TEXT", text)]
    if params is not None:
        inputs.append(tensor("PARAMS", params.encode() if isinstance(params, str) else params))
    return inputs


def wav_data_url(seconds: float = 1.5, rate: int = 24000) -> str:
    samples = (np.sin(np.arange(int(seconds * rate)) * 0.05) * 8000).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def stream_error(url: str, model: str, inputs: list, version: str = "") -> str | None:
    """The error message of one raw stream (None when it ended without one)."""
    client = grpcclient.InferenceServerClient(url)
    results: "queue.Queue" = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, model_version=version, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                return error.message()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


# id -> (model, inputs, expected start of the coded message, True when the entry model itself
# sends that code (else Triton's own uncoded message, coded by the client)).
CASES = {
    # TEXT
    "text empty": (HIBARI, request(b""), "invalid_request: text: ", True),
    "text blank": (HIBARI, request(b"  \n\t "), "invalid_request: text: ", True),
    "text 4097 chars": (HIBARI, request(b"a" * 4097), "invalid_request: text: ", True),
    "text over 16 KiB": (HIBARI, request("é".encode() * 8193), "invalid_request: text: ", True),
    "text invalid utf-8": (HIBARI, request(b"\xff hi"), "invalid_request: text: ", True),
    "text truncated utf-8": (HIBARI, request(b"caf\xc3"), "invalid_request: text: ", True),
    "text overlong utf-8": (HIBARI, request(b"\xc0\xaf hi"), "invalid_request: text: ", True),
    "text encoded high surrogate": (HIBARI, request(b"\xed\xa0\x80 hi"), "invalid_request: text: ", True),
    "text encoded low surrogate": (HIBARI, request(b"hi \xed\xbf\xbf"), "invalid_request: text: ", True),
    "text nul": (HIBARI, request(b"hi\x00there"), "invalid_request: text: ", True),
    "text only nul": (HIBARI, request(b"\x00"), "invalid_request: text: ", True),
    "text nothing to speak": (HIBARI, request("\U0001F642".encode()), "invalid_request: text: ", True),
    "text missing": (HIBARI, request(None, b"{}"), "invalid_request: text: ", True),
    # PARAMS: not a JSON object
    "params malformed": (HIBARI, request(params="{not json"), "invalid_request: params: ", True),
    "params trailing garbage": (HIBARI, request(params='{"speed": 1} x'), "invalid_request: params: ", True),
    "params number": (HIBARI, request(params="3"), "invalid_request: params: ", True),
    "params array": (HIBARI, request(params="[1, 2]"), "invalid_request: params: ", True),
    "params string": (HIBARI, request(params='"speed"'), "invalid_request: params: ", True),
    "params null": (HIBARI, request(params="null"), "invalid_request: params: ", True),
    "params invalid utf-8": (HIBARI, request(params=b'{"voice": "\xff"}'), "invalid_request: params: ", True),
    "params encoded surrogate": (HIBARI, request(params=b'{"voice": "\xed\xa0\x80"}'),
                                 "invalid_request: params: ", True),
    "params deep array": (HIBARI, request(params=b"[" * 50_000), "invalid_request: params: ", True),
    "params deep object": (HIBARI, request(params=b'{"a":' * 12_000), "invalid_request: params: ", True),
    "params deep value": (HIBARI, request(params=b'{"speed": ' + b"[" * 50_000), "invalid_request: params: ", True),
    "params 100k brackets": (HIBARI, request(params=b"[" * 100_000), "invalid_request: params: ", True),
    "params over 64 KiB": (HIBARI, request(params=json.dumps({"voice": "x" * 70_000})),
                           "invalid_request: params: ", True),
    "params 5000-digit int": (HIBARI, request(params='{"seed": 1' + "0" * 5000 + "}"),
                              "invalid_request: params: ", True),
    "params odd key": (HIBARI, request(params='{"a b: c": 1}'), "invalid_request: params: ", True),
    "params surrogate key": (HIBARI, request(params=r'{"\udc00": 1}'), "invalid_request: params: ", True),
    # PARAMS: one bad field
    "unknown key": (HIBARI, request(params='{"pitch": 1}'), "invalid_request: pitch: ", True),
    "voice escaped surrogate": (HIBARI, request(params=r'{"voice": "\ud800"}'), "invalid_request: voice: ", True),
    "voice escaped nul": (HIBARI, request(params=r'{"voice": "he\u0000art"}'), "invalid_request: voice: ", True),
    "voice number": (HIBARI, request(params='{"voice": 3}'), "invalid_request: voice: ", True),
    "voice object": (HIBARI, request(params='{"voice": {"id": "heart"}}'), "invalid_request: voice: ", True),
    "voice unknown": (HIBARI, request(params='{"voice": "nobody"}'), "invalid_request: voice: ", True),
    "speed nested 500 deep": (HIBARI, request(params='{"speed": ' + "[" * 500 + "]" * 500 + "}"),
                              "invalid_request: speed: ", True),
    "speed NaN": (HIBARI, request(params='{"speed": NaN}'), "invalid_request: speed: ", True),
    "speed Infinity": (HIBARI, request(params='{"speed": Infinity}'), "invalid_request: speed: ", True),
    "speed 1e400": (HIBARI, request(params='{"speed": 1e400}'), "invalid_request: speed: ", True),
    "speed 400 digits": (HIBARI, request(params='{"speed": 1' + "0" * 400 + "}"), "invalid_request: speed: ", True),
    "speed too high": (HIBARI, request(params='{"speed": 2.01}'), "invalid_request: speed: ", True),
    "speed string": (HIBARI, request(params='{"speed": "fast"}'), "invalid_request: speed: ", True),
    "speed bool": (HIBARI, request(params='{"speed": true}'), "invalid_request: speed: ", True),
    "seed fraction": (HIBARI, request(params='{"seed": 1.5}'), "invalid_request: seed: ", True),
    "seed negative": (HIBARI, request(params='{"seed": -1}'), "invalid_request: seed: ", True),
    "seed 2**63": (HIBARI, request(params='{"seed": 9223372036854775808}'), "invalid_request: seed: ", True),
    "seed -Infinity": (HIBARI, request(params='{"seed": -Infinity}'), "invalid_request: seed: ", True),
    # Qwen3-TTS: the adapter and the real prompt builder
    "qwen3 voice unknown": (QWEN3, request(params='{"voice": "nobody"}'), "invalid_request: voice: ", True),
    "qwen3 language unknown": (QWEN3, request(params='{"language": "klingon"}'), "invalid_request: language: ", True),
    "qwen3 language surrogate": (QWEN3, request(params=r'{"language": "\udbff"}'),
                                 "invalid_request: language: ", True),
    "qwen3 task_type mismatch": (QWEN3, request(params='{"task_type": "VoiceDesign"}'),
                                 "invalid_request: task_type: ", True),
    "qwen3 instructions on 0.6B": (QWEN3, request(params='{"instructions": "calm"}'),
                                   "invalid_request: instructions: ", True),
    "qwen3 ref_audio on custom voice": (QWEN3, request(params=json.dumps({"ref_audio": wav_data_url()})),
                                        "invalid_request: ref_audio: ", True),
    "qwen3 max_new_tokens 0": (QWEN3, request(params='{"max_new_tokens": 0}'), "invalid_request: max_new_tokens: ",
                               True),
    "qwen3 temperature 0 with sampling": (QWEN3, request(params='{"temperature": 0, "do_sample": true}'),
                                          "invalid_request: temperature: ", True),
    "qwen3 top_p 1.5": (QWEN3, request(params='{"top_p": 1.5}'), "invalid_request: top_p: ", True),
    "qwen3 text encoded surrogate": (QWEN3, request(b"\xed\xb0\x80"), "invalid_request: text: ", True),
    "base ref_audio missing": (QWEN3_BASE, request(params="{}"), "invalid_request: ref_audio: ", True),
    "base ref_audio not base64": (QWEN3_BASE, request(params='{"ref_audio": "!!!", "ref_text": "hi"}'),
                                  "invalid_request: ref_audio: ", True),
    "base ref_text missing": (QWEN3_BASE, request(params=json.dumps({"ref_audio": wav_data_url()})),
                              "invalid_request: ref_text: ", True),
    # a stage's control messages (the entry's channel to it)
    "stage pull without a stream": ("hibari__synthesizer", [tensor("CONTROL", b"pull"), tensor("REQUEST_ID", b"nope")],
                                    "invalid_request: REQUEST_ID: ", True),
    "stage unknown command": ("hibari__synthesizer", [tensor("CONTROL", b"rewind"), tensor("REQUEST_ID", b"x")],
                              "invalid_request: CONTROL: ", True),
    # Triton's own checks, before any model code runs
    "TEXT dtype FP32": (HIBARI, [tensor("TEXT", np.array([1.0], np.float32), "FP32")], "invalid_request: text: ",
                        False),
    "PARAMS dtype INT32": (HIBARI, [tensor("TEXT", b"Hi."), tensor("PARAMS", np.array([1], np.int32), "INT32")],
                           "invalid_request: params: ", False),
    "TEXT shape [2]": (HIBARI, [tensor("TEXT", np.array([b"a", b"b"], dtype=np.object_))],
                       "invalid_request: text: ", False),
    "TEXT shape [1, 1]": (HIBARI, [tensor("TEXT", np.array([[b"a"]], dtype=np.object_))],
                          "invalid_request: text: ", False),
    "unknown input": (HIBARI, [tensor("TEXT", b"Hi."), tensor("VOLUME", b"11")], "invalid_request: volume: ", False),
    "unknown model": ("no_such_pipeline", request(), "unavailable: ", False),
}


@pytest.fixture(scope="module")
def log_start(triton) -> int:
    """Where this module's part of the server log begins."""
    return len(triton.log_text())


@pytest.mark.parametrize("model,inputs,expected,from_entry", CASES.values(), ids=CASES.keys())
def test_bad_input_gets_its_code_and_field(triton, log_start, model, inputs, expected, from_entry):
    message = stream_error(triton.grpc_url, model, inputs)
    assert message is not None, "the request was accepted"
    assert "Traceback" not in message and len(message) < 1000, message
    if from_entry:
        assert message.startswith(expected), message
    error = TritonStreamError(message)
    assert str(error).startswith(expected), str(error)
    assert error.code == expected.split(":")[0]


def test_unknown_version_is_unavailable(triton, log_start):
    message = stream_error(triton.grpc_url, HIBARI, request(), version="7")
    assert message is not None and TritonStreamError(message).code == "unavailable", message


def test_the_server_keeps_serving_and_logged_no_traceback(triton, log_start):
    assert synthesize(triton.grpc_url, HIBARI, "Still serving.").audio_s > 0.3
    greedy = {"do_sample": False, "subtalker_do_sample": False, "max_new_tokens": 5}
    assert synthesize(triton.grpc_url, QWEN3, "Still serving.", greedy).audio.size == 4 * 1920
    log = triton.log_text()[log_start:]
    assert "Traceback" not in log and "RecursionError" not in log, log[-3000:]
