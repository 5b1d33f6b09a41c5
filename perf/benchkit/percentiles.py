"""One percentile for every table: the nearest rank, so a figure is always a measured value."""
from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `values` by nearest rank; nan when there are none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]
