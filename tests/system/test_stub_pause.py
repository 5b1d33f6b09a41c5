"""A batched stage's stub that the host does not run for seconds in the middle of a decode (paused
with SIGSTOP) must not leave tritonserver 2.51's message queues apart: the paused call answers,
every later call equals its answer from before, the server lives (perf/stub_health_desync.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


def test_a_codec_stub_paused_mid_decode_answers_and_later_calls_stay_exact():
    run = subprocess.run([sys.executable, str(ROOT / "perf" / "stub_health_desync.py"), "--when", "during",
                          "--pause-s", "3"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "the paused call: answered" in run.stdout
    assert run.stdout.count("after: equal; server alive: True") == 12
