"""Soak: many clients for many minutes against one server; does any process's memory grow?

    .venv/bin/python perf/soak.py [--minutes 30] [--clients 16] [--hangup 0.2] [--http 0.5]

Starts its own tritonserver on the committed model_repository (client/triton_process.py) and the
speech API (client/speech_api/process.py). Each client loops: it picks a pipeline (hibari or
qwen3_tts_tiny_random), a transport (gRPC streaming to Triton, or POST /v1/audio/speech to the
speech API in a random format), a text of 1-4 sentences and random parameters; a share of the
requests hang up after their first audio. Every minute a row: requests ended, errors by code,
p50/p95 time to first audio (TTFA, from sending the request to the first audio chunk / body byte),
and the memory of every process: tritonserver, each Python stub (named by its model: its command
line holds model_repository/<model>/1/model.py), the supervisor, the speech API, and the Python
backend's shared-memory pool.

Memory is counted once per page. A process's own memory is its anonymous resident pages (RssAnon:
heap, stacks; its file pages are libraries and weights shared with other processes, which move
between private and shared as other processes touch them). The pool is every stub's `/dev/shm`
region, allocated pages (a region grows when a model has more tensors in flight than it holds, and
never shrinks). RSS is shown too, but it counts a shared page once per mapping: the server and a
stub both map each region, and a region that grew is mapped again whole (2.51 keeps the old
mappings), so RSS rises as the same pages are touched through one more mapping although nothing
was allocated. Sampled every 5 s; a row shows the minute's lowest sample: memory rises and
falls with the work in flight (a hibari sentence needs tens of MB for a moment), what a process
never gives back shows as a rising floor (a model sums its stubs: one left behind by a reload is
memory held too). At the end each one's growth from its value after the first minute to the end:
the lowest over minutes 2-6 against the lowest over the last 5 (`--window`; minute 1 is the idle
server; a busy process's floor still moves by several MB from one minute to the next), with the
single minutes' change beside it. Under load a process's floor is also its working set (what the
requests in flight at that moment hold), so the growth judged is taken at quiet points: after
minute 1, every `--quiet-every` minutes and after the last, the clients pause, every request
ends, and after `--quiet-s` idle seconds (the stubs give free pages back every 20 s) each
process's memory is what it kept; the first quiet point against the last. At each quiet point
tritonserver's anonymous memory is also split into its threads' stacks, its main glibc heap and
the rest (/proc/<pid>/smaps; on `OMNI_TRITON_ALLOCATOR=jemalloc` all it allocates is in the
rest), with its thread count. Exit status 1 when any
kept more than --max-growth (5 %) more, any was restarted or left two stubs, or any request
failed (without quiet points the windows under load are judged instead).

Not a test (it takes half an hour); logs go to a temporary folder printed at the start.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx


from benchkit.memory import status_kb
from benchkit.paths import MODEL_REPOSITORY
from benchkit.percentiles import percentile
from benchkit.speech_api import http_request
from client.speech_api.process import ShimProcess
from client.triton_process import TritonProcess
from client.triton_stream import TritonStreamError, astream

PIPELINES = ("hibari", "qwen3_tts_tiny_random")
FORMATS = ("pcm", "wav", "mp3", "opus", "flac", "aac")
WORDS = ("the quick brown fox jumps over a lazy dog while she sells sea shells by the shore and "
         "people paid to hear it read aloud streaming servers speak clearly tonight about memory "
         "zorblax quintessential flibbertigibbet Triton inference").split()
STUB_MODEL = re.compile(r"model_repository/([^/\s]+)/1/model\.py")
SHM_PREFIX = b"triton_python_backend_shm_region_"
POOL = "shm_pool"


def sentence_text(rng: random.Random) -> str:
    """1-4 sentences of 2-25 words, some with numbers and made-up words (the OOV path)."""
    sentences = []
    for _ in range(rng.randint(1, 4)):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 25))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 100_000)))
        sentences.append(" ".join(words).capitalize() + rng.choice(".!?"))
    return " ".join(sentences)


@dataclass
class Outcome:
    ended_s: float
    ttfa_s: float | None
    error: str | None        # the error's code, None when it went well (hang-ups included)


@dataclass
class Load:
    outcomes: list[Outcome] = field(default_factory=list)
    stop: bool = False
    paused: bool = False     # a quiet phase: clients start no new request
    in_flight: int = 0


def error_code(message: str) -> str:
    head = message.split(":", 1)[0].strip()
    return head if re.fullmatch(r"[a-z_]+", head) else "other"


async def grpc_request(grpc, pipeline: str, text: str, params: dict, hang_up: bool) -> float | None:
    t0 = time.perf_counter()
    ttfa = None
    chunks = astream(grpc, pipeline, text, params)
    try:
        async for _ in chunks:
            if ttfa is None:
                ttfa = time.perf_counter() - t0
                if hang_up:
                    break
    finally:
        await chunks.aclose()   # a running request is asked to end (CONTROL=cancel), then read to its end
    return ttfa


async def client_loop(n: int, args: argparse.Namespace, grpc, http: httpx.AsyncClient, shim_url: str,
                      load: Load) -> None:
    rng = random.Random(args.seed * 1000 + n)
    while not load.stop:
        if load.paused:
            await asyncio.sleep(0.2)
            continue
        pipeline = rng.choice(args.pipelines)
        text = sentence_text(rng)
        hang_up = rng.random() < args.hangup
        seed = rng.randint(0, 2**31)
        if pipeline == "hibari":
            params = {"speed": round(rng.uniform(0.5, 2.0), 2), "seed": seed}
        else:   # bound the utterance (12.5 frames/s): random weights seldom emit eos
            params = {"seed": seed, "max_new_tokens": rng.randint(10, 60)}
        load.in_flight += 1
        try:
            if rng.random() < args.http:
                body = {"model": pipeline, "input": text, "voice": "alloy",
                        "response_format": rng.choice(FORMATS), **params}
                ttfa = await asyncio.wait_for(http_request(http, shim_url, body, hang_up), args.timeout)
            else:
                ttfa = await asyncio.wait_for(grpc_request(grpc, pipeline, text, params, hang_up), args.timeout)
            error = None if ttfa is not None else "no_audio"
        except TritonStreamError as e:
            ttfa, error = None, error_code(str(e))
        except asyncio.TimeoutError:
            ttfa, error = None, "timeout"
        except Exception as e:  # noqa: BLE001 - a transport failure is counted, the client goes on
            ttfa, error = None, f"exception_{type(e).__name__}"
        finally:
            load.in_flight -= 1
        load.outcomes.append(Outcome(time.monotonic(), ttfa, error))


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def process_name(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    cmd = " ".join(a.decode(errors="replace") for a in argv)
    stub = STUB_MODEL.search(cmd)
    if stub:
        return stub.group(1)
    if "omni_backend.supervisor" in cmd:
        return "supervisor"
    if argv and Path(argv[0].decode(errors="replace")).name == "tritonserver":
        return "tritonserver"
    return None


def processes(server_pid: int, shim_pid: int) -> dict[str, tuple[int, ...]]:
    """name -> pids for the server's process tree and the speech API (a model has two stubs
    while a reload has not ended the old one)."""
    named: dict[str, list[int]] = {"speech_api": [shim_pid]}
    for pid in descendants(server_pid):
        name = process_name(pid)
        if name:
            named.setdefault(name, []).append(pid)
    return {name: tuple(sorted(pids)) for name, pids in named.items()}


def status_sum(pids: tuple[int, ...]) -> dict[str, int]:
    """status_kb summed over a name's processes: a stub left behind is memory held too."""
    total: Counter = Counter()
    for pid in pids:
        total.update(status_kb(pid))
    return dict(total)


def shm_pool_kb(pids: list[int]) -> dict[str, int]:
    """The allocated pages (KiB) of the shared-memory regions of these stubs (each stub's region
    is its second argument), as RssAnon: the pool's row is judged like a process."""
    total = 0
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            region = next(a.decode() for a in argv[1:3] if a.startswith(SHM_PREFIX))
            total += os.stat(f"/dev/shm/{region}").st_blocks // 2
        except (OSError, StopIteration):
            continue
    return {"RssAnon": total, "VmRSS": total}


def sample(server_pid: int, shim_pid: int, pids: dict[str, tuple[int, ...]],
           restarts: Counter) -> dict[str, dict[str, int]]:
    """Every process's /proc status (KiB) and the pool's; counts a name whose pids changed."""
    now = processes(server_pid, shim_pid)
    samples = {POOL: shm_pool_kb([pid for name, pid_set in now.items() if name not in
                                  ("speech_api", "supervisor", "tritonserver") for pid in pid_set])}
    for name, pid_set in now.items():
        if name in pids and pids[name] != pid_set:
            restarts[name] += 1      # a new process: its memory starts over
        pids[name] = pid_set
        samples[name] = status_sum(pid_set)
    return samples


async def quiet_sample(args: argparse.Namespace, load: Load, server: TritonProcess, shim: ShimProcess,
                       pids: dict[str, tuple[int, ...]], restarts: Counter) -> tuple[dict[str, int], float]:
    """Pause the clients, let every request end, wait `--quiet-s` (the stubs give free pages
    back every 20 s), then each process's lowest RssAnon over three samples; the load resumes.
    Returns (name -> KiB, seconds the pause took)."""
    t0 = time.monotonic()
    load.paused = True
    try:
        while load.in_flight and time.monotonic() - t0 < args.timeout + 10:
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.quiet_s)
        lowest: dict[str, int] = {}
        for i in range(3):
            for name, st in sample(server.proc.pid, shim.proc.pid, pids, restarts).items():
                if st.get("RssAnon"):
                    lowest[name] = min(lowest.get(name, 1 << 62), st["RssAnon"])
            if i < 2:
                await asyncio.sleep(2)
    finally:
        load.paused = False
    return lowest, time.monotonic() - t0


# glibc's default thread stack is the stack limit the server inherits from this process; with no
# limit, glibc's own default (2 MiB on x86-64)
_STACK_LIMIT = resource.getrlimit(resource.RLIMIT_STACK)[0]
THREAD_STACK_KB = (_STACK_LIMIT if _STACK_LIMIT != resource.RLIM_INFINITY else 2 << 20) // 1024


def anon_parts_kb(pid: int) -> dict[str, int]:
    """A C process's anonymous resident KiB by what holds it (/proc/<pid>/smaps): its threads'
    stacks (mappings of the default stack size; a thread's stack pages stay resident once it has
    used them), the main malloc heap ([heap]), and the rest (other malloc heaps, mmapped buffers);
    and its thread count."""
    parts = {"stacks": 0, "heap": 0, "other": 0}
    kind = "other"
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
        parts["threads"] = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return {}
    for line in lines:
        head = line.split()
        if head and re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):
            start, end = (int(x, 16) for x in head[0].split("-"))
            name = head[5] if len(head) > 5 else ""
            kind = ("heap" if name == "[heap]" else "stacks" if not name and (end - start) // 1024 == THREAD_STACK_KB
                    else "other" if not name else "")
        elif kind and line.startswith("Anonymous:"):
            parts[kind] += int(head[1])
    return parts


async def soak(args: argparse.Namespace, server: TritonProcess, shim: ShimProcess) -> int:
    import tritonclient.grpc.aio as aioclient

    load = Load()
    grpc = aioclient.InferenceServerClient(server.grpc_url)
    limits = httpx.Limits(max_connections=2 * args.clients, max_keepalive_connections=2 * args.clients)
    http = httpx.AsyncClient(timeout=args.timeout, limits=limits)
    tasks = [asyncio.create_task(client_loop(n, args, grpc, http, shim.url, load)) for n in range(args.clients)]
    names: list[str] = []
    rows: list[dict[str, dict[str, int]]] = []       # per minute: name -> /proc status, KiB
    pids: dict[str, tuple[int, ...]] = {}
    restarts: Counter = Counter()
    errors_total: Counter = Counter()
    requests_total = 0
    start = time.monotonic()
    seen = 0
    interrupted = False
    quiet: list[tuple[int, dict[str, int]]] = []    # (after minute, name -> RssAnon KiB) at quiet points
    try:
        for minute in range(1, args.minutes + 1):
            # RSS moves with the work in flight; the minute's lowest sample is what the process
            # keeps, so a rising floor is memory that is never given back.
            floor: dict[str, dict[str, int]] = {}
            while True:
                samples = sample(server.proc.pid, shim.proc.pid, pids, restarts)
                for name, st in samples.items():
                    if st and st.get("RssAnon", 0) < floor.get(name, {}).get("RssAnon", 1 << 62):
                        floor[name] = st
                left = start + minute * args.interval_s - time.monotonic()
                if left <= 0:
                    break
                await asyncio.sleep(min(args.sample_s, left))
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()
            if not names:
                names = sorted(samples, key=lambda n: (n not in ("tritonserver", "supervisor"),
                                                           n in ("speech_api", POOL), n))
                print(f"{'min':>3} {'reqs':>5} {'p50 ms':>7} {'p95 ms':>7}  "
                      + " ".join(f"{n:>{max(8, len(n))}}" for n in names)
                      + f"  errors  (anonymous MB, the pool's allocated MB: lowest of the minute's "
                      f"{args.sample_s:g} s samples)", flush=True)
            window = load.outcomes[seen:]
            seen += len(window)
            ttfas = [o.ttfa_s * 1e3 for o in window if o.ttfa_s is not None]
            errs = Counter(o.error for o in window if o.error)
            errors_total.update(errs)
            requests_total += len(window)
            rows.append({n: floor.get(n, {}) for n in names})
            print(f"{minute:>3} {len(window):>5} {percentile(ttfas, 50):>7.0f} {percentile(ttfas, 95):>7.0f}  "
                  + " ".join(f"{rows[-1][n].get('RssAnon', 0) / 1024:>{max(8, len(n))}.1f}" for n in names)
                  + "  " + (" ".join(f"{k}={v}" for k, v in sorted(errs.items())) or "-"), flush=True)
            if args.quiet_every and (minute == 1 or minute % args.quiet_every == 0 or minute == args.minutes):
                kept, took = await quiet_sample(args, load, server, shim, pids, restarts)
                quiet.append((minute, kept))
                start += took    # every minute row still has a minute of load
                print("  q " + " " * 23 + " ".join(f"{kept.get(n, 0) / 1024:>{max(8, len(n))}.1f}" for n in names)
                      + f"  (quiet after minute {minute}: every request ended, {args.quiet_s:g} s idle; "
                      f"paused {took:.0f} s)", flush=True)
                # tritonserver is C++: what its anonymous memory is (a thread's stack, once used, stays)
                parts = anon_parts_kb(server.server_pid or 0)
                if parts:
                    print("    tritonserver anonymous MB: " + ", ".join(
                        f"{k} {v / 1024:.1f}" for k, v in parts.items() if k != "threads")
                        + f" ({parts['threads']} threads)", flush=True)
    except asyncio.CancelledError:   # SIGTERM or Ctrl-C: report what was measured
        interrupted = True
    finally:
        load.stop = True
        await asyncio.wait(tasks, timeout=10)   # requests still running then are not counted
        for t in tasks:
            t.cancel()
        await http.aclose()
        await grpc.close()

    failed = bool(errors_total) or interrupted
    print(f"\n{'interrupted after ' if interrupted else ''}{requests_total} requests, errors: "
          + (" ".join(f"{k}={v}" for k, v in sorted(errors_total.items())) or "none"))
    if len(rows) >= 2:
        # The first minute's floor is the idle server before the load arrived: the baseline is
        # the value after the first minute. A busy process's floor still moves with the work in
        # flight from minute to minute (the speech API's by +-10 MB), so each end is the lowest of
        # a window of minutes: minutes 2.. against the last ones; a leak raises the later floor.
        base = 1 if len(rows) >= 3 else 0
        width = max(1, min(args.window, (len(rows) - base) // 2))
        early, late = rows[base:base + width], rows[-width:]
        span = (f"min {base + 1}" if width == 1 else f"min {base + 1}-{base + width}",
                f"min {len(rows)}" if width == 1 else f"min {len(rows) - width + 1}-{len(rows)}")

        def low(window: list[dict[str, dict[str, int]]], n: str, key: str = "RssAnon") -> int:
            return min((row[n].get(key, 0) for row in window if row[n].get(key)), default=0)
        # anonymous: what the process itself allocated; RSS (for reference) counts shared pages per mapping
        print(f"\n{'process':<40} {span[0] + ' MB':>12} {span[1] + ' MB':>12} {'growth':>8} "
              f"{'minute to minute':>18} {'RSS MB':>16} {'RSS shmem MB':>16}   (lowest of each window)")
        for n in names:
            own0, own1 = low(early, n), low(late, n)
            growth = (own1 - own0) / own0 * 100 if own0 else float("nan")
            first, last = rows[base][n].get("RssAnon", 0), rows[-1][n].get("RssAnon", 0)
            single = f"{(last - first) / first * 100:+.1f}%" if first else "-"
            judged = not args.quiet_every and (not own0 or growth > args.max_growth)
            over = judged or restarts[n] > 0 or len(pids.get(n, ())) > 1
            failed |= over
            note = (f"  pids changed x{restarts[n]}" if restarts[n] else "") \
                + (f"  {len(pids[n])} processes" if len(pids.get(n, ())) > 1 else "") + ("  <- grew" if over else "")
            rss, shmem = (f"{low(early, n, k) / 1024:.1f} -> {low(late, n, k) / 1024:.1f}"
                          for k in ("VmRSS", "RssShmem"))
            if n == POOL:
                rss = shmem = ""
            print(f"{n:<40} {own0 / 1024:>12.1f} {own1 / 1024:>12.1f} {growth:>7.1f}% {single:>18} "
                  f"{rss:>16} {shmem:>16}{note}")
    if len(quiet) >= 2:
        # What a process keeps once its work is done: a leak raises it, the work in flight does not.
        (m0, q0), (m1, q1) = quiet[0], quiet[-1]
        print(f"\nKept with nothing in flight (anonymous MB; quiet points after minutes "
              f"{', '.join(str(m) for m, _ in quiet)}):")
        for n in names:
            a, b = q0.get(n, 0), q1.get(n, 0)
            growth = (b - a) / a * 100 if a else float("nan")
            over = not a or growth > args.max_growth
            failed |= over
            print(f"{n:<40} " + " ".join(f"{q.get(n, 0) / 1024:>8.1f}" for _, q in quiet)
                  + f"  {growth:+7.1f}%" + ("  <- grew" if over else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--hangup", type=float, default=0.2, help="share of requests that hang up after the first audio")
    ap.add_argument("--http", type=float, default=0.5, help="share of requests sent through the speech API")
    ap.add_argument("--pipelines", default=",".join(PIPELINES))
    ap.add_argument("--max-growth", type=float, default=5.0, help="percent over the first minute's RSS")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    ap.add_argument("--interval-s", type=float, default=60.0, help="seconds per row (a minute)")
    ap.add_argument("--window", type=int, default=5,
                    help="minutes whose lowest memory is each end of the growth judged (default 5)")
    ap.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--quiet-every", type=int, default=10,
                    help="minutes between quiet points (also after minute 1 and the last); 0: none")
    ap.add_argument("--quiet-s", type=float, default=45.0,
                    help="seconds a quiet point waits idle after every request ended")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.pipelines = args.pipelines.split(",")
    # SIGTERM stops the run like Ctrl-C: the finally blocks below stop both servers
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = Path(tempfile.mkdtemp(prefix="omni-soak-"))
    print(f"logs in {work}; {args.clients} clients for {args.minutes} x {args.interval_s:g} s "
          f"over {', '.join(args.pipelines)}", flush=True)
    server = TritonProcess(MODEL_REPOSITORY, log_path=work / "tritonserver.log").start(timeout_s=600)
    try:
        shim = ShimProcess([server.grpc_url], log_path=work / "speech_api.log").start()
        try:
            return asyncio.run(soak(args, server, shim))
        except KeyboardInterrupt:
            return 1
        finally:
            shim.stop()
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
