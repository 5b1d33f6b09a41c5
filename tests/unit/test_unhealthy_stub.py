"""A stub that tritonserver answered "not healthy" for is killed before it runs again
(omni_backend/stubs/unhealthy_stub.py); any other error kills nothing."""
from __future__ import annotations

import os
import signal
import time

import pytest

from omni_backend.stubs import server_stubs as stubs
from omni_backend.stubs.unhealthy_stub import kill_unhealthy_stub, unhealthy_instance


@pytest.mark.parametrize("message,instance", [
    ("Stub process 'q__talker_0_1' is not healthy.", "q__talker_0_1"),
    ("[StatusCode.INTERNAL] Stub process 'q__code2wav_0_0' is not healthy.", "q__code2wav_0_0"),
    ("Stub process is not healthy.", ""),
    ("Failed to obtain the health mutex.", ""),
    ("unavailable: q: the pipeline is restarting", None),
    ("Request for unknown model: 'q__talker' has no available versions", None),
    ("", None),
])
def test_the_instance_a_triton_error_calls_not_healthy(message, instance):
    assert unhealthy_instance(message) == instance


def test_the_named_stub_is_killed_even_while_it_is_not_running(fake_stub):
    proc, _, _ = fake_stub
    os.kill(proc.pid, signal.SIGSTOP)   # a stub the host does not run: it must never run again
    now = stubs.since_boot()
    assert kill_unhealthy_stub("Stub process 'talker_0_1' is not healthy.", "talker", now, os.getpid()) == []
    assert kill_unhealthy_stub("internal: something else", "talker", now, os.getpid()) == []
    assert kill_unhealthy_stub("Stub process 'talker_0_0' is not healthy.", "codec", now, os.getpid()) == []
    # a call made before this stub started was another (older) process's: a reloaded model's
    # new stub has its predecessor's instance name
    before = stubs.started_at(stubs.parse_stub(proc.pid)) - 1.0
    assert kill_unhealthy_stub("Stub process 'talker_0_0' is not healthy.", "talker", before, os.getpid()) == []
    assert proc.poll() is None
    killed = kill_unhealthy_stub("Stub process 'talker_0_0' is not healthy.", "talker", now, os.getpid())
    assert [s.pid for s in killed] == [proc.pid]
    assert proc.wait(timeout=5) == -signal.SIGKILL


def test_an_unnamed_answer_kills_every_stub_of_the_model(fake_stub):
    proc, _, _ = fake_stub
    killed = kill_unhealthy_stub("Stub process is not healthy.", "talker", stubs.since_boot(), os.getpid())
    assert [s.pid for s in killed] == [proc.pid]
    proc.wait(timeout=5)
    time.sleep(0.05)
    assert not any(s.pid == proc.pid for s in stubs.stubs_of(os.getpid()))
