"""The test tiers, as marks given at collection, so that a new test lands in its tier by where it
lives and what it uses, with no mark to remember:

- ``system``: starts a real tritonserver: every test under tests/system, and unit modules that say
  so (``pytestmark = pytest.mark.system``);
- ``unit_fast``: the rest of tests/unit, less what needs another venv (a module marked ``oracle``:
  .venv-oracle, .venv-omni-oracle, .venv-voxcpm-oracle, .venv-vllm; or a test that uses a fixture
  named ``*reference``: the fixtures that run an oracle are named so) and less what is marked
  ``slow`` (soaks, batch-against-solo runs: tens of seconds each). `make test-unit` runs these:
  the edit-test loop."""
from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _runs_an_oracle(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return item.get_closest_marker("oracle") is not None or any(
        name.endswith("reference") for name in (info.names_closure if info else ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve()
        if TESTS / "system" in path.parents and item.get_closest_marker("system") is None:
            item.add_marker(pytest.mark.system)
        if (TESTS / "unit" in path.parents and item.get_closest_marker("system") is None
                and item.get_closest_marker("slow") is None and not _runs_an_oracle(item)):
            item.add_marker(pytest.mark.unit_fast)
