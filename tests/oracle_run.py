"""Running a reference implementation (an oracle in its own venv) over a list of jobs, by subprocess.

An oracle script takes ``--checkpoint DIR --jobs JOBS.json --out OUT --threads N`` and writes
``reference.json`` (``{"meta": ..., "jobs": {id: summary}}``) and one ``<id>.npz`` of arrays per job;
:func:`load_dump` reads that folder back as ``{"meta": ..., "jobs": {id: {summary + arrays}}}``.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

__all__ = ["load_dump", "run_oracle"]


def load_dump(out: Path) -> dict:
    """An oracle's output folder as ``{"meta": ..., "jobs": {id: {summary + arrays}}}``."""
    report = json.loads((Path(out) / "reference.json").read_text(encoding="utf-8"))
    jobs = {}
    for job_id, summary in report["jobs"].items():
        with np.load(Path(out) / f"{job_id}.npz") as data:
            jobs[job_id] = {**summary, **{key: data[key] for key in data.files}}
    return {"meta": report["meta"], "jobs": jobs}


def run_oracle(name: str, python: Path, script: Path, checkpoint: Path, jobs: list[dict], out: Path,
               threads: int, timeout: float = 900) -> dict:
    """Run ``script`` with the oracle venv's ``python`` over ``jobs`` for one checkpoint and load
    what it wrote; a failure raises with the end of its stderr."""
    out.mkdir(parents=True, exist_ok=True)
    jobs_path = out / "jobs.json"
    jobs_path.write_text(json.dumps(jobs, ensure_ascii=False), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(python), str(script), "--checkpoint", str(checkpoint), "--jobs", str(jobs_path),
                           "--out", str(out), "--threads", str(threads)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} oracle failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return load_dump(out)
