"""Which tests share a worker when the suite runs on several (pytest-xdist, ``--dist loadgroup``):
those of one module (its module-scoped servers start once) and those that use the same
session-scoped fixture (the committed repository's tritonserver, an oracle's reference run), so
each server and each reference run is made by one worker only. Everything else spreads.

Ports need no grouping: every server takes free ports from the kernel (client/service_process.py)."""
from __future__ import annotations

import inspect
import sysconfig
from pathlib import Path

import pytest

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


@pytest.hookimpl(tryfirst=True)   # before xdist reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "dist", "no") != "loadgroup" or not items:
        return
    for name, members in assign(items).items():
        for item in members:
            item.add_marker(pytest.mark.xdist_group(name))
