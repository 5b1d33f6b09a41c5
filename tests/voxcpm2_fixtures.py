"""Shared VoxCPM2 fixtures: tiny random checkpoints of three shapes (the family's own writer) and
one run of the reference (``voxcpm`` 2.0.3 in ``.venv-voxcpm-oracle``, by subprocess) per shape.

Session-scoped fixtures:

    voxcpm2_checkpoints   {shape: Path} for "tiny", "tiny2", "tiny3"
    voxcpm2_recording     a 1.2-s 16-kHz wav (a seeded sweep with noise): the cloning recording
    voxcpm2_jobs          VOXCPM2_JOBS with the recording's path filled in
    voxcpm2_reference     {shape: {"checkpoint": Path, "meta": {...}, "jobs": {id: {summary + arrays}}}}

A job's arrays: ``text_token``, ``patches`` [N, P, D], ``waveform`` (non-streaming),
``streaming_waveform`` (the reference's stateful streaming decode) and, when cloning,
``prompt_patches`` (continuation) / ``ref_patches`` (reference); see
tests/oracle/voxcpm2_reference.py. Without the oracle venv the reference
fixture skips; under ``CI=true`` it fails.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.oracle_run import load_dump, run_oracle
from tests.requirement import require

REPO = Path(__file__).resolve().parents[1]
VOXCPM2_ORACLE_PYTHON = REPO / ".venv-voxcpm-oracle" / "bin" / "python"
VOXCPM2_ORACLE_SCRIPT = REPO / "tests" / "oracle" / "voxcpm2_reference.py"
VOXCPM2_THREADS = 1          # the same on both sides: on CPU a GEMM's bits can depend on the thread count
VOXCPM2_SHAPES = {"tiny": 0, "tiny2": 1, "tiny3": 2}    # shape -> writer seed

# Latents: within 1e-5. Our step attends over the cached positions of each row up to its own
# (the reference: its whole static cache under a mask) and batches rows into one GEMM, so sums may
# round differently in float32; the waveform is within 1e-4 as every other family's.
LATENT_ATOL = 1e-5
WAVEFORM_ATOL = 1e-4

VOXCPM2_JOBS = [
    {"id": "en", "text": "Hello the world, this is speech.", "seed": 3, "min_len": 6, "inference_timesteps": 6},
    {"id": "zh", "text": "你好世界，今天天气很好。", "seed": 1, "cfg_value": 1.5, "inference_timesteps": 4,
     "min_len": 3},
    # newlines and runs of spaces: the package's generate makes each one space
    {"id": "long", "text": ("This is a longer sentence that goes on for a while,\nso that the backbone runs  many "
                            "steps;\n\n the speech keeps going until the stop head says so, or the bound is hit."),
     "seed": 7, "min_len": 20, "max_len": 40, "inference_timesteps": 3, "cfg_value": 2.5},
    {"id": "mixed", "text": "Hello 你好, we speak 中国 words to 大人.", "seed": 11, "min_len": 2, "inference_timesteps": 10},
    {"id": "clone_en", "text": "Hello again.", "prompt_text": "the reference speaks.", "recording": True,
     "seed": 5, "min_len": 4, "inference_timesteps": 5},
    {"id": "clone_zh", "text": "今天我们合成语音。", "prompt_text": "你好世界。", "recording": True,
     "seed": 2, "min_len": 5, "inference_timesteps": 4, "cfg_value": 3.0},
    # the reference's other two cloning modes: the recording's voice alone, and both
    {"id": "reference_en", "text": "Only the voice of the recording.", "reference": True, "seed": 4, "min_len": 3,
     "inference_timesteps": 4},
    # voice design, and a reference clone with a style: a description (`instructions`) before the text
    {"id": "design_en", "text": "A designed voice speaks.", "control": "A young woman, gentle and sweet voice",
     "seed": 8, "min_len": 4, "inference_timesteps": 4},
    {"id": "reference_styled_en", "text": "The voice, but cheerful.", "control": "cheerful, a little faster",
     "reference": True, "seed": 9, "min_len": 3, "inference_timesteps": 3},
    {"id": "ultimate_zh", "text": "我们今天说中国话。", "prompt_text": "你好世界。", "recording": True, "reference": True,
     "seed": 6, "min_len": 4, "inference_timesteps": 3},
]


def require_voxcpm2_oracle() -> None:
    require(VOXCPM2_ORACLE_PYTHON.exists(), f"reference venv missing: {VOXCPM2_ORACLE_PYTHON} "
            "(run `make voxcpm-oracle` or tests/oracle/voxcpm_install.sh)")


def recording_samples(seconds: float = 1.2, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 220 * t * (1 + t)) + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def load_voxcpm2_dump(out: Path) -> dict:
    """The oracle's output folder as ``{"meta": ..., "jobs": {id: {summary + arrays}}}``."""
    return load_dump(out)


def run_voxcpm2_oracle(checkpoint: Path, jobs: list[dict], out: Path, timeout: float = 900) -> dict:
    """Run the reference over ``jobs`` for one checkpoint and load what it wrote."""
    return run_oracle("VoxCPM2", VOXCPM2_ORACLE_PYTHON, VOXCPM2_ORACLE_SCRIPT, checkpoint, jobs, out, VOXCPM2_THREADS, timeout)


@pytest.fixture(scope="session")
def voxcpm2_checkpoints(tmp_path_factory) -> dict[str, Path]:
    from omni_backend.models.voxcpm2.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("voxcpm2_checkpoints")
    return {shape: Path(write_random_checkpoint(str(root / shape), shape, seed))
            for shape, seed in VOXCPM2_SHAPES.items()}


@pytest.fixture(scope="session")
def voxcpm2_recording(tmp_path_factory) -> Path:
    import soundfile as sf

    path = tmp_path_factory.mktemp("voxcpm2_recording") / "prompt.wav"
    sf.write(str(path), recording_samples(), 16000, subtype="FLOAT")
    return path


@pytest.fixture(scope="session")
def voxcpm2_jobs(voxcpm2_recording) -> list[dict]:
    jobs = []
    for job in VOXCPM2_JOBS:
        job = dict(job)
        if job.pop("recording", False):
            job["prompt_wav"] = str(voxcpm2_recording)
        if job.pop("reference", False):
            job["reference_wav"] = str(voxcpm2_recording)
        jobs.append(job)
    return jobs


@pytest.fixture(scope="session")
def voxcpm2_reference(voxcpm2_checkpoints, voxcpm2_jobs, tmp_path_factory) -> dict[str, dict]:
    require_voxcpm2_oracle()
    root = tmp_path_factory.mktemp("voxcpm2_oracle")
    return {shape: {"checkpoint": checkpoint, **run_voxcpm2_oracle(checkpoint, voxcpm2_jobs, root / shape)}
            for shape, checkpoint in voxcpm2_checkpoints.items()}
