"""The gRPC client's errors: every failure carries a stable code, Triton's own messages included."""
from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient

from client.stream import main
from client.triton_stream import TritonStreamError, _inputs, coded, stream
from client.triton_process import free_port

# Messages as tritonserver 2.51 words them (seen over gRPC streams), and what a client must see.
TRITON_MESSAGES = [
    ("[request id: <id_unknown>] inference input 'TEXT' data-type is 'FP32', but model 'hibari' expects "
     "'BYTES'", "invalid_request: text: "),
    ("[request id: <id_unknown>] unexpected shape for input 'TEXT' for model 'hibari'. Expected [1], got [2]. ",
     "invalid_request: text: "),
    ("unexpected inference input 'FOO' for model 'hibari'", "invalid_request: foo: "),
    ("expected 1 inputs but got 1 inputs for model 'hibari'. Got input(s) ['PARAMS'], but missing required "
     "input(s) ['TEXT']. Please provide all required input(s).", "invalid_request: text: "),
    ("Request for unknown model: 'nope' is not found", "unavailable: "),
    ("Request for unknown model: 'hibari' version 7 is not found", "unavailable: "),
    ("Stub process 'hibari_0_0' is not healthy.", "unavailable: "),
    ("Server is stopping, request refused", "unavailable: "),
    ("Request for unknown model: 'hibari' has no available versions", "unavailable: "),
    ("invalid_request: text: is empty", "invalid_request: text: is empty"),
    ("unavailable: busy: hibari is at its limit", "unavailable: busy: hibari is at its limit"),
    ("internal: RuntimeError: boom", "internal: RuntimeError: boom"),
    ("internal: inference input 'X' broke", "internal: inference input 'X' broke"),   # ours stays ours
    ("something odd", "internal: something odd"),
]


@pytest.mark.parametrize("message,prefix", TRITON_MESSAGES)
def test_every_message_gets_a_code(message, prefix):
    error = TritonStreamError(message)
    assert str(error).startswith(prefix) and str(error).endswith(message.split(": ", 1)[-1])
    assert error.code == prefix.split(":")[0]


def test_grpc_status_of_a_dead_channel_is_unavailable():
    assert coded("failed to connect to all addresses", "StatusCode.UNAVAILABLE").startswith("unavailable: ")
    assert coded("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED").startswith("unavailable: ")
    assert coded("boom", "StatusCode.INTERNAL") == "internal: boom"


@pytest.mark.parametrize("text,params,field", [
    ("\ud800 hi", None, "text"),
    (b"bytes", None, "text"),
    ("hi", {"speed": {1, 2}}, "params"),
])
def test_requests_that_cannot_be_encoded_fail_before_sending(text, params, field):
    with pytest.raises(TritonStreamError) as e:
        _inputs(grpcclient, text, params)
    assert str(e.value).startswith(f"invalid_request: {field}: ") and e.value.code == "invalid_request"


def test_params_travel_as_ascii_json():
    """A lone surrogate in PARAMS goes out as a \\ud800 escape, for the server to name the field."""
    text, params = _inputs(grpcclient, "hi", {"voice": "\ud800"})
    assert (text.name(), params.name()) == ("TEXT", "PARAMS")
    assert params._raw_content[4:] == b'{"voice": "\\ud800"}'   # after the 4-byte length prefix


def test_no_server_is_unavailable():
    with pytest.raises(TritonStreamError) as e:
        list(stream(f"localhost:{free_port()}", "hibari", "Hello."))
    assert e.value.code == "unavailable", str(e.value)


def test_cli_prints_the_code_and_exits_1(capsys):
    assert main(["Hello.", "--url", f"localhost:{free_port()}", "-o", "/dev/null"]) == 1
    assert capsys.readouterr().err.startswith("error: unavailable: ")
    assert main(["\udcff", "--url", f"localhost:{free_port()}", "-o", "/dev/null"]) == 1
    assert capsys.readouterr().err.startswith("error: invalid_request: text: ")
    with pytest.raises(SystemExit) as bad_json:
        main(["Hello.", "--params", "{", "-o", "/dev/null"])
    assert bad_json.value.code == 2 and "invalid_request: params: " in capsys.readouterr().err
