"""A start-up that hangs: one model's `initialize` never returns, so tritonserver never opens its
ports. The supervisor notices it `--supervisor-start-timeout-secs` after the start, logs the model
still loading and that stub's thread stacks, kills the server and starts it again; the next start
serves, and nothing of the hung one is left."""
from __future__ import annotations

import re
import textwrap
import time

import pytest

from client.triton_process import TritonProcess
from omni_backend.stubs import server_stubs as stubs
from tests.served_pipeline import regions_left_behind, shm_regions

pytestmark = pytest.mark.system

START_TIMEOUT_S = 20

MODEL = textwrap.dedent('''
    from pathlib import Path

    from omni_backend.stubs import stub_process

    STARTED_ONCE = Path(__file__).with_name("started_once")


    def wait_for_ever():
        import threading
        threading.Event().wait()


    class TritonPythonModel:
        def initialize(self, args):
            stub_process.dump_stacks_on_signal()
            if not STARTED_ONCE.exists():   # the first start hangs, the next ones load
                STARTED_ONCE.touch()
                wait_for_ever()

        def execute(self, requests):
            raise NotImplementedError("nothing asks this model anything")
''')

CONFIG = textwrap.dedent('''
    name: "hangs_once"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
''')


def test_a_start_up_that_hangs_is_killed_logged_and_started_again(tmp_path):
    model = tmp_path / "model_repository" / "hangs_once"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(MODEL)
    (model / "config.pbtxt").write_text(CONFIG)
    before = shm_regions()
    server = TritonProcess(model.parent, log_path=tmp_path / "tritonserver.log",
                           extra_args=[f"--supervisor-start-timeout-secs={START_TIMEOUT_S}"])
    t0 = time.monotonic()
    server.start(timeout_s=START_TIMEOUT_S + 120)
    try:
        took = time.monotonic() - t0
        log = server.log_text()
        hung = re.search(rf"not ready {START_TIMEOUT_S} s after it started; still loading: "
                         r"hangs_once \(stub (\d+): sleeping, [\d.]+ s CPU\); killing it", log)
        assert hung, server.log_tail()
        assert took >= START_TIMEOUT_S
        # the hung stub's stacks, written on the supervisor's signal before the kill
        stacks = log[hung.end():]
        assert "in wait_for_ever" in stacks and "in initialize" in stacks, server.log_tail(80)
        assert stubs.parse_stub(int(hung.group(1))) is None, "the hung stub is gone"
        assert server.ready()
        assert [s.model for s in stubs.stubs_of(server.server_pid)] == ["hangs_once"]
    finally:
        server.stop()
    left = regions_left_behind(before)
    assert not left, f"shared memory left behind: {left}"
