"""Stress one server with cancellations, errors, bursts and perf_analyzer runs until it wedges.

    .venv/bin/python perf/investigations/stress_cancel.py [--iterations 300] [--py-spy /path/to/py-spy]

Each iteration starts 2-8 concurrent hibari requests: some are cancelled right after their first
audio, some fail in the stage, the rest run to the end; every 15th iteration runs
`perf/perf_analyzer.sh hibari --concurrency 4` against the same server. An iteration whose
requests do not all end within 60 s is reported as a wedge (with `--py-spy`, native stack dumps of
the hibari stub processes are written next to the server log) and the run stops. Exit status 1 on
a wedge. On the 2-core development machine it wedged the server at iterations 98 and 89 (about
4 minutes each) until a stage stream whose opening call was in flight when its client left was
drained (omni_backend/triton/bls.py); after that fix two runs of 250 iterations were clean.
"""
from __future__ import annotations

import argparse
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import numpy as np
import tritonclient.grpc as grpcclient

from client.triton_process import TritonProcess
from client.triton_stream import TritonStreamError, synthesize

LONG = " ".join(f"This is sentence number {i} of a long story." for i in range(40))


def cancel_after_first_audio(url: str) -> str:
    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = grpcclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([LONG.encode()], dtype=np.object_))
    client.async_stream_infer("hibari", [text], enable_empty_final_response=True)
    try:
        results.get(timeout=30)
    except queue.Empty:
        return "no first audio"
    time.sleep(random.random() * 0.05)
    client.stop_stream(cancel_requests=True)
    client.close()
    return "cancelled"


def one_request(url: str) -> str:
    r = random.random()
    if r < 0.4:
        return cancel_after_first_audio(url)
    try:
        if r < 0.5:
            synthesize(url, "hibari", "\U0001f642")   # nothing to speak: the stage fails it
        else:
            synthesize(url, "hibari", "The quick brown fox jumps over the lazy dog. Twice.")
        return "done"
    except TritonStreamError:
        return "error"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--py-spy", help="py-spy binary: dump the stubs' native stacks on a wedge")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="omni-stress-"))
    server = TritonProcess(ROOT / "model_repository", log_path=work / "tritonserver.log").start(timeout_s=300)
    url = server.grpc_url
    try:
        for it in range(args.iterations):
            threads = [threading.Thread(target=one_request, args=(url,), daemon=True)
                       for _ in range(random.choice([2, 4, 6, 8]))]
            for t in threads:
                t.start()
            deadline = time.time() + 60
            for t in threads:
                t.join(max(0.1, deadline - time.time()))
            stuck = f"{sum(t.is_alive() for t in threads)} requests never ended" if any(
                t.is_alive() for t in threads) else ""
            if not stuck and it % 15 == 14:
                try:
                    pa = subprocess.run(["bash", "perf/perf_analyzer.sh", "hibari", "--url", url, "--concurrency", "4"],
                                        cwd=ROOT, capture_output=True, text=True, timeout=180,
                                        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
                    print(f"iteration {it}: perf_analyzer exit {pa.returncode}", flush=True)
                except subprocess.TimeoutExpired:
                    stuck = "perf_analyzer got no answers for 180 s"
            if stuck:
                print(f"iteration {it}: WEDGED, {stuck}; server log {work / 'tritonserver.log'}")
                if args.py_spy:
                    pids = subprocess.run(["pgrep", "-f", f"{ROOT / 'model_repository' / 'hibari'}"],
                                          capture_output=True, text=True).stdout.split()
                    for pid in pids:
                        dump = subprocess.run([args.py_spy, "dump", "--native", "--pid", pid],
                                              capture_output=True, text=True).stdout
                        (work / f"py-spy-{pid}.txt").write_text(dump)
                    print(f"stack dumps in {work}")
                return 1
            if it % 10 == 0:
                print(f"iteration {it}: ok", flush=True)
        print(f"no wedge in {args.iterations} iterations")
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
