"""The stub process a model runs in: how it ends, and that it leaves nothing behind.

`exit_after_finalize`: by the time a model's `finalize` runs, the 2.51 stub has already answered
the server's finalize request, and the server only waits for the process to exit. What the stub
does next (tearing down Python, and with it C++ objects whose shared memory is gone) crashed
with SIGSEGV in `Metric::SaveToSharedMemory` at every shutdown, or hung on threads blocked in a
BLS call to a stage that died; so `finalize` ends the process itself.

`start_orphan_guard`: the stub notices a dead parent, but then tears down its C++ state (Python
objects included) from a background thread without the GIL, which can hang: orphaned stubs
(parent pid 1, hundreds of MB each, ignoring SIGTERM) kept their shared-memory regions in
/dev/shm. The guard unlinks the stub's own region and leaves with `os._exit`.

`dump_stacks_on_signal`: STACKS_SIGNAL (SIGUSR2) makes the stub write every thread's stack to its
stderr (the server log) from faulthandler's C handler, which needs no GIL: the supervisor sends it
to the stubs of a start-up that hangs before it kills them, so what held them is on record.

`start_heartbeat`: under the supervisor (which sets `OMNI_HEARTBEAT_DIR`), the stub touches the
file `<dir>/<pid>` twice a second from its event loop (or, for a model without one, from a thread
that watches the thread doing its work: `WorkWatch`); the file holds the id of the loop's (or
worker's) thread, whose CPU time the supervisor reads to tell a blocked thread from a starved one
(`omni_backend.stubs.server_stubs.cpu_demand`). A
ping through Triton waits in the model's queue behind every request and so cannot tell a stuck
stub from an overloaded one; a heartbeat that stops while the process lives can. The beat also
stops while the stub's responses have waited STALL_REPORT_S with none leaving (`stalled`, the
response thread's): a loop that ticks while nothing reaches a client is stuck too (it then
touches `<pid>.responses-stalled` instead, so that the supervisor knows the loop itself runs and
waits longer: a response can wait on a busy tritonserver). A batched stage's beat also stops
when one batch has used far more CPU than any before it (`WorkWatch.OVERRUN_FACTOR`): it writes
why into `<pid>.overrun`, and the supervisor need not wait to judge it. Either stall
also has every thread's stack written to the stub's stderr (the server log) once: what held it is
then on record, whether or not it recovers. A stalled loop's stacks come from faulthandler's
watchdog (a C thread, re-armed after every tick by the stall reporter's thread, within a second;
its report starts `Timeout (0:00:10)!`): a Python
thread cannot report a stall while some thread holds the GIL (it reports once the GIL is free, if
ever), and one entry stub's loop stopped for 20 s with nothing on record until it was killed.
"""
from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

SHM_PREFIX = "triton_python_backend_shm_region_"
_started = False
_watching_loop = False
_watch_lock = threading.Lock()   # arming the loop's watchdog against stopping it


def stub_shm_region() -> str | None:
    """This stub's shared-memory region name (its second argument), if it is a Triton stub."""
    try:
        argv = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for arg in argv[1:3]:
        name = arg.decode(errors="replace")
        if name.startswith(SHM_PREFIX):
            return name
    return None


def _watch(parent: int, region: str | None, interval_s: float) -> None:
    stop = threading.Event()
    while not stop.wait(interval_s):
        if os.getppid() != parent:
            if region:
                try:
                    os.unlink(f"/dev/shm/{region}")
                except OSError:
                    pass
            os._exit(1)


def start_orphan_guard(interval_s: float = 0.5) -> None:
    """Start the guard once per process (every model calls this in `initialize`)."""
    global _started
    if _started:
        return
    _started = True
    threading.Thread(target=_watch, args=(os.getppid(), stub_shm_region(), interval_s),
                     name="orphan-guard", daemon=True).start()


STACKS_SIGNAL = signal.SIGUSR2


def dump_stacks_on_signal() -> None:
    """From now on STACKS_SIGNAL writes every thread's stack to stderr (the process goes on)."""
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


HEARTBEAT_ENV = "OMNI_HEARTBEAT_DIR"
EVENT_LOOP = "event loop"   # what the heartbeat file says beats, for a model with a loop
HEARTBEAT_S = 0.5
STALL_REPORT_S = 10.0   # well under the supervisor's stalled_secs (20 s), over a busy host's hiccups
# beside `<pid>`: touched instead of it while the loop ticks but its responses have stalled
RESPONSES_STALLED_SUFFIX = ".responses-stalled"
# beside `<pid>`: written instead of it, with why, once a batch has run past its budget (WorkWatch)
OVERRUN_SUFFIX = ".overrun"


def thread_schedstat(pid: int, tid: int | str) -> tuple[int, int] | None:
    """Nanoseconds a thread has run, and waited in the run queue for a CPU (the first two fields
    of /proc/<pid>/task/<tid>/schedstat); None when it is gone or the kernel does not say."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


class WorkWatch:
    """The one thread a model without an event loop does its work on (a batched stage's worker),
    as its heartbeat sees it. The beat goes on while that thread waits for work, while it works
    and uses or waits for a CPU, and while a response it sends has waited less than
    STALL_REPORT_S (then `<pid>.responses-stalled` is touched instead, as for a loop's stalled
    responses: a send can wait on a busy tritonserver). It stops while the thread sleeps in the
    middle of its work: a deadlock, or a call that never returns, which a beat from a thread of
    its own would hide (a worker blocked for good was noticed only when pings had failed for
    `unresponsive_secs`, 120 s). A long computation keeps it beating, up to a budget: a batch
    (`run_started` .. `run_ended`) that has run OVERRUN_FACTOR times the CPU time of the longest
    batch before it, and of the costliest request before it times its own size, and at least
    OVERRUN_FLOOR_S, is one that does not end (a loop without end in a codec, a device that
    hangs while its caller spins on it). A stage's first batch has no budget: it may be cold."""
    WAITING, WORKING, SENDING, DONE = "waiting for work", "working", "sending", "done"
    # working, it beats when its thread's run + run-queue time grew by this share of the time
    # since the last look: a thread waiting for the GIL wakes every 5 ms for microseconds
    WORKING_SHARE = 0.05
    # CPU time (the worker thread's run time: a starved host does not count against it) over what
    # a batch before took. Batches of one stage differ by their size and shape (a codec's last
    # window is shorter; a new shape can cost a kernel choice), never by this much.
    OVERRUN_FACTOR = 20.0
    OVERRUN_FLOOR_S = 10.0

    def __init__(self, name: str = "batch worker") -> None:
        self.name = name
        self.thread_id: int | None = None
        self._phase, self._since = self.WAITING, time.monotonic()
        self._seen: tuple[float, int] | None = None   # (when, run + wait ns) at the last look
        self._run: tuple[int, int] | None = None      # (requests, run ns at its start) of the batch in work
        self._longest_ns = 0                          # CPU time of the costliest batch so far
        self._per_request_ns = 0.0                    # ... and of the costliest request
        self.overrun: str | None = None               # why the batch in work is over its budget
        self._clock: int | None = None                # the worker thread's CPU-time clock

    def enter(self, phase: str) -> None:
        """Called by the worker thread as it moves to `phase`."""
        self.thread_id = threading.get_native_id()
        self._phase, self._since = phase, time.monotonic()

    def run_started(self, requests: int) -> None:
        """Called by the worker thread as it starts computing a batch of `requests`."""
        if self._clock is None:   # the worker's thread is the stage's for its life
            self._clock = time.pthread_getcpuclockid(threading.get_ident())
        self.overrun = None
        self._run = (max(1, requests), time.thread_time_ns())

    def run_ended(self) -> None:
        """Called by the worker thread when that batch is done: it sets the budget of the next."""
        run, self._run = self._run, None
        if run is not None:
            used = time.thread_time_ns() - run[1]
            self._longest_ns = max(self._longest_ns, used)
            self._per_request_ns = max(self._per_request_ns, used / run[0])

    def _ran_ns(self) -> int | None:
        """The worker thread's CPU time, exact (its schedstat lags a running thread by a tick, and
        a quick batch by all of it)."""
        try:
            return time.clock_gettime_ns(self._clock) if self._clock is not None else None
        except OSError:
            return None

    def _over_budget(self) -> str | None:
        run = self._run
        if run is None or not self._longest_ns:
            return None
        now = self._ran_ns()
        if now is None:
            return None
        used = now - run[1]
        budget = max(self.OVERRUN_FLOOR_S * 1e9,
                     self.OVERRUN_FACTOR * max(self._longest_ns, self._per_request_ns * run[0]))
        if used <= budget:
            return None
        return (f"its batch of {run[0]} has run {used / 1e9:.1f} s of CPU, over its budget of "
                f"{budget / 1e9:.1f} s (batches before it took at most {self._longest_ns / 1e6:.1f} ms, "
                f"{self._per_request_ns / 1e6:.1f} ms a request): a computation that does not end")

    def beat(self) -> str | None:
        """"beat", "stalled" (its send has waited STALL_REPORT_S), "overrun" (its batch is over
        its budget: `overrun` says why), "done" (the worker ended: so does the heartbeat), or None
        (it sleeps in its work)."""
        phase, since, tid = self._phase, self._since, self.thread_id
        if phase == self.DONE:
            return "done"
        now = time.monotonic()
        if phase == self.SENDING:
            return "beat" if now - since < STALL_REPORT_S else "stalled"
        if phase == self.WAITING or tid is None:
            return "beat"
        if (over := self._over_budget()) is not None:
            self.overrun = over
            return "overrun"
        demand = thread_schedstat(os.getpid(), tid)
        if demand is None:
            return "beat"   # nothing to tell a blocked thread by
        seen, self._seen = self._seen, (now, sum(demand))
        if seen is None or seen[0] < since:
            return "beat"   # the first look at this piece of work
        return "beat" if sum(demand) - seen[1] > self.WORKING_SHARE * (now - seen[0]) * 1e9 else None


def _beat(path: Path) -> None:
    try:
        path.touch()
    except OSError:  # the supervisor's folder went away: nobody is listening
        pass


def start_heartbeat(loop: asyncio.AbstractEventLoop | None = None,
                    stalled: Callable[[], float] | None = None, work: WorkWatch | None = None) -> None:
    """Beat from `loop` (proving the loop runs) or, without one, from a thread of its own, which
    beats while `work` says its worker thread is well; `stalled()` says how long the stub's
    responses have waited with none leaving."""
    folder = os.environ.get(HEARTBEAT_ENV)
    if not folder:
        return
    path = Path(folder) / str(os.getpid())
    responses_path = Path(folder) / f"{os.getpid()}{RESPONSES_STALLED_SUFFIX}"
    _beat(path)
    if loop is not None:
        global _watching_loop
        _watching_loop = True
        responses_stalled = stalled or (lambda: 0.0)

        def name_loop_thread() -> None:   # the first beat says which thread runs the loop
            _name_thread(path, threading.get_native_id(), EVENT_LOOP)

        ticks = [0]   # counted here, read by the stall reporter (which re-arms the watchdog)

        def tick() -> None:
            ticks[0] += 1
            if responses_stalled() < STALL_REPORT_S:
                _beat(path)
            else:   # the loop runs, its responses do not leave: the supervisor waits longer
                _beat(responses_path)
            loop.call_later(HEARTBEAT_S, tick)
        loop.call_soon_threadsafe(name_loop_thread)
        loop.call_soon_threadsafe(tick)
        threading.Thread(target=_report_stalls, args=(loop, responses_stalled, ticks),
                         name="stall-report", daemon=True).start()
        return

    overrun_path = Path(folder) / f"{os.getpid()}{OVERRUN_SUFFIX}"

    def run() -> None:
        named = None
        while True:
            if work is not None and work.thread_id != named:
                named = work.thread_id
                _name_thread(path, named, work.name)
            state = "beat" if work is None else work.beat()
            if state == "beat":
                _beat(path)
            elif state == "stalled":
                _beat(responses_path)
            elif state == "overrun":   # rewritten at every look: its time says it is news
                _write(overrun_path, work.overrun or "")
            elif state == "done":
                return
            threading.Event().wait(HEARTBEAT_S)
    threading.Thread(target=run, name="heartbeat", daemon=True).start()


def _name_thread(path: Path, tid: int, what: str) -> None:
    """Write the beating thread's id and what it runs into the heartbeat file (stubs.beat_thread)."""
    _write(path, f"{tid} {what}")


def _write(path: Path, text: str) -> None:
    """Replace the file whole: the supervisor may read it at any moment."""
    part = path.with_name(path.name + ".part")
    try:
        part.write_text(text)
        os.replace(part, path)
    except OSError:   # the supervisor's folder went away: nobody is listening
        pass


def stop_loop_watch() -> None:
    """The loop stops on purpose (the model is being unloaded): no stall report for it."""
    global _watching_loop
    with _watch_lock:
        _watching_loop = False
        faulthandler.cancel_dump_traceback_later()


def _report_stalls(loop: asyncio.AbstractEventLoop, responses_stalled: Callable[[], float],
                   ticks: list[int]) -> None:
    """Write every thread's stack once per stall of `loop`'s responses; and after each new tick
    of `loop`, re-arm faulthandler's watchdog (STALL_REPORT_S on) for a loop that stops ticking.
    The re-arm happens here, not on the loop: it joins the previous watchdog thread, holding the
    GIL, and a loop that waited there 3.8 s for that thread on a starved host (a private lock
    with no timeout) was judged stuck and its pipeline reloaded."""
    responses_reported = False
    seen = None
    while not loop.is_closed():
        with _watch_lock:
            if _watching_loop and ticks[0] != seen:
                seen = ticks[0]
                faulthandler.dump_traceback_later(STALL_REPORT_S, file=sys.stderr)
        waited = responses_stalled()
        if waited >= STALL_REPORT_S and not responses_reported:
            _dump_stacks(f"responses waited {waited:.1f} s with none leaving")
        responses_reported = waited >= STALL_REPORT_S
        time.sleep(min(1.0, STALL_REPORT_S / 4))


def _dump_stacks(what: str) -> None:
    print(f"omni stub {os.getpid()}: {what}; thread stacks follow", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def exit_after_finalize(code: int = 0) -> None:
    """End the stub now (call last in `finalize`): flush what Python buffered, skip teardown."""
    stop_loop_watch()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
            pass
    os._exit(code)
