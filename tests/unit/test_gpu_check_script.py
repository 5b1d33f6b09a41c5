"""``perf/gpu/check.sh`` must work on its first GPU run, which is short, so its logic is checked
without a GPU in its CPU dry run: tiny shapes, the same steps, the same tables."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the dry runs start tritonservers and benchmark them for minutes: not the edit-test loop
pytestmark = pytest.mark.system


def test_gpu_check_dry_run():
    env = dict(os.environ, PYTHON=sys.executable, CHECK_TIMEOUT="300")
    done = subprocess.run(["bash", "perf/gpu/check.sh", "--dry-run", "--no-results"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=360)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert ("Parity (greedy and seeded sampling, graphs vs enforce_eager, tiny2): c=1 equal, c=3 equal, c=4 equal, "
            "c=3 sampled equal") in out
    assert "| c | TTFA p50 ms | TTFA p95 ms | RTF p50 | audio s/s | step ms (c frames) |" in out
    for c in (1, 2, 4):
        assert f"\n| {c} | " in out
    # the Qwen3-Omni check ran before it, with its tables
    assert "## Qwen3-Omni GPU check (DRY RUN, CPU, tiny shape)" in out
    assert "| c | TTFT p50 ms | TTFT p95 ms | TTFA p50 ms | TTFA p95 ms | RTF p50 | audio s/s |" in out
    # the frame step's profile ran before it
    assert "### Frame step profile: Qwen3-TTS random tiny, c = 1, cpu" in out
    # the Orpheus vLLM check ran first: its table, or the line saying vLLM is not importable
    assert "## Orpheus vLLM GPU check" in out
    assert "| c | stage engine tok/s | plain vLLM tok/s | plain / stage |" in out or "Skipped: vLLM is not" in out


def test_gpu_check_reports_what_it_measured_when_the_timeout_stops_it(tmp_path):
    """check.sh's guard sends SIGTERM at ``CHECK_TIMEOUT`` (540 s, under a 10-minute command
    limit): a stopped run must still print and write its report (with the steps it finished)."""
    results = tmp_path / "results.md"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    check = subprocess.Popen([sys.executable, "perf/gpu/check.py", "--dry-run", "--results", str(results)], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in check.stdout:
            seen.append(line)
            if "memory:" in line:  # parity done, memory check under way
                check.send_signal(signal.SIGTERM)
                break
        out = "".join(seen) + check.communicate(timeout=120)[0]
    finally:
        check.kill()
    assert check.returncode == 1, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    report = results.read_text()
    assert report.startswith("\n## Qwen3-TTS GPU check (DRY RUN")
    assert "**Problems: stopped by SIGTERM (timeout) after" in report
    assert "c=1 equal, c=3 equal, c=4 equal, c=3 sampled equal" in report  # the step it finished
    assert "| c | TTFA p50 ms |" in report


def test_served_only_with_nothing_to_serve_is_refused():
    done = subprocess.run([sys.executable, "perf/gpu/check.py", "--served-only", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2
    assert "--served-only runs nothing with --no-served or --dry-run" in done.stderr


def test_omni_gpu_check_dry_run(tmp_path):
    """The Qwen3-Omni part alone: every step on CPU (tiny shape, static steps run eagerly), its
    report written."""
    results = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "perf/gpu/omni_check.py", "--dry-run", "--results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = results.read_text()
    assert report.startswith("\n## Qwen3-Omni GPU check (DRY RUN, CPU, tiny shape)")
    assert ("Graphs vs eager (greedy thinker tokens and talker frames): c=1 equal, c=3 equal, c=4 equal "
            "(0 graphs captured)") in report
    assert "| c | TTFT p50 ms | TTFT p95 ms | TTFA p50 ms | TTFA p95 ms | RTF p50 | audio s/s |" in report
    for c in (1, 4, 16):
        assert f"\n| {c} | " in report
    assert "Problems" not in report


def test_frame_profile_dry_run(tmp_path):
    """perf/gpu/frame_profile.py on CPU (tiny shape): its table of kernels (here CPU operators) per
    frame, with the step time, written to the results."""
    results = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "perf/gpu/frame_profile.py", "--dry-run", "--frames", "2",
                           "--work", str(tmp_path), "--results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = results.read_text()
    assert report.startswith("\n### Frame step profile: Qwen3-TTS random tiny, c = 1, cpu")
    assert "(dry run: CPU operators, not GPU kernels)" in report
    assert "| kernel | calls / frame | us / call | us / frame | share |" in report
    assert "`aten::" in report   # operators listed
    step = float(report.split("Step p50 ")[1].split(" ms")[0])
    kernels = float(report.split("); ")[1].split(" kernels per frame")[0])
    assert step > 0 and kernels > 100   # a frame is a talker step and 15 code-predictor steps


def test_frame_profile_compiled_line_dry_run(tmp_path):
    """`--compile default` adds the compiled step's time beside the uncompiled one's (CPU dry run
    with dynamo's aot_eager backend: inductor's C++ build of a variant takes minutes here)."""
    results = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "perf/gpu/frame_profile.py", "--dry-run", "--frames", "2",
                           "--compile", "default", "--compile-backend", "aot_eager",
                           "--work", str(tmp_path), "--results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    line = results.read_text().split("Compiled step (`compile: default`): p50 ")[1]
    compiled, uncompiled = float(line.split(" ms")[0]), float(line.split(" vs ")[1].split(" ms")[0])
    assert compiled > 0 and uncompiled > 0 and "compile + capture + warm-up" in line
    bad = subprocess.run([sys.executable, "perf/gpu/frame_profile.py", "--dry-run", "--compile", "reduce-overhead"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert bad.returncode == 2 and "--compile" in bad.stderr


@pytest.mark.parametrize("placement", ["own_stage", "in_talker", "in_entry", "adaptive"])
def test_served_deploy_of_each_placement_is_valid(placement):
    """`check.sh --placement X` serves the 1.7B with that deploy: it must pass the builder's checks
    (a GPU run that fails on its deploy measures nothing)."""
    import yaml

    sys.path.insert(0, str(ROOT / "perf" / "gpu"))
    try:
        from check import PLACEMENTS, served_deploy
    finally:
        sys.path.remove(str(ROOT / "perf" / "gpu"))
    from omni_backend.deploy import check_options, parse_deploy
    from omni_backend.families import get_pipeline

    cfg = check_options(parse_deploy(yaml.safe_load(served_deploy([1, 4, 16], placement)), "gpu.yaml"),
                        get_pipeline("qwen3_tts"))
    assert (cfg.stage(0).process, cfg.stage(0).options["code2wav"]) == PLACEMENTS[placement]
    assert cfg.stage(0).device == cfg.stage(1).device == "cuda" and cfg.stage(0).max_num_seqs == 16
