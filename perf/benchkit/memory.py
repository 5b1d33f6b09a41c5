"""A process's memory, as Linux reports it (/proc and ps)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def status_kb(pid: int) -> dict[str, int]:
    """VmRSS and its parts (RssAnon, RssShmem) and VmHWM, in KiB; {} once the process is gone."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssShmem"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants (a server and its stubs), MiB."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,rss="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for line in out.splitlines():
        p, pp, r = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
        rss[p] = r
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total / 1024
