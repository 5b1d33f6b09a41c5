"""Shared fixtures: a real tritonserver on free ports, stopped also when tests fail."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.served_pipeline import running  # noqa: E402

# no silent skips under CI=true (tests/requirement.py)
pytest_plugins = ["tests.requirement", "pytester"]
# the tiers (system, oracle, unit_fast) and, on several workers, which tests share one
pytest_plugins += ["tests.tiers", "tests.worker_groups"]
# a failed test shows its servers' crashes and restarts
pytest_plugins.append("tests.server_events")
if (ROOT / "tests" / "qwen3_fixtures.py").exists():
    pytest_plugins.append("tests.qwen3_fixtures")
if (ROOT / "tests" / "orpheus_fixtures.py").exists():
    pytest_plugins.append("tests.orpheus_fixtures")
# registered once here: a session fixture imported into several test modules is a fixture of each
# module, and its reference runs would be made once per module
pytest_plugins.append("tests.qwen3_omni_fixtures")
pytest_plugins.append("tests.voxcpm2_fixtures")


@pytest.fixture(scope="session", autouse=True)
def fresh_builtin_checkpoints(tmp_path_factory):
    """Built-in random checkpoints are written anew for each test session (not a stale cache)."""
    os.environ["OMNI_CACHE_DIR"] = str(tmp_path_factory.mktemp("omni-cache"))


@pytest.fixture(scope="session")
def triton(tmp_path_factory, fresh_builtin_checkpoints):
    """tritonserver serving the committed model_repository/."""
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    with running(ROOT / "model_repository", log) as server:
        yield server
    if os.environ.get("OMNI_SHOW_SERVER_LOG"):
        print(server.log_tail(200))
