"""``perf/gpu/check.sh`` must work the first time a GPU is lent (device time is short), so its
logic runs here in its CPU dry run: tiny shapes, the same steps, the same tables."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run():
    env = dict(os.environ, PYTHON=sys.executable, CHECK_TIMEOUT="300")
    done = subprocess.run(["bash", "perf/gpu/check.sh", "--dry-run", "--no-results"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=360)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "Parity (greedy, graphs vs enforce_eager, tiny2): c=1 equal, c=3 equal, c=4 equal" in out
    assert "| c | TTFA p50 ms | TTFA p95 ms | RTF p50 | audio s/s | step ms (c frames) |" in out
    for c in (1, 2, 4):
        assert f"\n| {c} | " in out
