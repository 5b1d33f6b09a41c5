"""Model repositories a benchmark serves: a copy of some of the committed models (quick to load)."""
from __future__ import annotations

import shutil
from pathlib import Path

from benchkit.paths import MODEL_REPOSITORY


def committed_models(target: Path, models: tuple[str, ...] | list[str]) -> Path:
    """`target` with a copy of each of `models` from the committed model_repository."""
    for model in models:
        shutil.copytree(MODEL_REPOSITORY / model, target / model, ignore=shutil.ignore_patterns("__pycache__"))
    return target
