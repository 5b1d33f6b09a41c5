"""perf/ is a set of scripts over one small library (perf/benchkit): no script imports another
script's internals in a circle, none imports the test suite, none edits `sys.path`, and the
results page stays a page (current figures) with the dated entries in the journal."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PERF = ROOT / "perf"
# scripts that run in another venv (vLLM's, a reference's) or on a GPU host with their own set-up
OWN_VENV = {"vllm_generate.py", "voxcpm2_reference_timing.py"}


def perf_sources() -> list[Path]:
    return [p for p in sorted(PERF.rglob("*.py")) if "gpu" not in p.relative_to(PERF).parts and p.name not in OWN_VENV]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_perf_script_imports_the_tests_or_edits_sys_path():
    offenders = []
    for path in perf_sources():
        source = path.read_text()
        modules = imported_modules(path)
        if any(m == "tests" or m.startswith("tests.") for m in modules):
            offenders.append(f"{path.relative_to(ROOT)} imports tests/")
        if "sys.path.insert" in source or "sys.path.append" in source:
            offenders.append(f"{path.relative_to(ROOT)} edits sys.path")
        if any(m == "perf" or m.startswith("perf.") for m in modules):
            offenders.append(f"{path.relative_to(ROOT)} imports perf.* (a script's folder is on sys.path: "
                             "import benchkit or a sibling by name)")
    assert not offenders, "\n".join(offenders)


def test_perf_scripts_import_each_other_without_a_circle():
    """Edges between perf/*.py scripts (by their top-level module name): a directed graph with
    no cycle (bench.py and omni_bench.py once imported each other)."""
    scripts = {p.stem: p for p in PERF.glob("*.py")}
    edges = {name: {m.removeprefix("perf.").split(".")[0] for m in imported_modules(path)} & set(scripts) - {name}
             for name, path in scripts.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in edges[node]:
                if nxt == start:
                    return trail + [nxt]
                if nxt not in trail:
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in (cycle_from(s) for s in scripts) if c]
    assert not cycles, " -> ".join(cycles[0])


def test_benchkit_is_imported_by_the_benchmarks_and_imports_no_script():
    kit = {p.stem for p in (PERF / "benchkit").glob("*.py")}
    scripts = {p.stem for p in PERF.glob("*.py")}
    for path in (PERF / "benchkit").glob("*.py"):
        assert not {m.split(".")[0] for m in imported_modules(path)} & scripts, path
    for script in ("bench", "omni_bench", "voxcpm2_bench"):
        used = {m for m in imported_modules(PERF / f"{script}.py") if m.startswith("benchkit.")}
        assert used and {m.split(".")[1] for m in used} <= kit, script


def test_results_page_leads_with_current_figures_and_the_journal_keeps_dated_entries():
    page = (PERF / "RESULTS.md").read_text()
    journal = (PERF / "JOURNAL.md").read_text()
    assert len(page.splitlines()) < 400, "perf/RESULTS.md is the current figures; dated entries go to JOURNAL.md"
    assert "JOURNAL.md" in page and journal.count("\n## ") > 50
    # each pipeline's figures say how to get them again: a perf/ command and the commit measured
    sections = re.split(r"\n##+ ", page)[1:]
    assert len(sections) >= 6
    for section in sections:
        title = section.splitlines()[0]
        if "|" not in section:
            continue   # a heading over sections, no figures of its own
        assert "perf/" in section and re.search(r"\b[0-9a-f]{7}\b", section), title
