"""A benchmark's result: a dated markdown entry, printed and appended to the journal."""
from __future__ import annotations

from pathlib import Path


def markdown_table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def publish(entry: str, results: str | Path) -> None:
    """Print `entry` and append it to `results` (perf/JOURNAL.md unless told otherwise)."""
    print("\n" + entry)
    with open(results, "a") as f:
        f.write("\n" + entry)
