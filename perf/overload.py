"""Overload a supervised server until it breaks: mixed load on a CPU kept saturated.

    .venv/bin/python perf/overload.py [--runs 10] [--minutes 3] [--clients 20] [--burners N]

Each run starts its own supervised tritonserver (committed model_repository, or `--repository`)
and the speech API, records every "exact" request served alone, then starts `--burners` busy
processes (default 8x the cores) and `--clients` client threads for `--minutes`. Each client loops
over:

- gRPC and HTTP (speech API, pcm) requests for hibari, the tiny Qwen3-TTS and the tiny Orpheus (its
  LM on a vLLM worker process), greedy and seeded,
  whose audio must equal the same request served alone (bit for bit: no cross-talk under load);
- hang-ups after the first chunk (gRPC stream cancel, HTTP disconnect);
- bursts of more Qwen3 streams than the engine's `max_num_seqs` at once.

A request that has neither finished nor failed `--bound-s` after it started is a wedge. A server
crash is a tritonserver restart by the supervisor (or a dead supervisor); a pipeline reload is a
heal. Every error must carry a stable code. Per run it prints requests, errors by code, wedges,
mismatches, crashes, heals, the 2.51 async-execute race's log line ("Cannot remove future"), the
answers "Stub process ... is not healthy" (`unhl`: a stub the host did not schedule for a second
while tritonserver waited on it, perf/investigations/stub_health_desync.py; those clients got, and those the
entry or the supervisor got and killed the stub for), p50 / p95 time to first audio per
interface, and the load average; exit status 1 when any run had a crash, a wedge, a mismatch, a
heal or an uncoded error. `beat s` is the oldest heartbeat of a stub that was not stuck (0.0: none
over 2 s) and `rstall` the stubs whose responses waited 10 s with none leaving: how far healthy
stubs stray under this load, which the supervisor's stall rules must not mistake for a stuck stage;
`late` the late stubs its 3-s rule for blocked stubs left to the 20-s rule (a starved host, a
stub whose loop's thread ran or waited for a CPU). `psi%` is the mean share of time some task
waited for a CPU (/proc/pressure/cpu), `<50%` the share of 5-s spells under the supervisor's
starved mark, where that rule may act.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from benchkit.paths import MODEL_REPOSITORY
from benchkit.percentiles import percentile
from client.speech_api.process import ShimProcess
from client.triton_process import TritonProcess
from client.triton_stream import coded
from omni_backend.errors import error_code
from omni_backend.supervisor.cpu_pressure import STARVED_SHARE, CpuPressure
from omni_backend.testing import busy_host

QWEN = "qwen3_tts_tiny_random"
ORPHEUS = "orpheus_tiny_random"
VOICES = {"hibari": "heart", ORPHEUS: "tara"}
# the supervisor logs the slowest stub heartbeat older than 2 s at each check (supervisor.py)
SLOW_BEAT = re.compile(r"slowest heartbeat: .*?, ([0-9.]+) s old")
LONG = " ".join(f"This is sentence number {i} of a long story." for i in range(40))


@dataclass(frozen=True)
class Variant:
    """A request whose output is fixed: served under load it must equal its solo output."""
    model: str
    text: str
    params: tuple = ()
    http: bool = True      # the speech API has no do_sample: greedy Qwen3 is gRPC only

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    def http_body(self) -> dict:
        body = {"model": self.model, "input": self.text, "response_format": "pcm",
                "voice": VOICES.get(self.model, "vivian")}
        for key, value in self.params:
            body[key] = value
        return body


VARIANTS = [
    Variant("hibari", "The quick brown fox jumps over the lazy dog."),
    Variant("hibari", "Seeded speech sounds the same every time.", (("seed", 3),)),
    Variant(QWEN, "Greedy decoding of a tiny random model.",
            (("do_sample", False), ("subtalker_do_sample", False), ("max_new_tokens", 40)), http=False),
    Variant(QWEN, "Seeded sampling is reproducible.", (("seed", 7), ("max_new_tokens", 40))),
    Variant(ORPHEUS, "Greedy Orpheus tokens from vLLM.", (("do_sample", False), ("max_new_tokens", 105)), http=False),
    Variant(ORPHEUS, "Seeded Orpheus sampling on vLLM.", (("seed", 11), ("max_new_tokens", 105))),
]


@dataclass
class Outcome:
    kind: str
    interface: str
    start: float
    ttfa_s: float | None = None
    end: str = "wedged"         # ok | cancelled | <error message> | wedged
    mismatch: bool = False
    variant: Variant | None = None


@dataclass
class RunStats:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, o: Outcome) -> None:
        with self.lock:
            self.outcomes.append(o)


# ------------------------------------------------------------------ clients

def grpc_stream(url: str, variant: Variant, text: str | None, hang_up: bool, bound_s: float,
                out: Outcome) -> bytes:
    """Stream over gRPC; the audio as float32 bytes. Sets out.end / out.ttfa_s."""
    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    inputs = [grpcclient.InferInput("TEXT", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([(text or variant.text).encode()], dtype=np.object_))
    if variant.params:
        inputs.append(grpcclient.InferInput("PARAMS", [1], "BYTES"))
        inputs[1].set_data_from_numpy(np.array([json.dumps(variant.params_dict).encode()], dtype=np.object_))
    audio = []
    try:
        try:
            client.async_stream_infer(variant.model, inputs, enable_empty_final_response=True)
        except InferenceServerException:
            # the stream broke before the request went out (a server that is restarting): the
            # reason, with its gRPC status, went to the callback
            result, error = responses.get(timeout=5)
            out.end = coded(error.message(), str(error.status()))
            return b""
        deadline = out.start + bound_s
        while True:
            try:
                result, error = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                out.end = "wedged"
                return b""
            if error is not None:   # coded as our gRPC client codes Triton's own messages
                out.end = coded(error.message(), str(error.status()))
                return b""
            chunk = result.as_numpy("AUDIO")
            if chunk is not None and chunk.size:
                if out.ttfa_s is None:
                    out.ttfa_s = time.monotonic() - out.start
                audio.append(chunk.astype(np.float32).tobytes())
                if hang_up:
                    time.sleep(random.random() * 0.05)
                    out.end = "cancelled"
                    return b""
            if result.get_response().parameters["triton_final_response"].bool_param:
                out.end = "ok"
                return b"".join(audio)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def http_stream(shim_url: str, variant: Variant, text: str | None, hang_up: bool, bound_s: float,
                out: Outcome) -> bytes:
    body = variant.http_body()
    if text:
        body["input"] = text
    data = bytearray()
    try:
        with httpx.Client(timeout=httpx.Timeout(bound_s, connect=10)) as http:
            with http.stream("POST", f"{shim_url}/v1/audio/speech", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    try:
                        err = r.json()["error"]
                        out.end = f"http {r.status_code} {err.get('code')}: {err.get('message')}"
                    except Exception:  # noqa: BLE001 - not the envelope: an uncoded error
                        out.end = f"http {r.status_code} uncoded: {r.text[:200]}"
                    return b""
                for part in r.iter_bytes():
                    if part and out.ttfa_s is None:
                        out.ttfa_s = time.monotonic() - out.start
                    data += part
                    if hang_up and data:
                        out.end = "cancelled"
                        return b""
                    if time.monotonic() - out.start > bound_s:
                        out.end = "wedged"
                        return b""
        out.end = "ok"
        return bytes(data)
    except httpx.TimeoutException:
        out.end = "wedged"
        return b""
    except httpx.HTTPError as e:
        out.end = f"http transport: {type(e).__name__}: {e}"
        return b""


def served_alone(url: str, shim_url: str, bound_s: float) -> dict[tuple[str, Variant], bytes]:
    refs = {}
    for variant in VARIANTS:
        for interface, fn, target in (("grpc", grpc_stream, url), ("http", http_stream, shim_url)):
            if interface == "http" and not variant.http:
                continue
            out = Outcome("reference", interface, time.monotonic())
            audio = fn(target, variant, None, False, bound_s, out)
            if out.end != "ok" or not audio:
                raise RuntimeError(f"reference {interface} {variant.model}: {out.end}")
            refs[(interface, variant)] = audio
    return refs


class Client(threading.Thread):
    def __init__(self, url: str, shim_url: str, refs: dict, stats: RunStats, stop: threading.Event,
                 bound_s: float, burst_size: int, seed: int):
        super().__init__(daemon=True)
        self.url, self.shim_url, self.refs, self.stats, self.stop = url, shim_url, refs, stats, stop
        self.bound_s, self.burst_size = bound_s, burst_size
        self.rng = random.Random(seed)

    def one(self, kind: str, interface: str, variant: Variant, text: str | None = None,
            hang_up: bool = False) -> None:
        out = Outcome(kind, interface, time.monotonic(), variant=variant)
        fn, target = (grpc_stream, self.url) if interface == "grpc" else (http_stream, self.shim_url)
        try:
            audio = fn(target, variant, text, hang_up, self.bound_s, out)
        except Exception as e:  # noqa: BLE001 - what our own gRPC client would report
            out.end = coded(str(e)) if interface == "grpc" else f"client: {type(e).__name__}: {e}"
            audio = b""
        if out.end == "ok" and kind == "exact":
            ref = self.refs[(interface, variant)]
            out.mismatch = audio != ref
            if out.mismatch:
                print(f"MISMATCH {interface} {variant}: {len(audio)} bytes vs {len(ref)} served alone", flush=True)
        self.stats.add(out)

    def run(self) -> None:
        while not self.stop.is_set():
            r = self.rng.random()
            interface = "grpc" if self.rng.random() < 0.5 else "http"
            variant = self.rng.choice([v for v in VARIANTS if v.http or interface == "grpc"])
            if r < 0.45:
                self.one("exact", interface, variant)
            elif r < 0.85:
                self.one("hang-up", interface, variant, LONG, hang_up=True)
            else:   # a burst: more Qwen3 streams than the engine has slots, all at once
                burst = [threading.Thread(target=self.one, args=("burst", "grpc", VARIANTS[3]), daemon=True)
                         for _ in range(self.burst_size)]
                for t in burst:
                    t.start()
                for t in burst:
                    t.join(self.bound_s + 10)


# ------------------------------------------------------------------ one run

def server_pid(server: TritonProcess) -> int | None:
    return server.server_pid


def run_once(args, number: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"omni-overload-{number}-"))
    server = TritonProcess(args.repository, log_path=work / "tritonserver.log").start(timeout_s=300)
    shim = ShimProcess([server.grpc_url], log_path=work / "shim.log")
    procs: list[subprocess.Popen] = []
    stats = RunStats()
    try:
        # healthy = every pipeline loaded; a server that lost a port race on a busy host exits
        # at once and its supervisor loads everything again, which can take minutes
        shim.start(timeout_s=300)
        first_pid = server_pid(server)
        refs = served_alone(server.grpc_url, shim.url, args.bound_s)
        procs = busy_host.burners(args.burners)
        time.sleep(1.0)
        stop = threading.Event()
        clients = [Client(server.grpc_url, shim.url, refs, stats, stop, args.bound_s, args.burst, seed=number * 1000 + i)
                   for i in range(args.clients)]
        t0 = time.monotonic()
        for c in clients:
            c.start()
        loads = []
        pressure = CpuPressure(keep_s=args.minutes * 60 + 60)
        pressure.sample(t0)
        shares = []   # per 5 s: the share of it during which some task waited for a CPU (PSI)
        while time.monotonic() - t0 < args.minutes * 60:
            time.sleep(5)
            loads.append(os.getloadavg()[0])
            now = time.monotonic()
            pressure.sample(now)
            share = pressure.waiting_share(now - 5.0)
            if share is not None:
                shares.append(share)
            if server.proc.poll() is not None:
                break
        stop.set()
        for c in clients:   # a wedged request returns at its bound
            c.join(args.bound_s + 30)
        duration = time.monotonic() - t0
        still_running = sum(c.is_alive() for c in clients)
        log = server.log_text()
        supervisor_dead = server.proc.poll() is not None
        restarts = log.count("tritonserver exited with") + (1 if supervisor_dead else 0)
        crashed = restarts > 0 or server_pid(server) != first_pid
        o = stats.outcomes
        errors: dict[str, int] = {}
        uncoded: list[str] = []
        for x in o:
            if x.end not in ("ok", "cancelled", "wedged"):
                if x.end.startswith("http ") and "uncoded" not in x.end:
                    code = x.end.split(" ")[2].rstrip(":")     # the OpenAI envelope's code
                elif x.end.startswith(("client:", "http transport")) or "uncoded" in x.end \
                        or x.end.split(":", 1)[0] not in ("invalid_request", "unavailable", "internal"):
                    code = "uncoded"
                    uncoded.append(x.end[:200])
                else:
                    code = error_code(x.end)
                errors[code] = errors.get(code, 0) + 1
        result = {
            "run": number, "duration_s": round(duration, 1), "requests": len(o),
            "ok": sum(x.end == "ok" for x in o), "hang_ups": sum(x.end == "cancelled" for x in o),
            "errors": errors, "uncoded": len(uncoded), "uncoded_samples": sorted(set(uncoded))[:5],
            "wedges": sum(x.end == "wedged" for x in o) + still_running,
            "mismatches": sum(x.mismatch for x in o),
            "exact_checked": sum(x.kind == "exact" and x.end == "ok" for x in o),
            "crashes": int(crashed), "heals": log.count("reloading "),
            "keyerrors": log.count("Cannot remove future"),
            # a stub declared unhealthy while alive: the 2.51 backend's queues then stand one
            # message apart (perf/investigations/stub_health_desync.py)
            # answers seen by clients, plus those the entry or the supervisor got and acted on
            # by killing the stub (omni_backend/stubs/unhealthy_stub.py)
            "unhealthy": sum("is not healthy" in x.end for x in o) + log.count("killed stub")
            + log.count("which Triton answered not healthy"),
            "segv": log.count("Signal (11)") + log.count("lock_exception"),
            # how late a healthy stub's event loop ran (0: never over 2 s), and the stubs whose
            # responses waited 10 s with none leaving (stub_process.py): what the supervisor's
            # stall rules must tolerate
            "slowest_beat_s": max((float(m) for m in SLOW_BEAT.findall(log)), default=0.0),
            "response_stalls": log.count("with none leaving"),
            # late stubs the supervisor's quick rule let be (starved host, busy stub: supervisor.py
            # `_not_blocked`); a heal would be a stub it did not
            "reprieves": log.count("not stuck yet"),
            "ttfa_grpc_p50_ms": percentile([x.ttfa_s * 1000 for x in o if x.interface == "grpc" and x.ttfa_s], 50),
            "ttfa_grpc_p95_ms": percentile([x.ttfa_s * 1000 for x in o if x.interface == "grpc" and x.ttfa_s], 95),
            "ttfa_http_p50_ms": percentile([x.ttfa_s * 1000 for x in o if x.interface == "http" and x.ttfa_s], 50),
            "ttfa_http_p95_ms": percentile([x.ttfa_s * 1000 for x in o if x.interface == "http" and x.ttfa_s], 95),
            "load_avg": round(statistics.mean(loads), 1) if loads else float("nan"),
            # the host's CPU pressure: mean share of time some task waited for a CPU, and the share
            # of 5-s spells under the supervisor's starved mark (where its 3-s rule may act)
            "psi_pct": round(100 * statistics.mean(shares)) if shares else None,
            "unstarved_pct": round(100 * sum(x < STARVED_SHARE for x in shares) / len(shares)) if shares else None,
            "log": str(work),
        }
        return result
    finally:
        busy_host.stop(procs)
        shim.stop()
        server.stop()


def _pct(value: int | None) -> str:
    return "-" if value is None else str(value)


def failed(r: dict) -> bool:
    return bool(r["crashes"] or r["wedges"] or r["mismatches"] or r["heals"] or r["uncoded"] or r["segv"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--burners", type=int, default=8 * (os.cpu_count() or 1), help="busy processes (default 8x cores)")
    ap.add_argument("--burst", type=int, default=12, help="streams per burst (the tiny Qwen3 has 8 slots)")
    ap.add_argument("--bound-s", type=float, default=180.0, help="a request not ended by then is a wedge")
    ap.add_argument("--json", help="append each run's result to this file (JSON lines)")
    ap.add_argument("--repository", type=Path, default=MODEL_REPOSITORY,
                    help="model repository to serve (default: the committed one), e.g. one built with another "
                         "deploy of qwen3_tts_tiny_random: `python -m ensemble_builder build --all --out DIR` then "
                         "`... build --pipeline qwen3_tts_tiny_random --deploy deploy/qwen3_tts_tiny_random.adaptive.yaml --out DIR`")
    args = ap.parse_args(argv)
    missing = [m for m in ("hibari", "qwen3_tts_tiny_random", "orpheus_tiny_random") if not (args.repository / m).is_dir()]
    if missing:
        ap.error(f"--repository: {args.repository} has no {', '.join(missing)} model (the load uses hibari, "
                 "qwen3_tts_tiny_random and orpheus_tiny_random)")
    print(f"{args.runs} runs x {args.minutes} min, {args.clients} clients, {args.burners} busy processes "
          f"on {os.cpu_count()} cores, bound {args.bound_s:.0f} s", flush=True)
    header = (f"{'run':>3} {'reqs':>5} {'ok':>5} {'hang':>5} {'exact':>5} {'mism':>4} {'wedge':>5} {'crash':>5} "
              f"{'heal':>4} {'keyerr':>6} {'unhl':>4} {'grpc p50/p95 ms':>16} {'http p50/p95 ms':>16} {'load':>5} {'psi%':>4} {'<50%':>4} {'beat s':>6} {'rstall':>6} {'late':>4}  errors")
    results = []
    for n in range(1, args.runs + 1):
        r = run_once(args, n)
        results.append(r)
        if n == 1:
            print(header)
        print(f"{n:>3} {r['requests']:>5} {r['ok']:>5} {r['hang_ups']:>5} {r['exact_checked']:>5} {r['mismatches']:>4} "
              f"{r['wedges']:>5} {r['crashes']:>5} {r['heals']:>4} {r['keyerrors']:>6} {r['unhealthy']:>4} "
              f"{r['ttfa_grpc_p50_ms']:>7.0f}/{r['ttfa_grpc_p95_ms']:<8.0f} {r['ttfa_http_p50_ms']:>7.0f}/{r['ttfa_http_p95_ms']:<8.0f} "
              f"{r['load_avg']:>5} {_pct(r['psi_pct']):>4} {_pct(r['unstarved_pct']):>4} {r['slowest_beat_s']:>6.1f} {r['response_stalls']:>6} {r['reprieves']:>4}  {r['errors'] or '-'}{'  FAILED, logs: ' + r['log'] if failed(r) else ''}", flush=True)
        for sample in r["uncoded_samples"]:
            print(f"      uncoded: {sample}", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    bad = [r for r in results if failed(r)]
    print(f"{len(results) - len(bad)} of {len(results)} runs clean")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
