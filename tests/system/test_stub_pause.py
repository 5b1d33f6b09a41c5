"""A stub that the host does not run for seconds (paused with SIGSTOP) must not leave tritonserver
2.51's message queues apart: a batched stage paused in the middle of a decode answers the paused
call, and every later call equals its answer from before; a stage paused before a call reaches it
is killed by the entry at Triton's "not healthy" answer, before it runs again. The server lives
(perf/investigations/stub_health_desync.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


def test_a_codec_stub_paused_mid_decode_answers_and_later_calls_stay_exact():
    script = ROOT / "perf" / "investigations" / "stub_health_desync.py"
    run = subprocess.run([sys.executable, str(script), "--when", "during",
                          "--pause-s", "3"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "the paused call: answered" in run.stdout
    assert run.stdout.count("after: equal; server alive: True") == 12


def test_a_stage_stub_answered_not_healthy_is_killed_before_it_runs_again(tmp_path):
    """A stage's stub the host does not run for a second while the entry's call reaches it (paused
    with SIGSTOP, without the supervisor, which would kill a stopped stub itself): tritonserver
    answers "not healthy" and frees the call. The entry kills that stub at once, so it never takes
    the freed call (which, taken, aborted the server: perf/investigations/stub_health_desync.py); the client gets
    `unavailable:` naming the stage; the server lives, and after a reload serves exactly again."""
    import tritonclient.grpc as grpcclient

    from client.triton_process import PlainTritonProcess
    from client.triton_stream import TritonStreamError, synthesize
    from omni_backend.stubs import server_stubs as stubs
    from tests.toy_family import PIPELINE as pipeline
    from tests.toy_family import build_repository, expected_audio

    writer = f"{pipeline}__writer"
    server = PlainTritonProcess(build_repository(tmp_path / "repo"), log_path=tmp_path / "tritonserver.log",
                                extra_args=["--model-control-mode=explicit", "--load-model=*"])
    server.start()
    ours: list[stubs.Stub] = []
    try:
        text = "Paused writer, then healed."
        assert np.array_equal(np.concatenate(synthesize(server.grpc_url, pipeline, text).chunks),
                              expected_audio(text, 1.0))
        ours = stubs.stubs_of(server.proc.pid)
        stub = next(s for s in ours if s.model == writer)
        os.kill(stub.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(TritonStreamError) as failed:
            synthesize(server.grpc_url, pipeline, text)
        answered_s = time.monotonic() - t0
        print(f"answered in {answered_s:.1f} s: {failed.value}")
        assert failed.value.code == "unavailable" and writer in str(failed.value), str(failed.value)
        assert "not healthy" in str(failed.value)
        assert answered_s < 10
        deadline = time.monotonic() + 5
        while stubs.alive(stub) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stubs.alive(stub), "the entry did not kill the stub Triton called not healthy"
        assert f"killed stub {stub.pid}" in server.log_text()
        assert server.proc.poll() is None
        # what the supervisor does for a stage whose stub is gone: reload the pipeline
        client = grpcclient.InferenceServerClient(server.grpc_url)
        models = [pipeline, *(f"{pipeline}__{s}" for s in ("writer", "shaper", "render"))]
        for model in models:
            client.unload_model(model)
        deadline = time.monotonic() + 10
        while any(client.is_model_ready(m) for m in models) and time.monotonic() < deadline:
            time.sleep(0.05)
        for model in models[1:] + models[:1]:
            client.load_model(model)
        for i in range(3):
            text_i = f"{text} Again {i}."
            assert np.array_equal(np.concatenate(synthesize(server.grpc_url, pipeline, text_i).chunks),
                                  expected_audio(text_i, 1.0))
        assert server.proc.poll() is None
    finally:
        server.stop()
        stubs.remove_stale_regions(names={s.region for s in ours if s.region})
