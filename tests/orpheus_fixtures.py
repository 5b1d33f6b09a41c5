"""Shared Orpheus fixtures (``pytest_plugins``): random checkpoints of two shapes (LM + SNAC in
``snac_24khz/``), the parity jobs, and one run of the reference (orpheus-speech + transformers +
snac in ``.venv-oracle``, by subprocess) over all of them.

    orpheus_checkpoints   {"tiny": Path, "tiny2": Path}
    orpheus_jobs          the parity cases (name, shape, text, voice, max_new_tokens, repetition_penalty, seed)
    orpheus_reference     {job name: {"prompt_ids", "tokens", "windows", "audio"}}
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.qwen3_fixtures import QWEN3_ORACLE_PYTHON, require_qwen3_oracle

REPO = Path(__file__).resolve().parents[1]
ORACLE_SCRIPT = REPO / "tests" / "oracle" / "orpheus_reference.py"
MAX_WINDOWS = 64

ORPHEUS_JOBS = [
    # name, shape, text, voice, max_new_tokens, repetition_penalty
    ("en_tara", "tiny", "Hello world, this is a streaming test.", "tara", 70, 1.3),
    ("zh_leo", "tiny", "今天天气很好，我们去公园散步吧。", "leo", 63, 1.3),
    ("punct_zoe", "tiny", "Don't stop , it's 5 o'clock ! Really ?", "zoe", 49, 1.0),
    ("en_dan", "tiny2", "A second shape, grouped-query attention and Llama 3 rope scaling.", "dan", 84, 1.3),
    ("zh_mia", "tiny2", "你好，世界。", "mia", 56, 1.1),
    ("noise_seed", "tiny2", "Seeded codec noise.", "jess", 42, 1.3),
    # a finetune's own voice (the deploy lists it; its case is kept), and a checkpoint with none
    ("fr_pierre", "tiny", "Bonjour, je m'appelle Pierre.", "Pierre", 56, 1.3),
    ("no_voice", "tiny2", "A pretrained checkpoint takes the text alone.", None, 49, 1.3),
]
SEEDS = {"noise_seed": 1234}


@pytest.fixture(scope="session")
def orpheus_checkpoints(tmp_path_factory) -> dict[str, Path]:
    from omni_backend.models.orpheus.builtin import SNAC_FOLDER
    from omni_backend.models.orpheus.random_checkpoint import write_random_orpheus
    from omni_backend.models.orpheus.random_snac import write_random_snac

    root = tmp_path_factory.mktemp("orpheus")
    out = {}
    for seed, shape in enumerate(("tiny", "tiny2")):
        path = write_random_orpheus(root / shape, shape, seed=seed)
        write_random_snac(path / SNAC_FOLDER, seed=seed)
        out[shape] = path
    return out


@pytest.fixture(scope="session")
def orpheus_jobs(orpheus_checkpoints) -> list[dict]:
    from omni_backend.models.orpheus.sampling import stop_token_ids
    from omni_backend.models.orpheus.snac import window_noise_seed
    from omni_backend.models.orpheus.tokens import OrpheusPrompt

    jobs = []
    for name, shape, text, voice, max_new_tokens, penalty in ORPHEUS_JOBS:
        path = orpheus_checkpoints[shape]
        end_of_speech = OrpheusPrompt(str(path)).tokens.end_of_speech
        seed = SEEDS.get(name, 0)
        jobs.append({"name": name, "shape": shape, "checkpoint": str(path), "snac": str(path / "snac_24khz"),
                     "text": text, "voice": voice, "max_new_tokens": max_new_tokens,
                     "repetition_penalty": penalty, "seed": seed,
                     "eos_token_ids": sorted(stop_token_ids(str(path), end_of_speech)),
                     "window_seeds": [window_noise_seed(seed, w) for w in range(MAX_WINDOWS)]})
    return jobs


@pytest.fixture(scope="session")
def orpheus_reference(orpheus_jobs, tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    require_qwen3_oracle()
    work = tmp_path_factory.mktemp("orpheus-ref")
    (work / "jobs.json").write_text(json.dumps(orpheus_jobs))
    proc = subprocess.run([str(QWEN3_ORACLE_PYTHON), str(ORACLE_SCRIPT), str(work / "jobs.json"), str(work / "out.npz")],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = np.load(work / "out.npz")
    out: dict[str, dict[str, np.ndarray]] = {}
    for key in data.files:
        name, field = key.split("/", 1)
        out.setdefault(name, {})[field] = data[key]
    return out
