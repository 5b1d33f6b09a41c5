"""Error mapping, API keys, SSE framing, the stream limit and the no-torch rule."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from client.speech_api import sse
from client.speech_api.admission import StreamLimiter
from client.speech_api.auth import ApiKeys, load_api_keys
from client.speech_api.errors import ApiError, from_triton

ROOT = Path(__file__).resolve().parents[2]


TRITON_ERRORS = [
    # (message, status, param, type, code)
    ("invalid_request: text: is empty", 400, "input", "invalid_request_error", "invalid_value"),
    ("invalid_request: voice: unknown value 'x'; available: heart", 400, "voice", "invalid_request_error",
     "invalid_value"),
    ("invalid_request: params: is not valid JSON", 400, None, "invalid_request_error", "invalid_value"),
    ("invalid_request: params: is nested too deeply (parameters are a flat JSON object)", 400, None,
     "invalid_request_error", "invalid_value"),
    ("unavailable: busy: hibari is at its limit of 64 concurrent streams; retry shortly", 429, None,
     "rate_limit_error", "rate_limit_exceeded"),
    ("unavailable: hibari is shutting down", 503, None, "server_error", "service_unavailable"),
    ("unavailable: hibari__synthesizer: Stub process 'hibari__synthesizer_0_0' is not healthy.", 503, None,
     "server_error", "service_unavailable"),
    # Triton's own messages, without a code of ours:
    ("Stub process 'hibari_0_0' is not healthy.", 503, None, "server_error", "service_unavailable"),
    ("Server is stopping, request refused", 503, None, "server_error", "service_unavailable"),
    ("Request for unknown model: 'hibari' has no available versions", 503, None, "server_error",
     "service_unavailable"),
    ("Request for unknown model: 'nope' is not found", 503, None, "server_error", "service_unavailable"),
    ("internal: RuntimeError: boom", 500, None, "server_error", "internal_error"),
    ("something odd", 500, None, "server_error", "internal_error"),
    ("", 500, None, "server_error", "internal_error"),
]


@pytest.mark.parametrize("message,status,param,type_,code", TRITON_ERRORS)
def test_triton_errors_map_to_http(message, status, param, type_, code):
    e = from_triton(message)
    assert (e.status, e.param, e.type, e.code) == (status, param, type_, code)
    if status == 429:
        assert e.headers["retry-after"] == "1" and e.headers["retry-after-ms"] == "1000"
        assert e.message.startswith("hibari is at its limit")   # no code or "busy:" in the text
    elif status == 503:
        assert int(e.headers["retry-after"]) >= 1 and not e.message.startswith("unavailable")
    else:
        assert "retry-after" not in e.headers
    assert set(e.envelope()["error"]) == {"message", "type", "param", "code"}
    assert e.message


def test_error_bodies_are_ascii_json_even_for_lone_surrogates():
    """A client's lone surrogate quoted in a message must not make the error unencodable."""
    e = from_triton("invalid_request: voice: unknown value '\\ud800 '; available: heart")
    body = ApiError(400, "input: \ud800", type="invalid_request_error", code="invalid_value",
                    param="input").body()
    assert json.loads(body)["error"]["message"] == "input: \ud800"
    body.decode("ascii")
    assert json.loads(e.body())["error"]["param"] == "voice"


def test_api_keys_from_env_and_flags():
    keys = load_api_keys(["k3", " "], {"OMNI_API_KEYS": "k1, k2 k1"})
    assert keys == ("k1", "k2", "k3")
    check = ApiKeys(keys).check
    check("Bearer k2")
    check("bearer k3")
    for header in (None, "", "Bearer", "Bearer k4", "Basic k1", "k1"):
        with pytest.raises(ApiError) as e:
            check(header)
        assert e.value.status == 401 and e.value.headers["www-authenticate"] == "Bearer"
    ApiKeys(()).check(None)  # no keys configured: open


def test_sse_frames():
    frame = sse.delta(b"\x00\x01")
    assert frame == b'data: {"type":"speech.audio.delta","audio":"AAE="}\n\n'
    done = json.loads(sse.done("Hello, world.", 2.0)[len(b"data: "):])
    assert done == {"type": "speech.audio.done",
                    "usage": {"input_tokens": 4, "output_tokens": 25, "total_tokens": 29}}


def test_stream_limiter():
    limiter = StreamLimiter(2, retry_after_s=3)
    limiter.acquire("a")
    limiter.acquire("a")
    limiter.acquire("b")
    with pytest.raises(ApiError) as e:
        limiter.acquire("a")
    assert e.value.status == 429 and e.value.headers["retry-after"] == "3"
    limiter.release("a")
    limiter.acquire("a")
    unlimited = StreamLimiter(0)
    for _ in range(100):
        unlimited.acquire("a")


def test_the_shim_never_imports_torch():
    from ensemble_builder.build import catalog
    from omni_backend.families import pipelines

    catalogs = {n: catalog(p, p.default_model) for n, p in pipelines().items() if p.default_model}
    code = (
        "import json, sys\n"
        "from client.speech_api.app import create_app\n"
        "from client.speech_api.config import ShimConfig\n"
        "from client.speech_api.catalog import describe_pipeline\n"
        "create_app(ShimConfig())\n"
        "infos = [describe_pipeline(n, c) for n, c in json.load(sys.stdin).items()]\n"
        "assert all(i.known for i in infos), [i.name for i in infos if not i.known]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not heavy, heavy\n"
        "print('ok', len(infos))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         input=json.dumps(catalogs))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ok {len(catalogs)}")
