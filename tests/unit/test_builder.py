from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ensemble_builder.__main__ import REPO_DIR, check, main

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_build_is_deterministic(tmp_path):
    assert main(["build", "--all", "--out", str(tmp_path / "a")]) == 0
    assert main(["build", "--all", "--out", str(tmp_path / "b")]) == 0
    a, b = _snapshot(tmp_path / "a"), _snapshot(tmp_path / "b")
    assert a == b and "hibari/config.pbtxt" in a and "hibari__synthesizer/1/model.py" in a


def test_model_py_shims_only_wire(tmp_path):
    main(["build", "--pipeline", "hibari", "--out", str(tmp_path)])
    code = (tmp_path / "hibari" / "1" / "model.py").read_text()
    assert len(code.splitlines()) <= 3 and "as TritonPythonModel" in code


def test_committed_repository_is_fresh():
    assert check(REPO_DIR) == []


def test_check_fails_on_a_stale_repository(tmp_path):
    main(["build", "--all", "--out", str(tmp_path)])
    assert check(tmp_path) == []
    cfg = tmp_path / "hibari" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("count: 1", "count: 2"))
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "config.pbtxt").write_text("")
    diffs = check(tmp_path)
    assert "differs: hibari/config.pbtxt" in diffs
    assert "not built by the builder: stray/config.pbtxt" in diffs
    r = subprocess.run([sys.executable, "-m", "ensemble_builder", "check", "--repo", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "stale" in r.stderr


def test_deploy_override_and_bad_deploy(tmp_path):
    good = tmp_path / "d.yaml"
    good.write_text("pipeline: hibari\nentry:\n  max_streams: 3\nstages:\n  - stage_id: 0\n    instances: 2\n")
    assert main(["build", "--pipeline", "hibari", "--deploy", str(good), "--out", str(tmp_path / "r")]) == 0
    assert '\\"max_streams\\":3' in (tmp_path / "r" / "hibari" / "config.pbtxt").read_text()
    assert "count: 2" in (tmp_path / "r" / "hibari__synthesizer" / "config.pbtxt").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: hibari\nstages:\n  - stage_id: 0\n    instancez: 2\n")
    r = subprocess.run([sys.executable, "-m", "ensemble_builder", "build", "--pipeline", "hibari",
                        "--deploy", str(bad), "--out", str(tmp_path / "x")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "stages[0].instancez: unknown key" in r.stderr


def test_model_path_must_be_a_checkpoint(tmp_path, capsys):
    assert main(["build", "--pipeline", "hibari", "--model", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_unknown_pipeline(capsys):
    assert main(["build", "--pipeline", "nope", "--out", "/tmp/unused"]) == 2
    assert "unknown pipeline" in capsys.readouterr().err
