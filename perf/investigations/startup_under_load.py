"""Start the supervised server again and again on a CPU kept saturated: does it come up, how fast?

    .venv/bin/python perf/investigations/startup_under_load.py [--starts 5] [--burners N] [--auto-complete]

Each start loads the committed model_repository while `--burners` busy processes (default 8x the
cores) keep every core busy, the way a server restarted after a crash under load loads. Per start
it prints the seconds until ready, the start-ups the supervisor saw die by a signal before ready
(2.51's `boost::interprocess::lock_exception` abort among them), the `lock_exception` lines, and how
many stub processes ran during loading (one per model instance, twice that with auto-completion).
`--auto-complete` passes `--strict-model-config=false`, so Triton auto-completes each model's
configuration as it does unless told otherwise: the comparison for our default, which turns it off.
Exit status 1 when a start never became ready.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from client.triton_process import TritonProcess
from omni_backend.stubs import server_stubs as stubs
from omni_backend.testing import busy_host


def _watch_stubs(server: TritonProcess, seen: set[int], stop: threading.Event) -> None:
    while not stop.is_set():
        pid = server.server_pid
        if pid is not None:
            seen.update(s.pid for s in stubs.stubs_of(pid))
        time.sleep(0.2)


def start_once(args, number: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"omni-startup-{number}-"))
    extra = ["--strict-model-config=false"] if args.auto_complete else []
    server = TritonProcess(ROOT / "model_repository", log_path=work / "tritonserver.log", extra_args=extra)
    seen: set[int] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_stubs, args=(server, seen, stop), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    ready_s = None
    try:
        server.start(timeout_s=args.timeout_s)
        ready_s = time.monotonic() - t0
    except TimeoutError:
        pass
    finally:
        stop.set()
        watcher.join()
        log = server.log_text()
        server.stop()
    return {"start": number, "ready_s": ready_s, "stubs": len(seen),
            "startup_deaths": log.count("before it was ready"),
            "lock_exception": log.count("terminate called after throwing an instance of 'boost::interprocess::lock_exception'"),
            "log": str(work / "tritonserver.log")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--burners", type=int, default=8 * (os.cpu_count() or 1), help="busy processes (default 8x cores)")
    ap.add_argument("--auto-complete", action="store_true", help="let Triton auto-complete configurations")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="a start not ready by then failed")
    args = ap.parse_args(argv)
    print(f"{args.starts} starts, {args.burners} busy processes on {os.cpu_count()} cores, "
          f"auto-completion {'on' if args.auto_complete else 'off'}", flush=True)
    print("start  ready s  stubs  start-up deaths  lock_exception")
    procs = busy_host.burners(args.burners)
    failures = 0
    try:
        for n in range(1, args.starts + 1):
            r = start_once(args, n)
            ready = f"{r['ready_s']:7.1f}" if r["ready_s"] is not None else "  never"
            failures += r["ready_s"] is None
            print(f"{n:5d}  {ready}  {r['stubs']:5d}  {r['startup_deaths']:15d}  {r['lock_exception']:14d}"
                  + ("" if r["ready_s"] is not None else f"  logs: {r['log']}"), flush=True)
    finally:
        busy_host.stop(procs)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
