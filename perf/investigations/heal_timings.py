"""How fast a dead stage is noticed and healed, and how fast SIGTERM under load ends the server.

    .venv/bin/python perf/investigations/heal_timings.py [--rounds 3]

Each round starts its own supervised tritonserver (hibari from the committed model_repository,
the tiny Qwen3-TTS with eos held back: `omni_backend.testing.long_streams`) and, with streams
read through `client.triton_stream.stream`:

1. `kill -9` of the `qwen3_tts_tiny_random__talker` stub with 4 Qwen3 streams in flight: when each
   stream ended and how (its code), when `/v2/health/ready` turned false, when it (and the
   pipeline's models) were ready again, and whether a new stream then works;
2. `kill -9` of the `hibari` entry stub with 2 hibari streams in flight and 2 more read with
   tritonclient directly: Triton 2.51 never ends a dead entry's streams, so the supervisor
   restarts the server, which closes them (raw clients see gRPC UNAVAILABLE); when they ended,
   when the server was ready again, and whether a new stream then works;
3. SIGTERM with 8 streams running (4 Qwen3 of minutes, 4 hibari): how each ended, when the
   supervisor exited, and whether any stub process or `/dev/shm` region was left.

Prints one row per round and exits 1 when any stream hung, ended without a stable code, or
anything was left behind.
"""
from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[2]

from client.triton_process import TritonProcess
from client.triton_stream import TritonStreamError, stream
from omni_backend.errors import error_code
from omni_backend.stubs import server_stubs as stubs
from omni_backend.testing import long_streams

QWEN = long_streams.QWEN
LONG_FRAMES = 4000   # eos held back this long (`long_streams`): minutes of audio
QWEN_LONG = {"max_new_tokens": LONG_FRAMES}
HIBARI_LONG = " ".join(f"Sentence number {i} keeps this stream going for a while." for i in range(40))


@dataclass
class Reader:
    """One stream read on a thread of its own: how it ended ("final" or the error) and when."""
    url: str
    model: str
    text: str
    params: dict | None = None
    chunks: int = 0
    end: str | None = None
    ended_at: float | None = None

    def start(self) -> "Reader":
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            for _ in stream(self.url, self.model, self.text, self.params, timeout_s=120):
                self.chunks += 1
            self.end = "final"
        except TritonStreamError as e:
            self.end = str(e)
        finally:
            self.ended_at = time.monotonic()


def until(predicate, timeout_s: float, step_s: float = 0.05) -> float | None:
    """Seconds until predicate() held, None when it did not within timeout_s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(step_s)
    return None


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stub_of(server: TritonProcess, model: str) -> stubs.Stub:
    pid = server.server_pid
    found = [s for s in stubs.stubs_of(pid) if s.model == model] if pid else []
    if len(found) != 1:
        raise RuntimeError(f"expected one stub of {model}, found {len(found)}")
    return found[0]


def ends(readers: list[Reader], since: float) -> tuple[str, str]:
    """(slowest end after `since`, the codes seen) of these streams, waiting up to 30 s."""
    until(lambda: all(r.ended_at for r in readers), 30)
    late = [r.ended_at - since for r in readers if r.ended_at]
    codes = sorted({r.end if r.end == "final" else error_code(r.end) or "uncoded" for r in readers if r.end})
    hung = sum(r.ended_at is None for r in readers)
    return (f"{max(late):.2f}" if late else "-") + (f" ({hung} hung)" if hung else ""), "/".join(codes) or "-"


def kill_stage(server: TritonProcess) -> dict[str, str]:
    readers = [Reader(server.grpc_url, QWEN, f"Stream {i} talks for a long time.", QWEN_LONG).start()
               for i in range(4)]
    until(lambda: all(r.chunks for r in readers), 120)
    talker = stub_of(server, f"{QWEN}__talker")
    t0 = time.monotonic()
    os.kill(talker.pid, signal.SIGKILL)
    ready = f"{server.http_url}/v2/health/ready"
    unready = until(lambda: not http_ok(ready), 10, 0.02)
    slowest, codes = ends(readers, t0)
    back = until(lambda: http_ok(ready) and http_ok(f"{server.http_url}/v2/models/{QWEN}/ready"), 300, 0.2)
    back_s = time.monotonic() - t0
    after = Reader(server.grpc_url, QWEN, "Back again.").start()
    until(lambda: after.ended_at, 120)
    return {"stage: streams end s": slowest, "codes": codes,
            "ready false s": f"{unready:.2f}" if unready is not None else "never",
            "ready again s": f"{back_s:.1f}" if back is not None else "never",
            "new stream": after.end if after.end == "final" else f"failed: {after.end}"}


@dataclass
class RawReader(Reader):
    """A stream read with tritonclient alone (no `client.triton_stream` watch): how a plain
    client sees it end; an error is its gRPC status, coded as `unavailable` when it is one."""

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        text = grpcclient.InferInput("TEXT", [1], "BYTES")
        text.set_data_from_numpy(np.array([self.text.encode()], dtype=np.object_))
        try:
            client.async_stream_infer(self.model, [text], enable_empty_final_response=True)
            while True:
                result, error = responses.get(timeout=300)
                if error is not None:
                    status = error.status() or ""
                    self.end = "unavailable: gRPC UNAVAILABLE" if status == "StatusCode.UNAVAILABLE" else error.message()
                    break
                if result.get_response().parameters["triton_final_response"].bool_param:
                    self.end = "final"
                    break
                self.chunks += 1
        except queue.Empty:
            pass   # no end in 300 s: counted as hung
        finally:
            if self.end is not None:
                self.ended_at = time.monotonic()
            client.stop_stream(cancel_requests=True)
            client.close()


def kill_entry(server: TritonProcess) -> dict[str, str]:
    readers = [Reader(server.grpc_url, "hibari", HIBARI_LONG, {"speed": 0.5}).start() for _ in range(2)]
    raw = [RawReader(server.grpc_url, "hibari", HIBARI_LONG).start() for _ in range(2)]
    until(lambda: all(r.chunks for r in readers + raw), 120)
    t0 = time.monotonic()
    os.kill(stub_of(server, "hibari").pid, signal.SIGKILL)
    slowest, codes = ends(readers, t0)
    raw_slowest, raw_codes = ends(raw, t0)
    back = until(lambda: http_ok(f"{server.http_url}/v2/health/ready")
                 and http_ok(f"{server.http_url}/v2/models/hibari/ready"), 300, 0.2)
    back_s = time.monotonic() - t0
    after = Reader(server.grpc_url, "hibari", "Back again.").start()
    until(lambda: after.ended_at, 120)
    return {"entry: streams end s": slowest, "entry codes": codes,
            "raw tritonclient end s": raw_slowest, "raw codes": raw_codes,
            "entry: ready again s": f"{back_s:.1f}" if back is not None else "never",
            "entry: new stream": after.end if after.end == "final" else f"failed: {after.end}"}


def sigterm(server: TritonProcess) -> dict[str, str]:
    pid = server.server_pid
    own = stubs.stubs_of(pid) if pid else []
    regions = {s.region for s in own if s.region}
    readers = [Reader(server.grpc_url, QWEN, f"Long stream {i}.", QWEN_LONG).start() for i in range(4)]
    readers += [Reader(server.grpc_url, "hibari", HIBARI_LONG).start() for _ in range(4)]
    until(lambda: all(r.chunks for r in readers), 120)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=30)
        exit_s = f"{time.monotonic() - t0:.1f}"
    except Exception:  # noqa: BLE001 - still running after 30 s: reported, then killed below
        exit_s = "> 30"
    slowest, codes = ends(readers, t0)
    time.sleep(0.5)
    left_stubs = [s for s in own if stubs.alive(s)]
    left_regions = {p.name for p in stubs.SHM_DIR.glob(f"{stubs.SHM_PREFIX}*")} & regions
    return {"SIGTERM exit s": exit_s, "streams end s": slowest, "drain codes": codes,
            "left": f"{len(left_stubs)} stubs, {len(left_regions)} regions"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    failed = False
    header = None
    for n in range(1, args.rounds + 1):
        work = Path(tempfile.mkdtemp(prefix="omni-heal-"))
        repo = long_streams.repository(work / "model_repository", ["hibari", QWEN], LONG_FRAMES)
        server = TritonProcess(repo, log_path=work / "tritonserver.log").start(timeout_s=600)
        try:
            until(lambda: "watching" in server.log_text(), 30)
            row = {**kill_stage(server), **kill_entry(server), **sigterm(server)}
        finally:
            server.stop()
        if header is None:
            header = list(row)
            print("| round | " + " | ".join(header) + " |\n|" + "---|" * (len(header) + 1), flush=True)
        print(f"| {n} | " + " | ".join(row[k] for k in header) + " |", flush=True)
        bad_codes = [c for k in ("codes", "entry codes", "raw codes", "drain codes") for c in row[k].split("/")
                     if c not in ("final", "unavailable")]
        failed |= (bool(bad_codes) or "hung" in " ".join(row.values()) or "never" in row.values()
                   or row["left"] != "0 stubs, 0 regions" or row["new stream"] != "final"
                   or row["entry: new stream"] != "final"
                   or row["SIGTERM exit s"] == "> 30")
        print(f"  logs: {work}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
