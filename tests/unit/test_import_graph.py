"""The project's import graph, read from the source (ast; nothing is imported): every import
counts, at module level, inside functions and under TYPE_CHECKING.

* No module imports itself back through others: a circle makes the import order matter and hides
  which part depends on which.
* Packages import one way: the graph of packages (omni_backend's subpackages, each model family,
  ensemble_builder, client, the speech API) has no circle, and the Triton glue (inside the
  server's stubs) and the supervisor (outside) never import each other: both stand on
  omni_backend/stubs.
* Served code never imports omni_backend/testing, which is for tests only.

perf/ holds scripts, not a library, and is not walked.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WALKED = ("omni_backend", "ensemble_builder", "client")
TESTING = "omni_backend.testing"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module under WALKED."""
    mods = {}
    for top in WALKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules `name` imports: `from a import b` names a.b when that is a module, else a."""
    def known(dotted: str) -> str | None:
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {known(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else known(base)
                      for alias in node.names}
    return {m for m in found if m is not None and m != name}


@functools.cache
def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a -> ... -> a) per strongly connected part of the graph that has one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[set[str]] = []

    def visit(v: str) -> None:   # Tarjan; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                parts.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for part in parts:   # a shortest way back to the part's first member, inside the part
        start = min(part)
        paths = {start: [start]}
        queue = [start]
        circle = None
        while circle is None:   # a strongly connected part always leads back
            v = queue.pop(0)
            for w in sorted(graph[v] & part):
                if w == start:
                    circle = paths[v] + [start]
                    break
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        circles.append(circle)
    return circles


def _package(module: str) -> str:
    """The package a module belongs to for layering: omni_backend's subpackage (each model family
    its own), omni_backend's top-level modules together, ensemble_builder, client, the speech API."""
    parts = module.split(".")
    if parts[0] != "omni_backend":
        return "client.speech_api" if parts[:2] == ["client", "speech_api"] else parts[0]
    if parts[1:2] == ["models"] and len(parts) > 2:
        return ".".join(parts[:3])
    if len(parts) > 1 and (ROOT / "omni_backend" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return "omni_backend"


def test_the_circle_finder_names_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(_circles(graph)) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_walk_sees_function_level_and_type_checking_imports():
    graph = _graph()
    # omni_backend/triton/transfer.py imports local_stage under TYPE_CHECKING only; the Qwen3-TTS
    # talker stage imports voice_clone inside a function only
    assert "omni_backend.triton.local_stage" in graph["omni_backend.triton.transfer"]
    assert "omni_backend.models.qwen3_tts.voice_clone" in graph["omni_backend.models.qwen3_tts.talker_stage"]


def test_no_module_imports_itself_back():
    circles = _circles(_graph())
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_packages_import_one_way():
    graph = _graph()
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        for other in imported:
            if _package(other) != _package(module):
                packages.setdefault(_package(module), set()).add(_package(other))
    circles = _circles(packages)
    assert not circles, "package circles:\n" + "\n".join(" -> ".join(c) for c in circles)
    for a, b in (("omni_backend.triton", "omni_backend.supervisor"), ("omni_backend.supervisor", "omni_backend.triton")):
        assert b not in packages.get(a, set()), f"{a} imports {b}"


def test_served_code_does_not_import_testing():
    graph = _graph()
    importers = {m for m, imported in graph.items()
                 if _package(m) != TESTING and any(_package(i) == TESTING for i in imported)}
    assert not importers, f"served code imports {TESTING}: {sorted(importers)}"
