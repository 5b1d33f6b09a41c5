"""perf/bench.py end to end on the tiny random pipeline: its own tritonserver, the in-process
run and the table it appends (the slow, real-shape runs are in perf/RESULTS.md and perf/JOURNAL.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]


def test_bench_prints_and_appends_the_table(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# earlier results\n")
    done = subprocess.run([sys.executable, "perf/bench.py", "--pipeline", "qwen3_tts_tiny_random",
                           "--concurrency", "1,2", "--requests", "1", "--frames", "6", "--breakdown",
                           "--rate", "4", "--rate-requests", "3", "--results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    text = results.read_text()
    assert text.startswith("# earlier results\n")   # appended, not overwritten
    assert "## qwen3_tts_tiny_random (" in text and "Triton server 2.51.0" in text and "torch " in text
    header = next(line for line in text.splitlines() if line.startswith("| c |"))
    assert "in-proc audio s/s" in header and "served/in-proc RTF" in header
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")}
    assert set(rows) == {"1", "2"}
    for c, cells in rows.items():
        requests, errors = int(cells[0]), int(cells[1])
        assert (requests, errors) == (int(c), 0)
        assert float(cells[5]) > 0   # audio seconds per second
        assert cells[9].endswith("%") and 0 <= float(cells[9].rstrip(" %")) <= 100   # continuity
    assert "served - in-proc TTFA p50 ms" in header and "underrun p50 s" in header
    rate = next(line for line in text.splitlines() if line.startswith("| 4 |"))
    assert [c.strip() for c in rate.split("|")[2:4]] == ["3", "0"]   # Poisson arrivals: requests, errors
    # where first audio goes: the parts add up to served - in-process, each a real duration
    parts = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in text.splitlines()
             if line.startswith("| ") and line.rstrip().endswith("|") and line.split("|")[2].strip()
             .replace(".", "", 1).lstrip("-").isdigit()}
    served = parts["pipeline through Triton (served first audio)"]
    in_process = parts["in-process first audio"]
    assert served > 0 and in_process > 0 and parts["code2wav stage alone through Triton"] > 0
    hops = [v for k, v in parts.items() if k.startswith("of which:")]
    assert len(hops) == 3 and sum(hops) == pytest.approx(served - in_process, abs=0.2)


def test_omni_bench_reports_text_and_audio_timing(tmp_path):
    """The Qwen3-Omni table: time to first text and first audio per level (the reference's timing
    is a --reference run in perf/JOURNAL.md; it takes minutes even on the tiny checkpoint)."""
    results = tmp_path / "RESULTS.md"
    done = subprocess.run([sys.executable, "perf/bench.py", "--pipeline", "qwen3_omni_tiny_random",
                           "--concurrency", "1,2", "--requests", "1", "--frames", "6", "--tokens", "12",
                           "--results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    text = results.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| c |"))
    assert "TTFT p50 ms" in header and "TTFA p50 ms" in header
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in rows] == [(1, 1, 0), (2, 2, 0)]
    for r in rows:
        ttft, ttfa = float(r[3]), float(r[5])
        assert 0 < ttft < ttfa   # text comes first
        assert float(r[8]) > 0   # audio seconds per second
