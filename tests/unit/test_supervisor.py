"""The supervisor's pieces that need no server: its command line, how it finds stub processes and
stale shared memory, and how it tells a stuck pipeline from an overloaded one."""
from __future__ import annotations

import asyncio
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
import pytest

from omni_backend.stubs import server_stubs as stubs
from omni_backend.supervisor.cpu_pressure import CpuPressure
from omni_backend.testing import busy_host
from omni_backend.stubs import stub_process
from omni_backend.supervisor.options import UsageError, parse
from omni_backend.supervisor.supervisor import PipelineState, Supervisor
from omni_backend.supervisor.triton_control import PingFailed, Pipeline


def test_options_pass_tritonserver_flags_and_add_what_supervision_needs():
    opts = parse(["--model-repository=/r", "--grpc-port", "9001", "--supervisor-drain-secs=2.5",
                  "--supervisor-heal", "false", "--log-verbose=1"])
    assert opts.drain_secs == 2.5 and opts.heal is False
    assert opts.grpc_url == "localhost:9001"
    assert "--supervisor-drain-secs=2.5" not in opts.server_args
    assert {"--model-control-mode=explicit", "--load-model=*", "--strict-readiness=true",
            "--exit-timeout-secs=3", "--log-verbose=1"} <= set(opts.server_args)
    assert opts.explicit_models and opts.metrics_url == "http://localhost:8002/metrics"
    assert opts.restart_on_lost_streams is True
    assert parse(["--model-repository=/r", "--supervisor-restart-on-lost-streams=false"]).restart_on_lost_streams is False


def test_options_keep_the_users_choices():
    opts = parse(["--model-repository", "/r", "--model-control-mode=none", "--strict-readiness=false",
                  "--allow-metrics=false"])
    assert "--model-control-mode=explicit" not in opts.server_args
    assert "--strict-readiness=true" not in opts.server_args
    assert not opts.explicit_models and opts.metrics_url is None


@pytest.mark.parametrize("argv, message", [
    (["--model-repository=/r", "--supervisor-drainsecs=1"], "--supervisor-drainsecs: unknown flag"),
    (["--model-repository=/r", "--supervisor-drain-secs=0"], "must be > 0"),
    (["--model-repository=/r", "--supervisor-heal=maybe"], "expected true or false"),
    (["--model-repository=/r", "--supervisor-stalled-secs"], "needs a value"),
    (["--model-repository=/r", "--supervisor-frozen-secs=1"], "--supervisor-frozen-secs: at least 2.0"),
    (["--http-port=1"], "--model-repository is required"),
])
def test_options_reject_what_they_do_not_know(argv, message):
    with pytest.raises(UsageError, match=message):
        parse(argv)


def test_a_stub_is_read_from_its_command_line(fake_stub):
    proc, model_file, region = fake_stub
    stub = stubs.parse_stub(proc.pid)
    assert stub == stubs.Stub(proc.pid, "talker", str(model_file), region, "talker_0_0")
    assert stubs.alive(stub) and not stubs.stopped(stub)
    assert stub in stubs.stubs_of(os.getpid())
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(0.1)
    assert stubs.stopped(stub)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not stubs.alive(stub)
    assert stubs.parse_stub(os.getpid()) is None


def test_only_unmapped_old_regions_are_removed():
    mapped = stubs.SHM_DIR / f"{stubs.SHM_PREFIX}{uuid.uuid4()}"
    stale = stubs.SHM_DIR / f"{stubs.SHM_PREFIX}{uuid.uuid4()}"
    young = stubs.SHM_DIR / f"{stubs.SHM_PREFIX}{uuid.uuid4()}"
    for path in (mapped, stale, young):
        path.write_bytes(b"\0" * 4096)
    old = time.time() - 60
    for path in (mapped, stale):
        os.utime(path, (old, old))
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096) as _:
        try:
            removed = stubs.remove_stale_regions(min_age_s=10)
            assert stale.name in removed and not stale.exists()
            assert mapped.exists() and young.exists()
            assert stubs.remove_stale_regions(names={young.name}) == [young.name]
        finally:
            for path in (mapped, stale, young):
                path.unlink(missing_ok=True)


def test_a_region_made_or_mapped_while_the_mappings_are_read_is_kept(monkeypatch):
    """A server stopping while another starts: the starting server's new region, unmapped for a
    moment, is neither one that existed before the mappings were read nor unmapped a second time."""
    made_during = stubs.SHM_DIR / f"{stubs.SHM_PREFIX}{uuid.uuid4()}"
    mapped_late = stubs.SHM_DIR / f"{stubs.SHM_PREFIX}{uuid.uuid4()}"
    stale = stubs.SHM_DIR / f"{stubs.SHM_PREFIX}{uuid.uuid4()}"
    for path in (mapped_late, stale):
        path.write_bytes(b"\0" * 4096)
    reads = []
    real = stubs.mapped_regions

    def mapped_regions():
        reads.append(1)
        if len(reads) == 1:   # the first read: a region appears; another is mapped only after it
            made_during.write_bytes(b"\0" * 4096)
            return real() - {mapped_late.name}
        return real() | {mapped_late.name}

    monkeypatch.setattr(stubs, "mapped_regions", mapped_regions)
    try:
        ours = {made_during.name, mapped_late.name, stale.name}   # not another server's on this host
        removed = stubs.remove_stale_regions(names=ours, newer_than=time.time() - 60)
        assert removed == [stale.name] and not stale.exists()
        assert made_during.exists() and mapped_late.exists() and len(reads) == 2
    finally:
        for path in (made_during, mapped_late, stale):
            path.unlink(missing_ok=True)


def _loop(tid: int) -> stubs.BeatThread:
    return stubs.BeatThread(tid, "event loop")


def _supervisor(**opts) -> Supervisor:
    return Supervisor(parse(["--model-repository=/r", *[f"--supervisor-{k}={v}" for k, v in opts.items()]]))


def test_a_silent_pipeline_that_still_serves_is_overloaded_not_stuck():
    sup = _supervisor(**{"unresponsive-secs": 30})
    state = PipelineState(Pipeline("p", ["p__talker"]), last_ok=time.monotonic() - 20, work_at_ok=10.0)
    failure = PingFailed("unavailable: p__talker: no answer in 2.5 s", "p__talker")
    assert not sup._wedged(state, failure, {"p": 12.5})           # audio went out: busy
    assert state.work_at_ok == 12.5 and time.monotonic() - state.last_ok < 0.5
    state.last_ok = time.monotonic() - 20
    assert not sup._wedged(state, failure, {"p": 12.5})           # quiet, but not for long enough
    state.last_ok = time.monotonic() - 31
    assert sup._wedged(state, failure, {"p": 12.5})               # silent and idle too long: stuck
    state.last_ok = time.monotonic() - 31
    assert sup._wedged(state, failure, None)                      # no metrics to say otherwise


def test_a_stub_that_exits_stops_or_stops_beating_is_healed_at_once(fake_stub, tmp_path):
    proc, model_file, region = fake_stub
    # a second stub of the same pipeline whose heartbeat the first is compared with
    other_proc = subprocess.Popen([str(tmp_path / stubs.STUB_NAME), str(tmp_path / "repo" / "code2wav" / "1" / "model.py"),
                                   f"{stubs.SHM_PREFIX}{uuid.uuid4()}"])
    time.sleep(0.2)
    try:
        stub, other = stubs.parse_stub(proc.pid), stubs.parse_stub(other_proc.pid)
        sup = _supervisor(**{"stalled-secs": 2})
        sup.heartbeats = str(tmp_path)
        state = PipelineState(Pipeline("p", ["talker", "code2wav"]), last_ok=time.monotonic(), stubs=[stub, other])
        sup.states = {"p": state}
        healed: list[str] = []
        sup._start_heal = lambda st, failure: healed.append(str(failure))
        beat, other_beat = Path(sup.heartbeats) / str(proc.pid), Path(sup.heartbeats) / str(other_proc.pid)
        beat.touch()
        other_beat.touch()
        sup._check_stubs()
        assert healed == []                                           # alive and beating
        for path in (beat, other_beat):                               # the whole host starved: no heal
            os.utime(path, (time.time() - 30, time.time() - 30))
        sup._check_stubs()
        assert healed == [] and sup.starved
        os.utime(other_beat, (time.time() - 25, time.time() - 25))   # starved unevenly: still no heal
        sup._check_stubs()
        assert healed == []
        other_beat.touch()                                            # one stub stuck beside a live one
        sup._check_stubs()
        assert healed and "has not run its event loop for 30" in healed[-1] and not sup.starved
        overrun = Path(sup.heartbeats) / f"{proc.pid}{stub_process.OVERRUN_SUFFIX}"
        overrun.write_text("its batch of 1 has run 10.5 s of CPU, over its budget of 10.0 s")
        os.utime(overrun, (time.time() - 1, time.time() - 1))         # said before its last beat: old news
        beat.touch()
        del healed[:]
        sup._found_stuck = lambda stub: None                          # its stacks: SIGUSR2 would end this fake
        sup._check_stubs()
        assert healed == []
        for path in (beat, other_beat):                               # said after it: at once, starved or not
            os.utime(path, (time.time() - 30, time.time() - 30))
        overrun.touch()
        sup._check_stubs()
        assert len(healed) == 1 and healed[0].startswith(f"unavailable: talker: its stub process {proc.pid} has not run")
        assert healed[0].endswith(": its batch of 1 has run 10.5 s of CPU, over its budget of 10.0 s")
        other_beat.touch()
        beat.touch()
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.1)
        sup._check_stubs()
        assert "is stopped" in healed[-1]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        sup._check_stubs()
        assert healed[-1] == f"unavailable: talker: its stub process {proc.pid} exited"
    finally:
        other_proc.kill()
        other_proc.wait()


def _psi(path: Path, waited_us: int) -> None:
    path.write_text(f"some avg10=0.00 avg60=0.00 avg300=0.00 total={waited_us}\n"
                    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


def test_cpu_pressure_is_the_share_of_a_window_some_task_waited(tmp_path):
    psi = tmp_path / "cpu"
    _psi(psi, 1_000_000)
    pressure = CpuPressure(str(psi))
    assert pressure.has_psi and pressure.waiting_share(0.0) is None and pressure.starved(0.0)
    for t, waited_us in ((100.0, 1_000_000), (102.0, 1_200_000), (104.0, 3_200_000)):
        _psi(psi, waited_us)
        pressure.sample(t)
    assert pressure.waiting_share(100.0) == pytest.approx(0.1 * 2 / 4 + 1.0 * 2 / 4)
    assert pressure.waiting_share(101.0) == pytest.approx(0.55)   # from the sample before it
    assert pressure.waiting_share(102.0) == pytest.approx(1.0) and pressure.starved(102.0)
    neither = CpuPressure(str(tmp_path / "absent"), stat_path=str(tmp_path / "absent"))
    assert not neither.has_psi and neither.source == "load average"
    assert neither.starved(0.0) == (os.getloadavg()[0] >= len(os.sched_getaffinity(0)))


def test_without_psi_the_run_queue_tells_how_long_some_task_waited(tmp_path):
    stat = tmp_path / "stat"
    cores = len(os.sched_getaffinity(0))
    stat.write_text(f"cpu  1 2 3 4\nprocs_running {cores}\nprocs_blocked 0\n")
    pressure = CpuPressure(str(tmp_path / "absent"), stat_path=str(stat))
    assert not pressure.has_psi and pressure.source == "run queue"
    for t, running in ((100.0, cores), (101.0, cores), (102.0, cores + 1), (103.0, cores + 5), (104.0, 1)):
        stat.write_text(f"procs_running {running}\n")
        pressure.sample(t)
    # each sample over the cores counts the second before it as waited
    assert pressure.waiting_share(100.0) == pytest.approx(2 / 4)
    assert pressure.waiting_share(101.0) == pytest.approx(2 / 3) and pressure.starved(101.0)
    assert pressure.waiting_share(103.0) == pytest.approx(0.0) and not pressure.starved(103.0)


@pytest.mark.serial   # loads every core on purpose: alone, after the parallel pass
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc/stat")
def test_without_psi_a_host_full_of_busy_processes_is_starved_at_once():
    """The run queue shows a host that has just become starved within a second (the 1-minute
    load average would take most of a minute)."""
    pressure = CpuPressure("/nonexistent/psi")
    assert pressure.source == "run queue"
    with busy_host.starved(per_core=3):   # every task waits about two thirds of the time
        time.sleep(0.5)
        start = time.monotonic()
        while time.monotonic() - start < 1.5:
            pressure.sample(time.monotonic())
            time.sleep(0.05)
        assert pressure.starved(start), pressure.waiting_share(start)


def test_a_late_stub_is_blocked_only_when_it_wanted_no_cpu_on_a_host_with_cpu_to_spare(fake_stub, tmp_path, monkeypatch):
    proc, _, _ = fake_stub
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sup = _supervisor()
        sup.heartbeats = str(tmp_path)
        psi = tmp_path / "cpu"
        _psi(psi, 0)
        sup.pressure = CpuPressure(str(psi))
        now = time.monotonic()
        sup.pressure.sample(now - 3.5)
        _psi(psi, 100_000)                      # some task waited 0.1 s of the last 3.5 s: quiet
        sup.pressure.sample(now)
        blocked, busy = stubs.parse_stub(proc.pid), stubs.Stub(spinner.pid, "m", "", None)
        sup.late = {s.pid: (now - 2.5, None, stubs.cpu_demand(s.pid)) for s in (blocked, busy)}
        time.sleep(0.5)
        now = time.monotonic()
        why = sup._blocked(blocked, 3.2, now)
        assert why and "none of its threads ran or waited for a CPU" in why
        signals: list[int] = []
        with monkeypatch.context() as m:
            m.setattr(os, "kill", lambda pid, sig: signals.append(sig))
            sup._found_stuck(blocked)
            sup._found_stuck(blocked)                           # found again (healing off): once
        assert signals == [stub_process.STACKS_SIGNAL] and blocked.pid in sup.stuck
        assert sup._blocked(busy, 3.2, now) is None             # it runs: busy, or spinning
        sup.late[blocked.pid] = (now - 1.0, *sup.late[blocked.pid][1:])
        assert sup._blocked(blocked, 3.2, now) is None          # not watched long enough yet
        sup.late[blocked.pid] = (now - 2.5, *sup.late[blocked.pid][1:])
        marker = tmp_path / f"{proc.pid}{stub_process.RESPONSES_STALLED_SUFFIX}"
        marker.touch()                                          # its loop runs; responses stalled
        assert sup._blocked(blocked, 3.2, now) is None
        marker.unlink()
        _psi(psi, 3_000_000)                                    # the host starved: it may wait on it
        sup.pressure.sample(now)
        assert sup._blocked(blocked, 3.2, now) is None
    finally:
        spinner.kill()
        spinner.wait()


# A process like a stub with an event loop: its "loop" thread blocks (as on a deadlock) or spins
# (a long computation on the loop), while another thread holds the GIL without end (a regular
# expression that backtracks for ever) or sleeps; it prints the loop thread's id.
_LOOP_PROCESS = """
import re, sys, threading, time
mode = sys.argv[1]
lock = threading.Lock()
if mode == 'lock-held':   # by the main thread, which then computes
    lock.acquire()
def loop():
    print(threading.get_native_id(), flush=True)
    if mode == 'lock-held':
        lock.acquire()
    if mode == 'spinning-loop':
        while True: pass
    if mode == 'gil-wait':   # it wants the GIL back after each sleep; the hog never lets it go
        while True: time.sleep(0.001)
    if mode == 'shared-wait':
        import multiprocessing
        multiprocessing.Semaphore(0).acquire()   # a semaphore other processes could post
    threading.Event().wait()
threading.Thread(target=loop).start()
time.sleep(0.3)
if mode in ('gil-hog', 'gil-wait'):
    re.fullmatch(r'(a+)+b', 'a' * 64)
if mode == 'lock-held':
    while True: pass
threading.Event().wait()
"""


def _loop_process(mode: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", _LOOP_PROCESS, mode], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def _host(sup: Supervisor, tmp_path: Path, now: float, waited_us: int) -> None:
    """The supervisor's PSI reads that some task waited `waited_us` of the last 3.5 s."""
    psi = tmp_path / "cpu"
    _psi(psi, 0)
    sup.pressure = CpuPressure(str(psi))
    sup.pressure.sample(now - 3.5)
    _psi(psi, waited_us)
    sup.pressure.sample(now)


def _quiet_host(sup: Supervisor, tmp_path: Path, now: float) -> None:
    _host(sup, tmp_path, now, 100_000)


def test_a_loop_held_by_a_thread_that_keeps_the_gil_is_blocked_though_the_stub_is_busy(tmp_path):
    """The loop's thread waits for the GIL (or a lock) while another thread runs: the stub uses
    a CPU, but its loop does not, and never will."""
    hog, hog_loop = _loop_process("gil-hog")
    try:
        sup = _supervisor()
        sup.heartbeats = str(tmp_path)
        time.sleep(0.5)                                  # the hog is in its regular expression
        now = time.monotonic()
        _quiet_host(sup, tmp_path, now)
        held = stubs.Stub(hog.pid, "m", "", None)
        sup.late = {held.pid: (now - 2.5, _loop(hog_loop), stubs.cpu_demand(hog.pid, hog_loop))}
        time.sleep(1.0)
        now = time.monotonic()
        why = sup._blocked(held, 3.2, now)
        assert why and "its event loop's thread neither ran nor waited for a CPU" in why, why
        ran = float(why.split("its other threads ran ")[1].split(" s")[0])
        assert ran > 0.3                                 # the hog ran all along (the host is not idle)
        # the same stub seen as a whole (its loop thread not known) is busy, not blocked
        sup.late[held.pid] = (now - 3.5, None, stubs.cpu_demand(hog.pid))
        time.sleep(0.5)
        assert sup._blocked(held, 3.2, time.monotonic()) is None
    finally:
        hog.kill()
        hog.wait()


def test_a_loop_whose_thread_spins_is_stuck_with_cpu_to_spare_and_a_batch_worker_that_runs_is_at_work(tmp_path):
    """A loop step that runs on without end (the loop's thread runs, the loop never ticks) is
    stuck on a host with CPU to spare; on a starved host it is left to the 20 s rule (a starved
    step is slow too). A batch worker's thread that runs is computing a batch: never stuck for
    that."""
    spinning, tid = _loop_process("spinning-loop")
    try:
        sup = _supervisor()
        sup.heartbeats = str(tmp_path)
        stub = stubs.Stub(spinning.pid, "m", "", None)
        since = time.monotonic()
        demand0 = stubs.cpu_demand(spinning.pid, tid)
        time.sleep(2.0)                                  # over frozen_secs - LATE_BEAT_S
        now = time.monotonic()
        sup.late = {stub.pid: (since, _loop(tid), demand0)}
        _quiet_host(sup, tmp_path, now)
        why = sup._blocked(stub, 3.2, now)
        assert why and "its event loop's thread ran" in why and "without coming back to its loop" in why, why
        _starved_host(sup, tmp_path, now)
        assert sup._blocked(stub, 3.2, now) is None
        _quiet_host(sup, tmp_path, now)
        sup.late = {stub.pid: (since, stubs.BeatThread(tid, "batch worker"), demand0)}
        assert sup._blocked(stub, 3.2, now) is None
    finally:
        spinning.kill()
        spinning.wait()


def _starved_host(sup: Supervisor, tmp_path: Path, now: float) -> None:
    _host(sup, tmp_path, now, 3_400_000)


def _wait_of(pid: int, tid: int) -> stubs.ThreadWait | None:
    """The thread's wait, read until it is caught sleeping (a thread waiting for the GIL wakes
    every 5 ms)."""
    for _ in range(20):
        if (wait := stubs.thread_wait(pid, tid)) is not None:
            return wait
        time.sleep(0.05)
    return None


@pytest.mark.skipif(not stubs.reads_thread_waits(), reason="no /proc/<pid>/task/<tid>/syscall here")
def test_what_a_sleeping_loop_thread_waits_in_is_read():
    """A lock or event of its own with no timeout (a deadlock) is the stub's own; a futex shared
    with another process (how a 2.51 stub waits on tritonserver) or the GIL (waited for with a
    timeout) is not."""
    procs = {mode: _loop_process(mode) for mode in ("blocked", "gil-wait", "shared-wait", "spinning-loop")}
    try:
        time.sleep(0.5)
        waits = {mode: _wait_of(proc.pid, tid) for mode, (proc, tid) in procs.items()}
        assert waits["blocked"] == stubs.ThreadWait(True, "a lock or event of its own process, with no timeout")
        assert waits["gil-wait"] == stubs.ThreadWait(False, "a lock with a timeout (or the GIL)")
        assert waits["shared-wait"] == stubs.ThreadWait(False, "a futex shared with another process")
        assert waits["spinning-loop"] is None                        # it runs
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                                   stdout=subprocess.PIPE)
        sleeper.stdout.readline()
        time.sleep(0.3)
        assert _wait_of(sleeper.pid, sleeper.pid) == stubs.ThreadWait(True, "a sleep")
        sleeper.kill()
        sleeper.wait()
        assert stubs.thread_wait(sleeper.pid, sleeper.pid) is None   # gone
    finally:
        for proc, _ in procs.values():
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not stubs.reads_thread_waits(), reason="no /proc/<pid>/task/<tid>/syscall here")
def test_on_a_starved_host_a_loop_is_blocked_only_when_nothing_outside_the_stub_holds_it(tmp_path):
    """A starved tritonserver can hold a healthy stub's loop (a `Metric.set` waits for its answer
    on a shared futex), and a GIL can be held by a thread that waits for a CPU: those wait. A loop
    that waits for good on a lock or event of its own, with its threads not starved, is stuck
    whatever the host's load, unless another of its threads runs or waits for a CPU (it may
    hold that lock)."""
    procs = {mode: _loop_process(mode) for mode in ("blocked", "gil-wait", "shared-wait", "lock-held")}
    try:
        sup = _supervisor()
        sup.heartbeats = str(tmp_path)
        time.sleep(0.5)
        now = time.monotonic()
        sup.late = {proc.pid: (now - 2.5, _loop(tid), stubs.cpu_demand(proc.pid, tid)) for proc, tid in procs.values()}
        time.sleep(0.5)
        now = time.monotonic()
        _starved_host(sup, tmp_path, now)
        why = {mode: sup._blocked(stubs.Stub(proc.pid, "m", "", None), 3.2, now) for mode, (proc, _) in procs.items()}
        assert "its event loop's thread neither ran nor waited for a CPU" in why["blocked"], why
        assert "waiting in a lock or event of its own process, with no timeout" in why["blocked"]
        assert "the host is starved, but nothing outside the stub holds it" in why["blocked"]
        assert why["gil-wait"] is None and why["shared-wait"] is None, why
        # its own lock, but held by a thread that runs or waits for a CPU: perhaps starved
        assert why["lock-held"] is None, why
        # the loop thread not known: a starved host is reason enough to wait
        blocked, _ = procs["blocked"]
        sup.late[blocked.pid] = (now - 3.0, None, stubs.cpu_demand(blocked.pid))
        assert sup._blocked(stubs.Stub(blocked.pid, "m", "", None), 3.2, now) is None
        _quiet_host(sup, tmp_path, now)                  # with CPU to spare, the shared wait is stuck too
        shared, tid = procs["shared-wait"]
        assert "with CPU to spare" in sup._blocked(stubs.Stub(shared.pid, "m", "", None), 3.2, now)
    finally:
        for proc, _ in procs.values():
            proc.kill()
            proc.wait()


def test_a_loop_waiting_while_its_threads_wait_for_a_cpu_is_starved_not_blocked(tmp_path, monkeypatch):
    sup = _supervisor()
    sup.heartbeats = str(tmp_path)
    now = time.monotonic()
    _quiet_host(sup, tmp_path, now)
    stub = stubs.Stub(os.getpid(), "m", "", None)
    sup.late = {stub.pid: (now - 2.5, _loop(7), stubs.CpuDemand(10.0, 1.0, 2.0))}
    # the loop thread slept; another thread waited 2 of the 2.5 s for a CPU (holding the GIL)
    monkeypatch.setattr(stubs, "cpu_demand", lambda pid, tid=None: stubs.CpuDemand(12.1, 3.0, 2.01))
    assert sup._blocked(stub, 3.2, now) is None
    monkeypatch.setattr(stubs, "cpu_demand", lambda pid, tid=None: stubs.CpuDemand(12.1, 1.2, 2.01))
    assert "neither ran nor waited" in sup._blocked(stub, 3.2, now)


def test_the_beating_thread_is_read_from_the_heartbeat(tmp_path):
    stub = stubs.Stub(os.getpid(), "m", "", None)
    assert stubs.beat_thread(str(tmp_path), stub) is None
    (tmp_path / str(stub.pid)).touch()                   # before the stub said
    assert stubs.beat_thread(str(tmp_path), stub) is None
    (tmp_path / str(stub.pid)).write_text("4242 event loop")
    assert stubs.beat_thread(str(tmp_path), stub) == stubs.BeatThread(4242, "event loop")
    (tmp_path / str(stub.pid)).write_text("4243 batch worker")
    assert stubs.beat_thread(str(tmp_path), stub) == stubs.BeatThread(4243, "batch worker")
    demand = stubs.cpu_demand(os.getpid(), threading.get_native_id())
    assert demand is not None and demand.loop_s is not None and 0 < demand.loop_s <= demand.total_s
    assert stubs.cpu_demand(os.getpid(), 1).loop_s is None   # no such thread in this process


def test_heartbeat_age(tmp_path):
    sup = _supervisor()
    assert stubs.heartbeat_age(sup.heartbeats, stubs.Stub(os.getpid(), "m", "", None)) is None
    sup.heartbeats = str(tmp_path)
    assert stubs.heartbeat_age(sup.heartbeats, stubs.Stub(os.getpid(), "m", "", None)) is None
    (Path(sup.heartbeats) / str(os.getpid())).touch()
    assert stubs.heartbeat_age(sup.heartbeats, stubs.Stub(os.getpid(), "m", "", None)) < 1.0


def test_an_entry_that_does_not_answer_is_pinged_as_failed():
    """A ping to nothing listening fails with a coded message naming the pipeline."""
    from omni_backend.supervisor.triton_control import TritonControl
    from client.service_process import free_port

    async def ping():
        control = TritonControl(f"localhost:{free_port()}", None)
        try:
            await control.ping(Pipeline("hibari", ["hibari__synthesizer"]), 1.0)
        finally:
            await control.close()

    with pytest.raises(PingFailed, match=r"^unavailable: hibari: ") as failed:
        asyncio.run(ping())
    assert failed.value.model == "hibari"


def test_open_streams_are_read_per_pipeline_from_the_gauges():
    """Whether a dead entry held client streams (then the server is restarted, not the pipeline
    reloaded) is read from its own `omni_active_streams` series, not another pipeline's."""
    from omni_backend.supervisor.triton_control import TritonControl

    async def read() -> None:
        control = TritonControl("localhost:1", "http://localhost:1/metrics")
        control._metrics = lambda: "\n".join([
            '# TYPE omni_active_streams gauge',
            'omni_active_streams{pipeline="hibari"} 3',
            'omni_active_streams{pipeline="hibari_2"} 5',
            'omni_active_streams{pipeline="qwen"} 0',
            'omni_stage_active_requests{model="hibari"} 7',
        ])
        assert control.active_streams("hibari") == 3.0
        assert control.active_streams("qwen") == 0.0
        assert control.active_streams("absent") == 0.0
        assert control.active_streams() == 8.0
        control._metrics = lambda: None
        assert control.active_streams("hibari") is None
        await control.close()

    asyncio.run(read())


@pytest.mark.parametrize("program,launches,code", [
    ("import os; os.abort()", 4, -signal.SIGABRT),   # killed while loading: started again, 3 times
    ("import sys; sys.exit(1)", 1, 1),               # an exit status: a start-up error, at once
])
def test_a_server_killed_before_it_was_ready_is_started_again(monkeypatch, tmp_path, program, launches, code):
    import sys

    from omni_backend.supervisor import supervisor as module

    log = tmp_path / "launches"
    script = f"open({str(log)!r}, 'a').write('x'); {program}"
    monkeypatch.setattr(module.server_binary, "command", lambda args: [sys.executable, "-c", script])
    sup = _supervisor()
    assert asyncio.run(sup.run()) == code
    assert len(log.read_text()) == launches


def test_a_start_that_is_never_ready_is_killed_after_the_start_timeout_and_started_again(monkeypatch, tmp_path):
    import sys

    from omni_backend.supervisor import supervisor as module

    log = tmp_path / "launches"
    # a "server" that logs one model loading and then neither finishes nor opens its port
    script = (f"open({str(log)!r}, 'a').write('x'); "
              "print('I1203 model_lifecycle.cc:472] \\x22loading: slow_model:1\\x22', flush=True); "
              "import time; time.sleep(600)")
    monkeypatch.setattr(module.server_binary, "command", lambda args: [sys.executable, "-c", script])
    sup = _supervisor(**{"start-timeout-secs": 1})
    messages = []
    monkeypatch.setattr(module.log, "error", lambda msg, *args: messages.append(msg % args))
    # killed while loading (it would have slept, then exited 0), never ready: like one that
    # crashed in its start-up, started 3 more times
    assert asyncio.run(sup.run()) == -signal.SIGKILL
    assert len(log.read_text()) == 1 + module.START_RETRIES
    hung = [m for m in messages if "is not ready 1 s after it started" in m]
    assert len(hung) == 1 + module.START_RETRIES
    assert "still loading: slow_model;" in hung[0]


def test_an_entry_stub_its_ping_finds_not_healthy_is_killed_and_healed(fake_stub):
    """Triton answered the ping "not healthy" and freed it: the entry's stub (here a fake named
    `talker`) must not run again to take it (omni_backend/stubs/unhealthy_stub.py)."""
    proc, _, _ = fake_stub
    os.kill(proc.pid, signal.SIGSTOP)   # the host does not run it

    class Control:
        async def ping(self, pipeline, timeout_s):
            raise PingFailed("[StatusCode.INTERNAL] Stub process 'talker_0_0' is not healthy.", pipeline.name)

        def progress(self):
            return {}

    sup = _supervisor()
    sup.control = Control()
    sup.proc = type("Server", (), {"pid": os.getpid()})()
    state = PipelineState(Pipeline("talker", ["talker__stage"]), last_ok=time.monotonic())
    healed: list[str] = []
    sup._start_heal = lambda st, failure: healed.append(str(failure))
    asyncio.run(sup._probe(state))
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert healed == ["unavailable: talker: its stub was not healthy"] and not state.pinging


def test_options_reach_a_server_bound_to_one_address():
    """A server bound to one address (a pod's, one loopback address of several) is reached
    there; metrics follow --http-address unless --metrics-address is given."""
    opts = parse(["--model-repository=/r", "--grpc-address=127.0.0.2", "--http-address=127.0.0.2"])
    assert opts.grpc_url == "127.0.0.2:8001" and opts.metrics_url == "http://127.0.0.2:8002/metrics"
    opts = parse(["--model-repository=/r", "--grpc-address=0.0.0.0", "--metrics-address=::1"])
    assert opts.grpc_url == "localhost:8001" and opts.metrics_url == "http://[::1]:8002/metrics"


def test_shutdown_bound_follows_the_drain_and_stop_flags():
    base = parse(["--model-repository=/r"]).shutdown_secs
    longer = parse(["--model-repository=/r", "--supervisor-drain-secs=10", "--supervisor-stop-secs=6"]).shutdown_secs
    assert base >= 4.0 + 4.0 and longer - base == (10 - 4) + (6 - 4)
