"""Which code a model family may import: a family never imports another family (what two families
share lives in a shared module such as ``omni_backend.models.qwen3_common``), and a served family
never imports ``omni_backend.testing`` (the random checkpoints its built-in pipelines write live in
the family)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[2] / "omni_backend" / "models"
FAMILIES = sorted(p.name for p in MODELS.iterdir() if (p / "family.py").is_file())
SHARED = sorted(p.name for p in MODELS.iterdir() if (p / "__init__.py").is_file() and p.name not in FAMILIES)
# families whose built-in checkpoints are written by the family itself
SELF_CONTAINED = ("qwen3_tts", "qwen3_omni", "orpheus", "voxcpm2", "hibari")


def _imports(folder: Path) -> list[tuple[str, int, str]]:
    """(file, line, absolute module) of every import in ``folder``'s Python files."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((path.name, node.lineno, node.module))
            elif isinstance(node, ast.Import):
                found += [(path.name, node.lineno, alias.name) for alias in node.names]
    return found


def test_the_folders_are_known():
    assert {"qwen3_tts", "qwen3_omni", "voxcpm2"} <= set(FAMILIES)
    assert "qwen3_common" in SHARED


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_imports_no_other_family(family):
    others = [f"omni_backend.models.{other}" for other in FAMILIES if other != family]
    wrong = [(f, line, m) for f, line, m in _imports(MODELS / family)
             if any(m == o or m.startswith(o + ".") for o in others)]
    assert not wrong, f"{family} imports another family: {wrong}"


@pytest.mark.parametrize("shared", SHARED)
def test_a_shared_module_imports_no_family(shared):
    wrong = [(f, line, m) for f, line, m in _imports(MODELS / shared)
             if any(m == f"omni_backend.models.{family}" or m.startswith(f"omni_backend.models.{family}.")
                    for family in FAMILIES)]
    assert not wrong, f"{shared} imports a family: {wrong}"


@pytest.mark.parametrize("family", SELF_CONTAINED + tuple(SHARED))
def test_served_code_imports_no_test_helper(family):
    wrong = [(f, line, m) for f, line, m in _imports(MODELS / family)
             if m == "omni_backend.testing" or m.startswith("omni_backend.testing.")]
    assert not wrong, f"{family} imports test helpers at run time: {wrong}"
