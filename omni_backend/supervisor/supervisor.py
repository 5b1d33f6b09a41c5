"""Keep one tritonserver serving: heal a pipeline whose stage died, restart a crashed server,
drain on SIGTERM, and leave no stub process or shared memory behind.

Triton 2.51 neither restarts a decoupled model's dead stub nor reports it: requests fail with
"Stub process ... is not healthy", open streams hang, and every readiness probe still says ready.
So the supervisor watches every stub process (one that exited or was stopped is handled at once;
one whose heartbeat stopped, after 3 s when it is blocked on a host with CPU to spare, else 20 s;
a batched stage whose batch ran far past its budget of CPU time, at once)
and pings each pipeline's entry model once a second (`CONTROL=ping`; the entry asks each of its
stages). A pipeline that stops answering is broken only when the silent model also stopped using
CPU (`_wedged`): under overload pings wait behind real work, and reloading models under heavy
load is itself risky in 2.51 (a SIGSEGV in `TRITONBACKEND_ModelInstanceFinalize` was seen when a
pipeline was reloaded at a load average of 39 on 2 cores). A broken pipeline is reloaded through
Triton's model-control API: the entry ends every open stream with `unavailable:` first and turns
new ones away the same way (it holds), then the pipeline's stages are unloaded and loaded again
and the entry resumes (an entry that failed itself is loaded in place: Triton swaps the new
instance for the old one). While the stages
are unloaded the server is not ready (strict readiness), so load balancers and the speech API
route elsewhere; the other pipelines keep serving. An entry is never unloaded, here
or in a drain (`_heal`, `_shutdown`): an unloaded entry is Triton's "unknown model" to clients.
A stage stub that is alive but stuck is killed before its model is unloaded.
An entry that died or froze with client streams open cannot end them, and 2.51 would keep them
open for ever: then the whole server is restarted instead, which closes them.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field

from omni_backend.glibc_heaps import bound_malloc_retention, freeze_loaded_objects, release_free_memory_every
from omni_backend.stubs import server_stubs as stubs
from omni_backend.stubs import stub_process
from omni_backend.stubs.unhealthy_stub import kill_unhealthy_stub
from omni_backend.supervisor import server_binary, server_output
from omni_backend.supervisor.cpu_pressure import CpuPressure
from omni_backend.supervisor.options import SHUTDOWN_CONTROL_SECS, SupervisorOptions
from omni_backend.supervisor.triton_control import PingFailed, Pipeline, TritonControl

log = logging.getLogger("omni.supervisor")
PR_SET_PDEATHSIG = 1
TICK_S = 0.25        # how often stub processes are checked for life
EXIT_POLL_S = 0.05   # how often tritonserver's exit status is looked for
SLOW_BEAT_S = 2.0    # a heartbeat older than this is logged (how starved the stubs are)
# A stale heartbeat means a stuck stub only while some other stub beats this recently: under a
# starved host every beat is late, unevenly (seen: 111 s beside a freshest of 25 s), and a
# reload there only adds work.
FRESH_BEAT_S = 5.0
# The quicker rule (`_blocked`, after `frozen_secs`) asks more of the others: a beat this recent.
PROMPT_BEAT_S = 1.0
# A late stub's threads are sampled from when its beat is this old (`_blocked`'s window).
LATE_BEAT_S = 1.0
# Blocked: its loop's thread (or, where that is not known, all its threads) ran and waited for a
# CPU less than this share of the window (a thread waiting for the GIL wakes every 5 ms for
# microseconds; a blocked stub's helper threads a few times a second).
BLOCKED_DEMAND_SHARE = 0.05
# Spinning: its event loop's thread ran (not waited) at least this share of the window without
# coming back to its loop, on a host with CPU to spare. The project computes off its loops (engine
# threads, executors, batch workers), so a loop step that long is one that does not end; a batch
# worker's long computation is its work, and is never judged by this.
SPINNING_SHARE = 0.5
# ... and its threads together waited for a CPU less than this share: a loop waiting for the GIL
# while its holder waits for a CPU is starved, not stuck.
STARVED_THREADS_SHARE = 0.5
# A stub found stuck writes its threads' stacks to the log (stub_process.STACKS_SIGNAL) this long
# before it is killed.
STACKS_BEFORE_KILL_S = 0.2
# A reloaded pipeline's old stubs normally finish unloading within a second or two. A stage whose
# streams belonged to an entry that was killed never does in 2.51 (nobody takes its responses):
# one was seen alive 25 minutes after its pipeline's reload, keeping its memory.
OLD_STUB_GRACE_S = 15.0
# Before a restart for an entry's lost streams, the other pipelines' entries have this long to end
# theirs with a coded error: the lost ones end only when the server goes.
LOST_STREAMS_ABORT_S = 1.5


def _what_beats(thread: stubs.BeatThread | None) -> str:
    return f"its {thread.what if thread else stub_process.EVENT_LOOP}"


async def _exit_of(proc: asyncio.subprocess.Process) -> int:
    """tritonserver's exit status, as soon as it is reaped. Not `proc.wait()`: that also waits
    until every process holding its output pipe has closed it, and a process it started can
    outlive it (a stub still starting, an engine's worker): a server that aborted while loading
    then looked alive for ever, and was never restarted."""
    while proc.returncode is None:
        await asyncio.sleep(EXIT_POLL_S)
    return proc.returncode


def _kill_server(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL tritonserver and every stub in its process group (started in a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills tritonserver if the supervisor dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


START_RETRIES = 3   # start-ups killed by a signal before the server was ever ready
# A stub that tritonserver waits to see exit for this long never will (a killed one exits at once,
# one told to stop after its model failed to initialize within a second or two, one unloaded
# once its finalize is done: the old stubs of a heal get as long).
AWAITED_STUB_S = OLD_STUB_GRACE_S


@dataclass
class PipelineState:
    pipeline: Pipeline
    last_ok: float
    stubs: list[stubs.Stub] = field(default_factory=list)   # as loaded: one per model instance
    work_at_ok: float | None = None     # the pipeline's progress metric at the last answer
    last_ping: float = 0.0
    pinging: bool = False
    healing: bool = False


class Supervisor:
    def __init__(self, opts: SupervisorOptions):
        self.opts = opts
        self.proc: asyncio.subprocess.Process | None = None
        self.control: TritonControl | None = None
        self.states: dict[str, PipelineState] = {}
        self.stop_requested = asyncio.Event()
        self.hard_stop = False
        self.known_stubs: dict[int, stubs.Stub] = {}
        self.regions: set[str] = set()
        self.server_started = 0.0   # wall-clock start of the current server (its regions are newer)
        self._start_crashes = 0     # start-ups killed by a signal before any was ready
        self.tasks: set[asyncio.Task] = set()
        self.repository = os.path.realpath(opts.flag("model-repository") or opts.flag("model-store") or ".")
        self.heartbeats = ""   # the folder stubs beat in (stub_process.start_heartbeat), made by run()
        self.starved = False   # every stub's heartbeat was old at the last check
        self.pressure = CpuPressure()
        # pid -> (since, the thread its beat proves (its loop's or worker's), CPU demand then)
        self.late: dict[int, tuple[float, stubs.BeatThread | None, stubs.CpuDemand | None]] = {}
        self.stuck: set[int] = set()   # stubs found stuck by the stub check: killed, not asked
        self.told_late: set[int] = set()   # late stubs whose reprieve was logged (`_not_blocked`)
        self.crashed = False   # the running server said it crashed (server_output): it is being ended

    # -- lifecycle
    async def run(self) -> int:
        self.heartbeats = tempfile.mkdtemp(prefix="omni-heartbeats-")
        # it lives as long as the server: its pings' and probes' freed memory goes back too (its
        # kept memory swung by up to 3 MB, 10 %, between the quiet points of a soak without it)
        bound_malloc_retention()
        freeze_loaded_objects()
        trim = asyncio.ensure_future(release_free_memory_every())
        try:
            return await self._run()
        finally:
            trim.cancel()
            shutil.rmtree(self.heartbeats, ignore_errors=True)

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        self._clean_leftovers()
        backoff = 1.0
        ever_ready = False
        while True:
            started = time.monotonic()
            code, was_ready = await self._serve_once()
            ever_ready = ever_ready or was_ready
            if self.stop_requested.is_set():
                return 0
            if not ever_ready:
                # killed by a signal while loading (2.51 can abort in start-up with a
                # boost::interprocess::lock_exception on a starved host): try again, a few times;
                # an exit status is a repository or flag that never worked: a start-up error
                self._start_crashes += 1
                crashes = self._start_crashes
                if code is not None and code < 0 and crashes <= START_RETRIES:
                    log.error("tritonserver died (signal %d) before it was ready; starting it again (%d of %d)",
                              -code, crashes, START_RETRIES)
                    try:
                        await asyncio.wait_for(self.stop_requested.wait(), 1.0)
                        return 0
                    except asyncio.TimeoutError:
                        continue
                log.error("tritonserver exited with %s before it was ready; not restarting", code)
                return code or 1
            log.error("tritonserver exited with %s; %s", code,
                      "restarting" if self.opts.restart else "restart is off")
            if not self.opts.restart:
                return code or 1
            if time.monotonic() - started > 60:
                backoff = 1.0
            try:
                await asyncio.wait_for(self.stop_requested.wait(), backoff)
                return 0
            except asyncio.TimeoutError:
                backoff = min(backoff * 2, 30.0)

    def _on_signal(self, sig: int) -> None:
        if self.stop_requested.is_set():
            log.warning("second %s: stopping tritonserver now", signal.Signals(sig).name)
            self.hard_stop = True
        else:
            log.info("%s: draining, then stopping", signal.Signals(sig).name)
        self.stop_requested.set()

    async def _serve_once(self) -> tuple[int | None, bool]:
        """Start tritonserver, watch it until it exits or a stop is asked; (exit code, was ready)."""
        for beat in os.listdir(self.heartbeats):   # a new server: its stubs beat anew
            os.unlink(os.path.join(self.heartbeats, beat))
        self.late, self.stuck, self.told_late = {}, set(), set()
        self.awaited_since: dict[int, float] = {}   # stub pid: since when tritonserver waits for its exit
        self.awaited_read_at = 0.0
        argv = server_binary.command(self.opts.server_args)
        env = {**server_binary.server_env(), stub_process.HEARTBEAT_ENV: self.heartbeats}
        self.server_started = time.time()
        self.proc = await asyncio.create_subprocess_exec(
            *argv, env=env, start_new_session=True, preexec_fn=_die_with_parent,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        proc = self.proc
        self.crashed = False
        loading = server_output.Loading()
        output = asyncio.ensure_future(server_output.forward(
            proc.stdout, lambda line: self._spawn(self._end_crashed(proc, line)), loading=loading))
        self.control = TritonControl(self.opts.grpc_url, self.opts.metrics_url)
        self.states.clear()
        was_ready = False
        exited = asyncio.ensure_future(_exit_of(self.proc))
        stop = asyncio.ensure_future(self.stop_requested.wait())
        start_deadline = time.monotonic() + self.opts.start_timeout_secs
        hung_start_killed = False   # it is started again once it has exited
        try:
            while True:
                done, _ = await asyncio.wait({exited, stop}, timeout=TICK_S)
                if stop in done:
                    await self._shutdown(exited)
                    return self.proc.returncode, was_ready
                if exited in done:
                    return self.proc.returncode, was_ready
                if not was_ready:
                    # stubs started so far are known from the start, so a stop during loading
                    # leaves no process or shared memory behind
                    self._note_stubs()
                    was_ready = await self._became_ready()
                    if was_ready or hung_start_killed or self.crashed:
                        continue
                    if time.monotonic() > start_deadline:
                        hung_start_killed = True
                        await self._end_hung_start(proc, loading.pending)
                    elif stuck := self._stubs_waited_on_for_ever(proc):
                        # a start is simply done again (a model that failed to load would end it)
                        log.error("tritonserver gave up on the stub of %s while loading it and waits for ever "
                                  "for it to exit: starting it again", ", ".join(f"{s.model} (stub {s.pid})" for s in stuck))
                        hung_start_killed = True
                        _kill_server(proc)
                    continue
                if not self.crashed:   # a crashed server's stubs die with it: no heal
                    self._check_stubs()
                    self._probe_all()
                    if loading.pending:   # only a load (a heal's, or one asked for) waits so
                        self._end_waits_on_stubs(proc)
                    else:
                        self.awaited_since.clear()
        finally:
            stop.cancel()
            for task in list(self.tasks):
                task.cancel()
            await self.control.close()
            self._clean_after(self.proc.pid)
            # what it wrote last is passed on; stubs it left may hold the pipe open: not waited for
            try:
                await asyncio.wait_for(asyncio.shield(output), 1.0)
            except Exception:  # noqa: BLE001 - a time-out or a broken pipe: only the log's last lines
                output.cancel()

    async def _end_crashed(self, proc: asyncio.subprocess.Process, line: bytes) -> None:
        """tritonserver said it crashed (server_output): it ends now, by itself or killed."""
        self.crashed = True
        log.error("tritonserver %s; it is restarted (killed if still running in %.0f s)",
                  line.decode(errors="replace").rstrip("."), server_output.FATAL_EXIT_S)
        try:
            await asyncio.wait_for(_exit_of(proc), server_output.FATAL_EXIT_S)
        except asyncio.TimeoutError:
            log.error("tritonserver hung in its crash handler: killing it")
            _kill_server(proc)

    async def _end_hung_start(self, proc: asyncio.subprocess.Process, pending: list[str]) -> None:
        """The server is not ready `start_timeout_secs` after it started: the stubs of the models
        it still loads write their stacks to the log (stub_process.STACKS_SIGNAL), then it is
        killed, and started again like one that crashed."""
        waiting = [s for s in stubs.stubs_of(proc.pid) if s.model in pending]
        described = [f"{s.model} (stub {s.pid}: {stubs.state(s)}, {stubs.cpu_seconds(s.pid):.1f} s CPU)"
                     for s in waiting]
        described += [m for m in pending if m not in {s.model for s in waiting}]
        log.error("tritonserver is not ready %.0f s after it started; still loading: %s; killing it",
                  self.opts.start_timeout_secs, ", ".join(described) or "nothing the log names")
        for stub in waiting:
            try:
                os.kill(stub.pid, stub_process.STACKS_SIGNAL)
            except ProcessLookupError:
                pass
        if waiting:
            await asyncio.sleep(1.0)   # the stacks travel through the output pipe
        _kill_server(proc)

    def _stubs_waited_on_for_ever(self, proc: asyncio.subprocess.Process) -> list[stubs.Stub]:
        """2.51 takes a stub that did not beat for a second while its model initialized (a
        starved host) as dead, sends it a last message and waits for it to exit; but the stub,
        once it runs again, finishes initializing and waits for the next message: the load never
        ends (seen with a stub paused for 4 s while it imported its model, in a start and in a
        heal's reload). The live stubs tritonserver has waited on for `AWAITED_STUB_S` (read once
        a second: a server has hundreds of threads)."""
        now = time.monotonic()
        if now - self.awaited_read_at < 1.0:
            return []
        self.awaited_read_at = now
        awaited = {s.pid: s for s in stubs.awaited_stubs(proc.pid)}
        self.awaited_since = {pid: self.awaited_since.get(pid, now) for pid in awaited}
        return [awaited[pid] for pid, since in self.awaited_since.items() if now - since >= AWAITED_STUB_S]

    def _end_waits_on_stubs(self, proc: asyncio.subprocess.Process) -> None:
        """A stub tritonserver waits on for ever (`_stubs_waited_on_for_ever`) is killed: the
        load it blocks fails, and the heal that started it loads the model again."""
        stuck = self._stubs_waited_on_for_ever(proc)
        if stuck:
            log.error("tritonserver has waited %.0f s for the stub of %s to exit: killing it", AWAITED_STUB_S,
                      ", ".join(f"{s.model} (stub {s.pid})" for s in stuck))
            stubs.kill(stuck)

    async def _became_ready(self) -> bool:
        if not await self.control.ready():
            return False
        try:
            pipelines = await self.control.pipelines()
        except Exception as e:  # noqa: BLE001 - try again on the next tick
            log.warning("reading the repository index failed: %s", e)
            return False
        now = time.monotonic()
        self.states = {name: PipelineState(p, now) for name, p in pipelines.items()}
        for state in self.states.values():
            self._record_stubs(state)
        log.info("tritonserver ready (pid %d); watching %s", self.proc.pid, ", ".join(sorted(self.states)) or "nothing")
        for state in self.states.values():
            self._heal_if_stub_missing(state)
        return True

    # -- health
    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _note_stubs(self) -> None:
        """Every stub of the running server, for the clean-up after it (_clean_after)."""
        for stub in stubs.stubs_of(self.proc.pid):
            self.known_stubs[stub.pid] = stub
            if stub.region:
                self.regions.add(stub.region)

    def _record_stubs(self, state: PipelineState, old: set[int] = frozenset()) -> None:
        """The pipeline's stubs, leaving out `old` ones (still unloading beside the reloaded ones)."""
        state.stubs = [s for s in stubs.stubs_of(self.proc.pid)
                       if s.model in state.pipeline.models and s.pid not in old]
        for stub in state.stubs:
            self.known_stubs[stub.pid] = stub
            if stub.region:
                self.regions.add(stub.region)

    def _heal_if_stub_missing(self, state: PipelineState) -> None:
        """A model of the pipeline with no living stub when its stubs were recorded: its stub died
        between Triton calling it ready and the recording, so the stub check would never see it."""
        if self.proc is None or self.proc.returncode is not None:
            return   # the server itself is gone: it is restarted, not its pipelines
        missing = [m for m in state.pipeline.models if not any(s.model == m for s in state.stubs)]
        if missing:
            self._start_heal(state, PingFailed(f"unavailable: {missing[0]}: its stub process exited", missing[0]))

    def _check_stubs(self) -> None:
        """A stub that exited, was stopped, or whose heartbeat stopped is noticed here (Triton
        would only notice a dead one when a request reaches it, and would still call it ready).
        A heartbeat is stuck only next to others that beat on time (FRESH_BEAT_S): when every
        stub's beat is late, the host is starved (all stubs were seen 33 s behind together, and
        111 s beside a freshest 25 s, under overload), and reloading would only add work."""
        now = time.monotonic()
        self.pressure.sample(now)
        watched = [(state, stub, stubs.heartbeat_age(self.heartbeats, stub))
                   for state in self.states.values() if not state.healing for stub in state.stubs]
        ages = [age for _, _, age in watched if age is not None]
        freshest = min(ages, default=0.0)
        self._note_late(watched, now)
        if freshest > self.opts.stalled_secs and not self.starved:
            log.warning("every stub's heartbeat is at least %.1f s old: the host is starved, not a stage", freshest)
        self.starved = freshest > self.opts.stalled_secs
        failed: set[str] = set()
        slowest: tuple[float, str] = (0.0, "")
        for state, stub, age in watched:
            if state.pipeline.name in failed:
                continue
            if not stubs.alive(stub):
                why = "exited"
            elif stubs.stopped(stub):
                why = "is stopped"
            elif age is not None and age > stub_process.HEARTBEAT_S \
                    and (over := stubs.overrun(self.heartbeats, stub, age)):
                # written instead of a beat, so never fresher than one period; said after its last
                # beat, in its own CPU time: no starved host explains it
                why = f"has not run {self._beating(stub)} for {age:.1f} s: {over}"
                self._found_stuck(stub)
            elif age is not None and age > self.opts.stalled_secs and freshest <= FRESH_BEAT_S:
                why = f"has not run {self._beating(stub)} for {age:.1f} s (others beat {freshest:.1f} s ago)"
            elif age is not None and age > self.opts.frozen_secs and freshest <= PROMPT_BEAT_S \
                    and (blocked := self._blocked(stub, age, now)):
                why = f"has not run {self._beating(stub)} for {age:.1f} s, {blocked}"
                self._found_stuck(stub)
            else:
                if age is not None and age > slowest[0]:
                    slowest = (age, f"{stub.model} (pid {stub.pid})")
                continue
            self._start_heal(state, PingFailed(f"unavailable: {stub.model}: its stub process {stub.pid} {why}",
                                               stub.model))
            failed.add(state.pipeline.name)
        if slowest[0] > SLOW_BEAT_S:   # how starved the stubs are, one line a tick
            log.warning("slowest heartbeat: %s, %.1f s old (freshest %.1f s)", slowest[1], slowest[0], freshest)

    def _note_late(self, watched: list, now: float) -> None:
        """Sample the CPU demand of each stub whose beat just went late (`_blocked`'s baseline)."""
        late = {}
        for _, stub, age in watched:
            if age is not None and age > LATE_BEAT_S:
                if stub.pid in self.late:
                    late[stub.pid] = self.late[stub.pid]
                else:
                    thread = stubs.beat_thread(self.heartbeats, stub)
                    late[stub.pid] = (now, thread, stubs.cpu_demand(stub.pid, thread and thread.tid))
        self.late = late
        self.told_late &= late.keys()

    def _blocked(self, stub: stubs.Stub, age: float, now: float) -> str | None:
        """Why a stub whose loop has not run for `age` s is stuck already, or None. Blocked: the
        thread that runs its event loop neither ran nor waited for a CPU since its beat went late
        (a deadlock, a loop blocked on a lock or a call that never returns, or waiting for a GIL
        that another thread holds without end), and the stub's threads were not starved. Spinning:
        on a host with CPU to spare, its loop's thread ran most of the window (a step that does not
        end: SPINNING_SHARE). A starved loop waits for a CPU; a busy one on a starved host uses one
        as a starved step would; a loop waiting for the GIL whose holder waits for a CPU sleeps,
        but its threads are starved: those are left to the `stalled_secs` rule. So is a loop that
        runs while its responses do not leave (they can wait on a busy tritonserver). On a starved host a loop may also sleep on
        tritonserver (a `Metric.set`), so there it is stuck only when it waits, with no timeout,
        on nothing outside its own process (`stubs.thread_wait`: a lock or event of its own, a
        sleep), while none of its other threads runs or waits for a CPU (one may hold that lock).
        Where the loop's thread is not known, the host must have CPU to spare and none of
        the stub's threads may have run or waited. A batched stage beats while its worker thread
        waits for work or works (stub_process.WorkWatch): the same rules judge that thread, but
        for spinning (a long batch is its work)."""
        since, thread, demand0 = self.late.get(stub.pid, (now, None, None))
        tid = thread.tid if thread else None
        runs = _what_beats(thread)
        window = now - since
        if demand0 is None or window < self.opts.frozen_secs - LATE_BEAT_S - TICK_S:
            return None
        if stubs.responses_stalled(self.heartbeats, stub, age):
            return self._not_blocked(stub, age, f"{runs} runs but its responses do not leave")
        starved = self.pressure.starved(now - age)
        if starved and (demand0.loop_s is None or tid is None):
            return self._not_blocked(stub, age, self._starved_host(now - age))
        demand = stubs.cpu_demand(stub.pid, tid)
        if demand is None:
            return self._not_blocked(stub, age, "its threads cannot be read")
        total = demand.total_s - demand0.total_s
        if demand0.loop_s is None or demand.loop_s is None:
            if total > BLOCKED_DEMAND_SHARE * window:
                return self._not_blocked(stub, age, f"it ran or waited for a CPU ({total:.2f} s in {window:.1f} s)")
            return (f"and none of its threads ran or waited for a CPU in the last {window:.1f} s "
                    f"({total * 1000:.0f} ms), with CPU to spare")
        loop = demand.loop_s - demand0.loop_s
        waited = demand.waited_s - demand0.waited_s
        if loop > BLOCKED_DEMAND_SHARE * window:
            ran = (demand.loop_ran_s or 0.0) - (demand0.loop_ran_s or 0.0)
            if thread and thread.what == stub_process.EVENT_LOOP and not starved and ran > SPINNING_SHARE * window:
                return (f"and {runs}'s thread ran {ran:.2f} s of the last {window:.1f} s without coming back to "
                        f"its loop (a step that does not end), with CPU to spare")
            return self._not_blocked(stub, age, f"{runs}'s thread ran or waited for a CPU ({loop:.2f} s in "
                                                f"{window:.1f} s)")
        if waited > STARVED_THREADS_SHARE * window:
            return self._not_blocked(stub, age, f"its threads waited for a CPU ({waited:.2f} s in {window:.1f} s)")
        wait = stubs.thread_wait(stub.pid, tid)
        if starved and not (wait and wait.own):
            return self._not_blocked(stub, age, f"{self._starved_host(now - age)} and {runs}'s thread waits in "
                                                f"{wait.what if wait else 'what cannot be read'}")
        if starved and (busy := stubs.runnable_threads(stub.pid, tid)):
            # its lock may be held by one of them, waiting for a CPU (seen: a loop re-arming
            # faulthandler's watchdog waited 3.8 s on its starved thread); asked again next check
            return self._not_blocked(stub, age, f"{self._starved_host(now - age)} and {busy} of its other threads "
                                                f"run or wait for a CPU")
        return (f"and {runs}'s thread neither ran nor waited for a CPU in the last {window:.1f} s "
                f"({loop * 1000:.0f} ms; its other threads ran {total - loop:.2f} s)"
                + (f", waiting in {wait.what}" if wait else "")
                + (" (the host is starved, but nothing outside the stub holds it)" if starved else
                   ", with CPU to spare"))

    def _beating(self, stub: stubs.Stub) -> str:
        """What the stub's heartbeat proves runs: its event loop, or its batch worker."""
        return _what_beats(stubs.beat_thread(self.heartbeats, stub))

    def _starved_host(self, since: float) -> str:
        share = self.pressure.waiting_share(since)
        return "the host is starved" + ("" if share is None else f" (some task waited for a CPU {share:.0%} of the time)")

    def _not_blocked(self, stub: stubs.Stub, age: float, why: str) -> None:
        """Say once per late spell why a late stub is left to the `stalled_secs` rule."""
        if stub.pid not in self.told_late:
            self.told_late.add(stub.pid)
            log.info("%s (pid %d) has not run %s for %.1f s, but %s: not stuck yet",
                     stub.model, stub.pid, self._beating(stub), age, why)
        return None

    def _found_stuck(self, stub: stubs.Stub) -> None:
        """A stub found stuck writes its threads' stacks to the log (from faulthandler's C handler:
        no GIL needed), once (with healing off it is found again at every check), and is killed
        rather than asked to end its streams."""
        if stub.pid in self.stuck:
            return
        self.stuck.add(stub.pid)
        try:
            os.kill(stub.pid, stub_process.STACKS_SIGNAL)
        except ProcessLookupError:
            pass

    def _start_heal(self, state: PipelineState, failure: PingFailed) -> None:
        if self.opts.heal and not self.stop_requested.is_set():
            state.healing = True
            self._spawn(self._heal(state, failure))
        elif not state.healing:
            log.warning("%s is not serving (%s); healing is off", state.pipeline.name, failure)

    def _probe_all(self) -> None:
        now = time.monotonic()
        for state in self.states.values():
            if not state.pinging and not state.healing and now - state.last_ping >= self.opts.probe_interval_secs:
                state.pinging, state.last_ping = True, now
                self._spawn(self._probe(state))

    async def _probe(self, state: PipelineState) -> None:
        loop = asyncio.get_running_loop()
        called_at = stubs.since_boot()
        try:
            await self.control.ping(state.pipeline, self.opts.ping_timeout_secs)
            self._answered(state, await loop.run_in_executor(None, self.control.progress))
        except PingFailed as failure:
            # Triton gave up on a stub ("not healthy": the entry's, or a stage's the entry relays)
            # and freed the call: the stub must not run again to take it
            # (omni_backend/stubs/unhealthy_stub.py)
            model = failure.model or state.pipeline.name
            killed = kill_unhealthy_stub(str(failure), model, called_at, self.proc.pid)
            if killed and not state.healing:
                log.error("%s: killed the stub %s of %s, which Triton answered not healthy",
                          state.pipeline.name, ", ".join(str(s.pid) for s in killed), model)
                self._start_heal(state, PingFailed(f"unavailable: {state.pipeline.name}: its stub was not healthy",
                                                   state.pipeline.name))
                return
            work = await loop.run_in_executor(None, self.control.progress)
            if not state.healing and self._wedged(state, failure, work):
                self._start_heal(state, failure)
        finally:
            state.pinging = False

    def _answered(self, state: PipelineState, work: dict[str, float] | None) -> None:
        state.last_ok = time.monotonic()
        state.work_at_ok = None if work is None else work.get(state.pipeline.name, 0.0)

    def _wedged(self, state: PipelineState, failure: PingFailed, work: dict[str, float] | None) -> bool:
        """Whether a pipeline that did not answer its ping is broken, not just slow. (A stub that
        exited, was stopped or stopped beating is seen by the stub check first.) Under overload a
        ping waits in Triton's queue behind every request, like the clients do, and can take many
        seconds: a pipeline that still finishes requests or sends audio is slow, never broken; one
        that answers nothing and does nothing for `unresponsive_secs` is stuck (say, in Triton's
        IPC, where its stubs' event loops still beat)."""
        silent_s = time.monotonic() - state.last_ok
        done = None if work is None else work.get(state.pipeline.name, 0.0)
        if done is not None and state.work_at_ok is not None and done > state.work_at_ok:
            if silent_s > self.opts.stalled_secs:
                log.warning("%s has not answered a ping for %.0f s but is serving: overloaded, not stuck",
                            state.pipeline.name, silent_s)
            self._answered(state, work)
            return False
        return silent_s >= self.opts.unresponsive_secs

    async def _heal(self, state: PipelineState, failure: PingFailed) -> None:
        """Reload the failed pipeline. Its entry is never unloaded (every request that arrives
        meanwhile gets the entry's `unavailable: ... restarting`, never Triton's "unknown model",
        which clients and load balancers take as permanent): when a stage failed, the entry holds
        (ends its streams, turns new ones away) while the stages reload: once they are unloaded
        it resumes, and takes streams again once its stages are loaded (no moment where the
        server is ready and the entry refuses); an entry
        that failed itself (or one of several instances, which a control message may not all
        reach) is loaded in place: Triton loads its new instance beside the old one and swaps."""
        p = state.pipeline
        t0 = time.monotonic()
        reloaded = False
        before = [s for s in stubs.stubs_of(self.proc.pid) if s.model in p.models]
        old = before
        log.error("pipeline %s failed: %s", p.name, failure)
        failed = failure.model or p.name
        why = f"the pipeline is restarting ({failed} failed)"
        try:
            if not self.opts.explicit_models:
                log.error("model control is not explicit: restarting tritonserver instead")
                self.proc.send_signal(signal.SIGTERM)
                return
            if failure.model and failure.model != p.name:
                # a stage that does not answer but still runs (stopped, wedged) would never
                # unload: it goes now. The entry is asked to end its streams first.
                await self._stacks_written(failure.model)
                stubs.kill([s for s in stubs.stubs_of(self.proc.pid) if s.model == failure.model])
            held = await self._end_streams(p, why, hold=failure.model in p.stages)
            if not held and await self._restart_for_lost_streams(p, failed):
                return
            entry_in_place = not held or p.entry_instances > 1
            old = [s for s in before if s.model != p.name or entry_in_place]   # a kept entry's stub is no old one
            log.error("reloading %s%s", ", ".join(p.models if entry_in_place else p.stages),
                      f" ({p.name} holds meanwhile)" if held else "")
            backoff = 1.0
            while not self.stop_requested.is_set():
                try:
                    await self._unload_pipeline_stages(p)
                    if not entry_in_place:
                        try:   # it serves again as soon as its stages are loaded (no window)
                            await self.control.resume(p)
                        except Exception as e:  # noqa: BLE001 - then a new instance replaces it
                            log.warning("%s did not resume (%s): loading it again", p.name, e)
                            entry_in_place, old = True, before
                    await self._load_pipeline_stages(p)
                    if entry_in_place:   # its stages serve by the time its new instance takes requests
                        await self.control.load(p.name)
                    log.info("pipeline %s reloaded in %.1f s", p.name, time.monotonic() - t0)
                    reloaded = True
                    break
                except Exception as e:  # noqa: BLE001 - keep trying: the server is not ready meanwhile
                    if self.stop_requested.is_set():
                        break
                    log.error("reloading %s failed: %s; again in %.0f s", p.name, e, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
        finally:
            self._record_stubs(state, {s.pid for s in old})
            self._answered(state, await asyncio.get_running_loop().run_in_executor(None, self.control.progress))
            state.healing = False
        # only after a reload that ran to its end: a heal cancelled because the server itself
        # exited would find no stubs and heal the next server's pipelines with this one's state
        if reloaded and not self.stop_requested.is_set():
            self._heal_if_stub_missing(state)
            self._spawn(self._kill_old_stubs(p.name, old))

    async def _kill_old_stubs(self, name: str, old: list[stubs.Stub]) -> None:
        """Kill the stubs of a reloaded pipeline's old instances still running OLD_STUB_GRACE_S
        after its reload: they serve nothing now (the new instances answer), and a stuck one
        would keep its memory for as long as the server runs."""
        server = self.proc
        await asyncio.sleep(OLD_STUB_GRACE_S)
        if self.proc is not server or server.returncode is not None or self.stop_requested.is_set():
            return
        left = [s for s in old if stubs.alive(s)]   # the same process: its pid not reused
        if left:
            log.warning("%s: killing %d stub(s) of its old instances still running %.0f s after its reload: %s",
                        name, len(left), OLD_STUB_GRACE_S, ", ".join(f"{s.model} (pid {s.pid})" for s in left))
            stubs.kill(left)

    async def _stacks_written(self, model: str) -> None:
        """Give a stub found stuck (`_found_stuck`) a moment to write its stacks before it is killed."""
        if any(s.pid in self.stuck for s in stubs.stubs_of(self.proc.pid) if s.model == model):
            await asyncio.sleep(STACKS_BEFORE_KILL_S)

    async def _end_streams(self, p: Pipeline, why: str, hold: bool = False) -> bool:
        """Ask the entry to end its open streams with `unavailable: ...`: they hold the entry
        (Triton finalizes a model only after its last stream), and the ones waiting on a dead
        stage never end by themselves; with `hold`, it also turns new streams away until
        `resume` (or a new instance replaces it). False when the entry cannot: its stub exited, or it neither
        answered nor beat and was killed here; its clients' streams are then lost."""
        t0 = time.monotonic()
        for attempt in range(3):
            entry = [s for s in stubs.stubs_of(self.proc.pid) if s.model == p.name]
            if not entry or any(stubs.stopped(s) or s.pid in self.stuck for s in entry):
                # a stopped or stuck stub answers nothing, and killing it loses no more
                await self._stacks_written(p.name)
                stubs.kill(entry)
                return False
            try:
                await (self.control.hold if hold else self.control.abort)(p, why, timeout_s=10.0)
                log.info("%s ended its open streams in %.2f s", p.name, time.monotonic() - t0)
                return True
            except Exception as e:  # noqa: BLE001 - slow (ask again) or stuck (killed below)
                beating = [s for s in entry if (stubs.heartbeat_age(self.heartbeats, s) or 0.0) < self.opts.stalled_secs]
                if beating and attempt < 2:
                    log.warning("%s has not ended its streams yet (%s): asking again", p.name, e)
                    continue
                log.warning("%s did not end its streams (%s): killing it", p.name, e)
                stubs.kill(entry)
                return False
        return False

    async def _restart_for_lost_streams(self, p: Pipeline, failed: str) -> bool:
        """An entry gone with client streams open: Triton 2.51 keeps those gRPC streams open for
        ever (nobody can answer them now), so a reload would leave every such client waiting for
        its own timeout. Restarting tritonserver ends them: the other pipelines are asked to end
        their streams with `unavailable:` first, then the server is killed (its connections
        close) and started again. True when it did (`--supervisor-restart-on-lost-streams`)."""
        if not self.opts.restart_on_lost_streams or not self.opts.restart:
            return False
        loop = asyncio.get_running_loop()
        open_streams = await loop.run_in_executor(None, self.control.active_streams, p.name)
        if open_streams == 0:
            return False   # None: no metrics to tell, so they may be open
        log.error("%s's entry is gone holding %s client stream(s), which Triton 2.51 would keep open "
                  "for ever: restarting tritonserver so that they end", p.name,
                  "unknown" if open_streams is None else f"{open_streams:.0f}")
        self.crashed = True   # no heals or probes of a server that is going
        why = f"the server is restarting ({failed} failed)"
        others = [s.pipeline for s in self.states.values() if s.pipeline.name != p.name]
        await asyncio.gather(*(self.control.abort(q, why, timeout_s=LOST_STREAMS_ABORT_S) for q in others),
                             return_exceptions=True)
        _kill_server(self.proc)
        return True

    async def _unload_pipeline_stages(self, p: Pipeline) -> None:
        """Unload the stages (then `_load_pipeline_stages`): while one is unloaded, strict
        readiness is false and the speech API routes the pipeline elsewhere. (An entry is never
        unloaded: its name would be unknown to clients meanwhile.)"""
        for model in p.stages:
            await self.control.unload(model)
        # No need to wait for the old instances to finish unloading (a model whose stub died
        # never does: its requests keep it): Triton loads the new ones beside them.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            states = await self.control.model_states()
            if not any(states.get(m) == "READY" for m in p.stages):
                break
            await asyncio.sleep(0.05)

    async def _load_pipeline_stages(self, p: Pipeline) -> None:
        # all at once: loaded one after another, the server called itself ready (unloaded models
        # do not count) between one stage's load and the next
        await asyncio.gather(*(self.control.load(model) for model in p.stages))

    # -- shutdown
    async def _shutdown(self, exited: asyncio.Future) -> None:
        t0 = time.monotonic()
        if not self.hard_stop and self.states:
            drains = [self.control.drain(s.pipeline, SHUTDOWN_CONTROL_SECS) for s in self.states.values()]
            await asyncio.gather(*drains, return_exceptions=True)
            deadline = t0 + self.opts.drain_secs
            loop = asyncio.get_running_loop()
            while time.monotonic() < deadline and not self.hard_stop and not exited.done():
                active = await loop.run_in_executor(None, self.control.active_streams)
                if active is not None and active <= 0:
                    break
                await asyncio.sleep(0.2)
            log.info("drained in %.1f s", time.monotonic() - t0)
            aborts = [self.control.abort(s.pipeline, "the server is shutting down", SHUTDOWN_CONTROL_SECS)
                      for s in self.states.values()]
            await asyncio.gather(*aborts, return_exceptions=True)
            if self.opts.explicit_models and not self.hard_stop and not exited.done():
                await self._unload_stages(exited)
        if self.states and not exited.done():
            # Not SIGTERM: tritonserver's own stop unloads the entries while it still takes
            # requests, and every request then hears "unknown model" (NOT_FOUND, permanent to a
            # client) instead of the entries' `unavailable: ... shutting down`. Killed, it closes
            # its connections (gRPC UNAVAILABLE); what it leaves is cleaned up (_clean_after).
            log.info("stopping tritonserver")
        elif not exited.done():   # still starting: nothing is served yet, its own stop is clean
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), 0.1 if self.hard_stop else self.opts.stop_secs)
            except asyncio.TimeoutError:
                log.warning("tritonserver still running after %.1f s: killing it", self.opts.stop_secs)
        if not exited.done():
            _kill_server(self.proc)
            await exited
        log.info("tritonserver stopped in %.1f s", time.monotonic() - t0)

    async def _unload_stages(self, exited: asyncio.Future) -> None:
        """The drained server's stages are unloaded (their instances finalize: engines and worker
        processes stop as they should) while its entries, still loaded, answer every request with
        `unavailable: ... shutting down`; `stop_secs` at most."""
        stages = [m for state in self.states.values() for m in state.pipeline.stages]
        deadline = time.monotonic() + self.opts.stop_secs
        await asyncio.gather(*(self.control.unload(m, timeout_s=self.opts.stop_secs) for m in stages),
                             return_exceptions=True)
        while time.monotonic() < deadline and not exited.done() and not self.hard_stop:
            try:
                states = await self.control.model_states()
            except Exception:  # noqa: BLE001 - a server that no longer answers: it is killed next
                return
            if not any(states.get(m) in ("READY", "UNLOADING") for m in stages):
                return
            await asyncio.sleep(0.1)
        if not exited.done() and not self.hard_stop:
            log.warning("stages still unloading after %.1f s: stopping tritonserver anyway", self.opts.stop_secs)

    # -- leftovers
    def _clean_after(self, server_pid: int) -> None:
        """The server is gone: its stubs go too (a stub whose parent died may hang in its own
        teardown), then the shared memory no one maps any more."""
        try:
            os.killpg(server_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        leftover = [s for pid, s in self.known_stubs.items() if stubs.parse_stub(pid) == s]  # pid not reused
        stubs.kill(leftover)
        deadline = time.monotonic() + 2.0
        while leftover and time.monotonic() < deadline:
            leftover = [s for s in leftover if stubs.parse_stub(s.pid) == s]
            time.sleep(0.05)
        # its stubs' regions, and any other region made while it ran that no process maps now (a
        # stub that was still starting when the server went)
        removed = stubs.remove_stale_regions(names=self.regions)
        removed += stubs.remove_stale_regions(newer_than=self.server_started)
        if removed:
            log.info("removed %d shared-memory regions left by tritonserver", len(removed))
        if leftover:
            log.warning("stub processes %s did not die", [s.pid for s in leftover])
        self.known_stubs.clear()
        self.regions.clear()

    def _clean_leftovers(self) -> None:
        """What an earlier server on this repository left when it was killed: orphaned stubs and
        unmapped shared memory."""
        inside = self.repository + os.sep
        orphans = [s for s in stubs.orphan_stubs() if os.path.realpath(s.model_file).startswith(inside)]
        if orphans:
            log.warning("killing %d orphaned stub processes of %s", len(orphans), self.repository)
            stubs.kill(orphans)
            time.sleep(0.2)
        removed = stubs.remove_stale_regions()
        if removed:
            log.warning("removed %d stale shared-memory regions", len(removed))
