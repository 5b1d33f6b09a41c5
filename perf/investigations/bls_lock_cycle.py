"""Reproduce the Python backend's BLS lock cycle that can freeze a whole stub process.

    .venv/bin/python perf/investigations/bls_lock_cycle.py [--pattern stream|single] [--seconds 120]

Two plain Python-backend models, none of this project's code: `burst` (decoupled) answers each
request with N tiny responses; `caller` (decoupled) runs, for `--seconds`, threads that open
`burst` streams with `exec(decoupled=True)` and read them, threads that make one-response calls
(as a cancel, a ping or appended text does), and threads busy in Python (as an entry's encoders
are). A watcher thread in `caller` writes a counter to a file every 0.2 s; when the file stops
changing for `--stall-s`, the stub is frozen: its threads' native stacks are taken with gdb and
the three that form the cycle are named.

`--pattern stream`: each stream ends with a separate FINAL response (how a stage's stream ends),
so the caller's reading thread waits in `ResponseIterator::Next` while later responses arrive.
`--pattern single`: every `burst` call answers with exactly one response that carries the
FINAL flag, so no iterator ever receives a response after `exec` returned (how the entry reads
its stages: omni_backend/triton/pulled_stream.py).

Prints one line per run: requests made, responses read, and FROZEN with the stacks' summary or
`no freeze`. Exits 1 on a freeze.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from client.triton_process import TritonProcess

BURST = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            single = int(pb_utils.get_input_tensor_by_name(request, "SINGLE").as_numpy().reshape(-1)[0])
            threading.Thread(target=self._answer, args=(request.get_response_sender(), n, single)).start()
        return None

    def _answer(self, sender, n, single):
        def response(values):
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.asarray(values, np.int32))])
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if single:
            sender.send(response(list(range(max(n, 1)))), flags=final)
            return
        for i in range(n):
            sender.send(response([i]))
        sender.send(flags=final)
'''

CALLER = '''
import json
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


def _burst(n, single):
    req = pb_utils.InferenceRequest(
        model_name="burst", requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("N", np.asarray([n], np.int32)),
                pb_utils.Tensor("SINGLE", np.asarray([single], np.int32))])
    return req.exec(decoupled=True)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            args = json.loads(pb_utils.get_input_tensor_by_name(request, "ARGS").as_numpy().reshape(-1)[0])
            threading.Thread(target=self._run, args=(request.get_response_sender(), args)).start()
        return None

    def _run(self, sender, args):
        stop = time.monotonic() + args["seconds"]
        counts = {"requests": 0, "responses": 0}
        lock = threading.Lock()

        def count(key, k=1):
            with lock:
                counts[key] += k

        def streams():
            while time.monotonic() < stop:
                it = _burst(args["responses"], args["single"])
                count("requests")
                n = 0
                for _ in it:
                    n += 1
                count("responses", n)

        def calls():
            while time.monotonic() < stop:
                for _ in _burst(0 if not args["single"] else 1, args["single"]):
                    pass
                count("requests")

        def busy():
            while time.monotonic() < stop:
                x = 0
                for i in range(20000):
                    x += i * i

        def watch():
            while time.monotonic() < stop + 1:
                with open(args["progress"] + ".tmp", "w") as f:
                    f.write(json.dumps({**counts, "t": time.time()}))
                os.replace(args["progress"] + ".tmp", args["progress"])
                time.sleep(0.2)

        threads = ([threading.Thread(target=streams) for _ in range(args["streams"])]
                   + [threading.Thread(target=calls) for _ in range(args["calls"])]
                   + [threading.Thread(target=busy) for _ in range(args["busy"])])
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = pb_utils.Tensor("COUNTS", np.asarray([json.dumps(counts)], dtype=object))
        sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
{io}
instance_group [{{ kind: KIND_CPU count: 1 }}]
'''

BURST_IO = '''input [{ name: "N" data_type: TYPE_INT32 dims: [1] }, { name: "SINGLE" data_type: TYPE_INT32 dims: [1] }]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [-1] }]'''
CALLER_IO = '''input [{ name: "ARGS" data_type: TYPE_STRING dims: [1] }]
output [{ name: "COUNTS" data_type: TYPE_STRING dims: [1] }]'''


def write_repository(root: Path) -> None:
    for name, source, io in (("burst", BURST, BURST_IO), ("caller", CALLER, CALLER_IO)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(CONFIG.format(io=io))


def stub_pid(model: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"triton_python_backend_stub") and any(f"/{model}/".encode() in c for c in cmd):
            return int(entry.name)
    return None


# What each frame of the cycle looks like in gdb's backtraces.
CYCLE = {
    "exec holding the GIL, waiting for the iterator map": "GetResponseIterator",
    "response delivery holding the map, waiting for an iterator": "EnqueueResponse",
    "a reader woken in Next, waiting for the GIL": "ResponseIterator::Next",
}


def native_stacks(pid: int) -> str:
    out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout


def summarise(stacks: str) -> dict[str, int]:
    threads = re.split(r"\nThread \d+ ", stacks)
    found = {}
    for what, frame in CYCLE.items():
        found[what] = sum(1 for t in threads if frame in t and
                          (what != "a reader woken in Next, waiting for the GIL" or "take_gil" in t
                           or "PyEval_RestoreThread" in t or "PyEval_AcquireThread" in t))
    return found


def run(pattern: str, seconds: float, stall_s: float, streams: int, calls: int, busy: int,
        responses: int, out_dir: Path) -> bool:
    from tritonclient import grpc as grpcclient
    import numpy as np

    repo = Path(tempfile.mkdtemp(prefix="bls_cycle_"))
    write_repository(repo)
    progress = out_dir / f"progress_{pattern}.json"
    server = TritonProcess(repo, log_path=out_dir / f"server_{pattern}.log",
                           extra_args=["--supervisor-heal=false"]).start()
    frozen = False
    try:
        args = {"seconds": seconds, "single": int(pattern == "single"), "streams": streams, "calls": calls,
                "busy": busy, "responses": responses, "progress": str(progress)}
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: list = []
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        inp = grpcclient.InferInput("ARGS", [1], "BYTES")
        inp.set_data_from_numpy(np.asarray([json.dumps(args).encode()], dtype=object))
        client.async_stream_infer("caller", [inp])
        last, last_change, started = None, time.monotonic(), time.monotonic()
        while not results:
            time.sleep(0.5)
            text = progress.read_text() if progress.exists() else None
            if text != last:
                last, last_change = text, time.monotonic()
            elif time.monotonic() - last_change > stall_s and time.monotonic() - started > stall_s:
                frozen = True
                break
        counts = json.loads(last) if last else {}
        if frozen:
            pid = stub_pid("caller")
            stacks = native_stacks(pid) if pid else ""
            (out_dir / f"stacks_{pattern}.txt").write_text(stacks)
            print(f"{pattern}: FROZEN after {last_change - started:.1f} s; {counts.get('requests')} requests, "
                  f"{counts.get('responses')} responses; threads in the cycle: {json.dumps(summarise(stacks))}; "
                  f"stacks in {out_dir / f'stacks_{pattern}.txt'}", flush=True)
        else:
            result, error = results[0]
            final = json.loads(result.as_numpy("COUNTS")[0]) if error is None else {"error": str(error)}
            print(f"{pattern}: no freeze in {seconds:.0f} s; {json.dumps(final)}", flush=True)
        client.stop_stream(cancel_requests=True)
    finally:
        server.stop()
        shutil.rmtree(repo, ignore_errors=True)
    return frozen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pattern", choices=["stream", "single"], default="stream")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--stall-s", type=float, default=10.0)
    p.add_argument("--streams", type=int, default=8, help="threads reading streams")
    p.add_argument("--calls", type=int, default=4, help="threads making one-response calls")
    p.add_argument("--busy", type=int, default=4, help="threads busy in Python")
    p.add_argument("--responses", type=int, default=50, help="responses per stream")
    p.add_argument("--out", default="/tmp/bls_lock_cycle")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return int(run(a.pattern, a.seconds, a.stall_s, a.streams, a.calls, a.busy, a.responses, out))


if __name__ == "__main__":
    sys.exit(main())
