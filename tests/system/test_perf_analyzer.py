"""perf_analyzer (the real binary from the tritonclient wheel) drives the entry model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


def test_perf_analyzer_streams_hibari_at_concurrency_4_without_errors(triton):
    r = subprocess.run(["bash", "perf/perf_analyzer.sh", "hibari", "--url", triton.grpc_url,
                        "--concurrency", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [l.split() for l in r.stdout.splitlines() if l.strip().startswith("4 ")]
    assert rows, r.stdout
    req_per_s = float(rows[0][1])
    assert req_per_s > 0
    assert "error" not in r.stderr.lower(), r.stderr
