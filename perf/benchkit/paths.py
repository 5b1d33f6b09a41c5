"""Where a benchmark finds the repository's parts: the committed model repository, the results
page and its journal, the reference venvs."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = ROOT / "model_repository"
# Each run appends its dated entry to the journal; RESULTS.md holds the current figures.
JOURNAL = ROOT / "perf" / "JOURNAL.md"


def venv_python(venv: str) -> Path:
    """The python of one of the repository's venvs (`.venv-oracle`, `.venv-vllm`, ...)."""
    return ROOT / venv / "bin" / "python"
