"""Which tests share a worker when the suite runs on several (pytest-xdist, ``--dist loadgroup``):
those of one module (its module-scoped servers start once) and those that use the same
session-scoped fixture (the committed repository's tritonserver, an oracle's reference run), so
each server and each reference run is made by one worker only. Everything else spreads.

Ports need no grouping: every server takes free ports from the kernel (client/service_process.py)."""
from __future__ import annotations

import inspect
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

import pytest

GROUPS_ENV = "OMNI_TEST_GROUPS_FILE"
INSTALLED = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib", "stdlib")}


def _keys(item: pytest.Item) -> list[str]:
    """What ties the item to others: its module and every session fixture it uses."""
    keys = [f"module {item.path}"]
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info else ()):
        if not defs or defs[-1].scope != "session":
            continue
        where = Path(inspect.getfile(defs[-1].func)).resolve()
        # installed plugins' (pytest's tmp_path_factory) are cheap, and an autouse one (every test
        # uses it) ties nothing
        if not any(root in where.parents for root in INSTALLED) and not getattr(defs[-1], "_autouse", False):
            keys.append(f"fixture {where}::{name}")
    return keys


class _Groups:
    """Union-find over keys."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def join(self, keys: list[str]) -> str:
        root = self.find(keys[0])
        for key in keys[1:]:
            other = self.find(key)
            if other != root:
                self.parent[other] = root
        return root


def assign(items: list[pytest.Item]) -> dict[str, list[pytest.Item]]:
    """Group name (a module of the group) -> its items."""
    keys = {item.nodeid: _keys(item) for item in items}
    groups = _Groups()
    for item in items:
        groups.join(keys[item.nodeid])
    out: dict[str, list[pytest.Item]] = {}
    for item in items:
        root = groups.find(keys[item.nodeid][0])
        out.setdefault(root.removeprefix("module ").split("/tests/", 1)[-1], []).append(item)
    return out


def _grouping(config: pytest.Config) -> bool:
    # the controller has --dist; a worker runs with dist "no" and xdist's own loadgroup flag
    return getattr(config.option, "dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def pytest_configure(config: pytest.Config) -> None:
    """On the controller: a file where the workers put the groups (they collect, it does not);
    they inherit its path from the environment."""
    if _grouping(config) and not hasattr(config, "workerinput"):
        folder = Path(tempfile.mkdtemp(prefix="omni-test-groups-"))
        os.environ[GROUPS_ENV] = str(folder / "groups.json")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: write test id -> group (every worker collects the same tests, so any one's
    file will do; written whole, then renamed, so the controller never reads half of one)."""
    if not (_grouping(config) and hasattr(config, "workerinput") and os.environ.get(GROUPS_ENV) and items):
        return
    target = Path(os.environ[GROUPS_ENV])
    mapping = {item.nodeid: name for name, members in assign(items).items() for item in members}
    part = target.with_name(f"{target.name}.{os.getpid()}")
    part.write_text(json.dumps(mapping))
    part.replace(target)


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with our groups: xdist's own reads ``xdist_group`` marks from test ids,
    which pytest 9 no longer lets a plugin rename, so it would group nothing."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return None
    from xdist.scheduler.loadscope import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            # asked only once every worker has collected: the file is there
            if self.groups is None:
                self.groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text())
            return self.groups.get(nodeid, nodeid.split("::", 1)[0])

    return GroupScheduling(config, log)
