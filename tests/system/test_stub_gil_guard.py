"""The stubs' GIL guard (omni_backend/supervisor/stub_gil_guard.c) in a real tritonserver: the 2.51
stub frees the arrays of a finished BLS stream's responses on its message thread, without the
GIL, whenever Python dropped them first; with the guard those objects are freed later by a
thread that holds the GIL.

Two plain Python-backend models, none of the project's code: `answer` (decoupled) answers with
one array; `caller` opens streams on it and drops each one at once, while a burst of verbose log
lines (which travel the message thread's queue, each waiting for tritonserver) holds the
stream's cleanup back. `caller` reports the guard's counters, read from its own process.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from omni_backend.stubs import server_stubs as stubs
from omni_backend.supervisor import stub_gil_guard
from tests.served_pipeline import running

ANSWER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            out = pb_utils.Tensor("OUT", np.arange(n, dtype=np.float32))
            request.get_response_sender().send(pb_utils.InferenceResponse([out]), flags=final)
        return None
'''

CALLER = '''
import ctypes
import numpy as np
import triton_python_backend_utils as pb_utils


def counter(name):
    try:
        read = getattr(ctypes.CDLL(None), name)
    except AttributeError:   # the guard is not in this process
        return -1
    read.restype = ctypes.c_ulong
    return int(read())


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            rounds = int(pb_utils.get_input_tensor_by_name(request, "ROUNDS").as_numpy().reshape(-1)[0])
            values = 0
            for _ in range(rounds):
                call = pb_utils.InferenceRequest(model_name="answer", requested_output_names=["OUT"],
                                                 inputs=[pb_utils.Tensor("N", np.array([256], np.int32))])
                stream = call.exec(decoupled=True)
                for _ in range(50):
                    pb_utils.Logger.log_verbose("busy")
                answers = list(stream)
                values += sum(1 for a in answers if not a.has_error() and a.output_tensors())
                del stream, answers
            counts = [counter("omni_gil_guard_deferred"), counter("omni_gil_guard_freed"), values]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("COUNTS", np.array(counts, np.int64))]))
        return responses
'''

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
{policy}
input [ {{ name: "{input}" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "{output}" data_type: {dtype} dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
'''


def _repository(root: Path) -> Path:
    models = {
        "answer": (ANSWER, "model_transaction_policy { decoupled: true }", "N", "OUT", "TYPE_FP32"),
        "caller": (CALLER, "", "ROUNDS", "COUNTS", "TYPE_INT64"),
    }
    for name, (code, policy, input_name, output, dtype) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, policy=policy, input=input_name,
                                                                output=output, dtype=dtype))
    return root


def _counts(server, rounds: int) -> tuple[int, int, int]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        given = grpcclient.InferInput("ROUNDS", [1], "INT32")
        given.set_data_from_numpy(np.array([rounds], np.int32))
        deferred, freed, values = client.infer("caller", [given]).as_numpy("COUNTS").tolist()
        return deferred, freed, values
    finally:
        client.close()


def test_arrays_the_stub_frees_without_the_gil_are_freed_by_the_guard_under_it(tmp_path) -> None:
    with running(_repository(tmp_path / "model_repository"), tmp_path / "tritonserver.log") as server:
        guard = stub_gil_guard.library_name()
        children = stubs.stubs_of(server.server_pid)
        assert {s.model for s in children} == {"answer", "caller"}
        for stub in children:
            assert guard in Path(f"/proc/{stub.pid}/maps").read_text(), stub.model

        deferred, freed, values = _counts(server, rounds=100)
        assert values == 100
        # the stub's message thread dropped the last reference to those arrays: without the guard,
        # each was freed there, without the GIL
        assert deferred > 0, "no array was freed off the GIL: the path this guards was not taken"
        deadline = time.monotonic() + 10
        while freed < deferred:
            assert time.monotonic() < deadline, f"the guard freed {freed} of {deferred} objects"
            time.sleep(0.1)
            deferred, freed, _ = _counts(server, rounds=0)
        assert {s.pid for s in stubs.stubs_of(server.server_pid)} == {s.pid for s in children}


def test_the_switch_starts_the_stubs_without_the_guard(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(stub_gil_guard.SWITCH_ENV, "0")
    with running(_repository(tmp_path / "model_repository"), tmp_path / "tritonserver.log") as server:
        for stub in stubs.stubs_of(server.server_pid):
            assert stub_gil_guard.library_name() not in Path(f"/proc/{stub.pid}/maps").read_text(), stub.model
        assert _counts(server, rounds=3) == (-1, -1, 3)


def test_a_switch_value_other_than_0_or_1_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(stub_gil_guard.SWITCH_ENV, "off")
    with pytest.raises(SystemExit, match=stub_gil_guard.SWITCH_ENV):
        with running(_repository(tmp_path / "model_repository"), tmp_path / "tritonserver.log"):
            pass
