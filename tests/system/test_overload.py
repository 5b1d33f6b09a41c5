"""A short run of perf/overload.py in the suite: mixed gRPC / HTTP load with hang-ups and bursts
on a CPU saturated by busy processes; no crash, no wedge, no cross-talk, no uncoded error."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.serial   # loads every core on purpose: alone, after the parallel pass
def test_short_overload_run_is_clean():
    run = subprocess.run([sys.executable, str(ROOT / "perf" / "overload.py"), "--runs", "1", "--minutes", "0.5",
                          "--clients", "8", "--burners", "8", "--bound-s", "150"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(run.stdout[-3000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "1 of 1 runs clean" in run.stdout
