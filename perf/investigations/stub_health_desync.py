"""A batched stage's stub that is not scheduled for a second: does tritonserver survive it?

    .venv/bin/python perf/investigations/stub_health_desync.py [--when during|before] [--pause-s 3] [--frames 2000]
                                                [--kill-unhealthy]

Starts a plain tritonserver (no supervisor, so nothing heals) with only the tiny Qwen3-TTS codec
(`qwen3_tts_tiny_random__code2wav` from the committed model_repository), records its answers to a
few code windows, then pauses its stub with SIGSTOP for `--pause-s` (a stand-in for a host that
does not schedule it) and resumes it:

- `--when during`: the pause starts while a long decode (`--frames`) is running, after the call
  reached the stub;
- `--when before`: the stub is paused before the call is sent.

While tritonserver waits for a model's `execute` to return, the 2.51 Python backend checks each
second that the stub's health thread ran; if not, that call fails with "Stub process ... is not
healthy" and the two sides' message queues are left one message apart. The script then makes 12
more calls and prints what each got (equal to the recorded answer, different, or an error) and
whether the server is still alive. Exit status 1 when the server died or an answer differed.
`--kill-unhealthy` kills the stub as soon as the paused call is answered "not healthy" (before the
stub runs again) and reloads the model, as the entry and the supervisor do
(omni_backend/stubs/unhealthy_stub.py): the server should then live and answer exactly.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import numpy as np
import tritonclient.grpc as grpcclient

from client.triton_process import PlainTritonProcess
from omni_backend.stubs import server_stubs as stubs

MODEL = "qwen3_tts_tiny_random__code2wav"
GROUPS = 16   # the tiny checkpoint's code groups


def codes(seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 100, size=(1, GROUPS, frames), dtype=np.int64)


def call(client: grpcclient.InferenceServerClient, window: np.ndarray, timeout_s: float = 60.0) -> np.ndarray:
    c = grpcclient.InferInput("CODES", list(window.shape), "INT64")
    c.set_data_from_numpy(window)
    left = grpcclient.InferInput("LEFT_CONTEXT", [1, 1], "INT32")
    left.set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
    return client.infer(MODEL, [c, left], client_timeout=timeout_s).as_numpy("AUDIO")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--when", choices=("during", "before"), default="during")
    ap.add_argument("--pause-s", type=float, default=3.0)
    ap.add_argument("--frames", type=int, default=2000, help="frames of the long decode paused in `during`")
    ap.add_argument("--kill-unhealthy", action="store_true",
                    help="kill the stub as soon as a call is answered 'not healthy' (before it runs again), "
                         "then reload the model: what the entry does (omni_backend/stubs/unhealthy_stub.py)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="omni-desync-"))
    server = PlainTritonProcess(ROOT / "model_repository", log_path=work / "tritonserver.log",
                                extra_args=["--model-control-mode=explicit", f"--load-model={MODEL}"])
    server.start(timeout_s=180)
    proc = server.proc
    client = grpcclient.InferenceServerClient(server.grpc_url)
    failed = False
    ours: list[stubs.Stub] = []
    try:
        reference = {s: call(client, codes(s, 8)) for s in range(6)}
        ours = stubs.stubs_of(proc.pid)
        stub = next(s for s in ours if s.model == MODEL)
        print(f"pause {args.when} a call, {args.pause_s:.1f} s; stub pid {stub.pid}; log: {server.log_path}", flush=True)
        result: dict[str, str] = {}

        ended: list[float] = []

        def paused_call() -> None:
            try:
                call(client, codes(99, args.frames if args.when == "during" else 8), timeout_s=120)
                result["paused"] = "answered"
            except Exception as e:  # noqa: BLE001 - what the caller saw is the result
                result["paused"] = f"error: {str(e)[:160]}"
            ended.append(time.monotonic())

        if args.when == "before":
            os.kill(stub.pid, signal.SIGSTOP)
        caller = threading.Thread(target=paused_call)
        caller.start()
        if args.when == "during":
            time.sleep(0.3)   # the call is in the stub, decoding
            os.kill(stub.pid, signal.SIGSTOP)
        paused_at = time.monotonic()
        if args.kill_unhealthy:
            caller.join(args.pause_s)
            if "not healthy" in result.get("paused", ""):
                os.kill(stub.pid, signal.SIGKILL)
                client.unload_model(MODEL)   # as the supervisor reloads: unload, then load beside the old
                deadline = time.monotonic() + 5.0
                while client.is_model_ready(MODEL) and time.monotonic() < deadline:
                    time.sleep(0.05)
                client.load_model(MODEL)
                print(f"killed stub {stub.pid} at the 'not healthy' answer; {MODEL} reloaded", flush=True)
        if stubs.alive(stub):
            time.sleep(max(0.0, args.pause_s - (time.monotonic() - paused_at)))
            os.kill(stub.pid, signal.SIGCONT)
        resumed = time.monotonic()
        caller.join()
        print(f"the paused call: {result['paused']}", flush=True)
        if args.when == "during" and result["paused"] == "answered" and ended[0] < resumed:
            # the decode was over before the pause began: nothing was tested
            print(f"the paused call was answered before the stub was resumed: use more than {args.frames} --frames")
            return 2
        for i in range(12):
            seed = i % len(reference)
            try:
                got = call(client, codes(seed, 8), timeout_s=30)
                outcome = "equal" if np.array_equal(got, reference[seed]) else "DIFFERENT"
                failed |= outcome != "equal"
            except Exception as e:  # noqa: BLE001
                outcome = f"error: {str(e)[:120]}"
            alive = proc.poll() is None
            print(f"call {i + 1:2d} after: {outcome}; server alive: {alive}", flush=True)
            if not alive:
                failed = True
                print("the server died:", " | ".join(_last_words(server.log_text(), 3)))
                break
    finally:
        server.stop()   # the process group: stubs a server that aborted left behind go with it
        # their shared memory stays (SIGKILL): only this server's regions are removed
        stubs.remove_stale_regions(names={s.region for s in ours if s.region})
    print("survived" if not failed else "FAILED")
    return 1 if failed else 0


def _last_words(log: str, n: int) -> list[str]:
    """The server's last words: its fatal signal and what it threw."""
    keys = ("Signal (", "terminate called", "what():")
    return [ln.strip() for ln in log.splitlines() if ln.strip().startswith(keys)][-n:]


if __name__ == "__main__":
    sys.exit(main())
