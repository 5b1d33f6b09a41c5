"""Read Triton's Prometheus metrics."""
from __future__ import annotations

import re
import time
import urllib.request


def scrape(url: str) -> dict[str, float]:
    """{'name{labels}': value} for every sample line."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric(url: str, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for key, value in scrape(url).items():
        m = re.match(r"([^{]+)(\{.*\})?$", key)
        if m and m.group(1) == name and all(w in (m.group(2) or "") for w in want):
            total += value
    return total


def wait_for(url: str, name: str, value: float, timeout_s: float = 20.0, **labels: str) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        got = metric(url, name, **labels)
        if got == value or time.monotonic() > deadline:
            return got
        time.sleep(0.1)
