"""The Python-backend stub processes of one tritonserver, and their shared-memory regions.

Each model instance runs in a `triton_python_backend_stub` child of tritonserver whose arguments
are the model file (`<repository>/<model>/<version>/model.py`) and its region in /dev/shm
(`triton_python_backend_shm_region_<uuid>`). Knowing them lets the supervisor kill the stub of a
model that stopped answering, and remove what a crashed server left behind.
"""
from __future__ import annotations

import os
import platform
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from omni_backend.stubs import stub_process

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"
STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str          # Triton model name (the folder above the version folder)
    model_file: str     # <repository>/<model>/<version>/model.py
    region: str | None  # its shared-memory region name
    instance: str = ""  # Triton's model instance name (`<model>_<group>_<index>`), as its errors name it


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _stat_fields(path: str) -> list[str]:
    """The fields of a /proc/.../stat file after the command name (state first); [] when gone."""
    stat = _read(path).decode(errors="replace")
    # the command name may hold spaces and parentheses: fields start after the last ')'
    return stat[stat.rfind(")") + 2:].split()


def _ppid_and_state(pid: int) -> tuple[int, str]:
    fields = _stat_fields(f"/proc/{pid}/stat")
    return (int(fields[1]), fields[0]) if len(fields) > 1 else (-1, "?")


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def parse_stub(pid: int) -> Stub | None:
    argv = [a.decode(errors="replace") for a in _read(f"/proc/{pid}/cmdline").split(b"\0")]
    if len(argv) < 3 or not argv[0].endswith(STUB_NAME):
        return None
    model_file = Path(argv[1])
    region = argv[2] if argv[2].startswith(SHM_PREFIX) else None
    # argv: model file, region, default and growth sizes, parent pid, libpython, IPC handle, instance
    instance = argv[8] if len(argv) > 8 else ""
    return Stub(pid=pid, model=model_file.parent.parent.name, model_file=str(model_file), region=region,
                instance=instance)


def stubs_of(server_pid: int) -> list[Stub]:
    """Live (not zombie) stub children of a tritonserver process."""
    found = []
    for pid in _pids():
        ppid, state = _ppid_and_state(pid)
        if ppid == server_pid and state != "Z":
            stub = parse_stub(pid)
            if stub is not None:
                found.append(stub)
    return found


def orphan_stubs() -> list[Stub]:
    """Stubs whose tritonserver is gone (re-parented to init or a subreaper)."""
    found = []
    for pid in _pids():
        stub = parse_stub(pid)
        if stub is None:
            continue
        ppid, state = _ppid_and_state(pid)
        parent = parse_exe_name(ppid)
        if state != "Z" and parent != "tritonserver":
            found.append(stub)
    return found


def parse_exe_name(pid: int) -> str:
    argv0 = _read(f"/proc/{pid}/cmdline").split(b"\0")[0].decode(errors="replace")
    return Path(argv0).name


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (0 when it is gone)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    return (int(fields[11]) + int(fields[12])) / _TICKS if len(fields) > 12 else 0.0


@dataclass(frozen=True)
class CpuDemand:
    """Seconds a process's threads have run plus waited to run (the first two fields of each
    thread's /proc/<pid>/task/<tid>/schedstat, in ns): demand grows while a thread uses or wants a
    CPU, and stands still while it is blocked."""
    total_s: float         # every thread's run + run-queue wait
    waited_s: float        # every thread's run-queue wait alone
    loop_s: float | None   # the event loop's thread's run + wait (None: not known or gone)
    loop_ran_s: float | None = None   # ... its run alone


def cpu_demand(pid: int, loop_tid: int | None = None) -> CpuDemand | None:
    """The process's CPU demand, with its loop thread's (`beat_thread`) apart; None when it
    cannot be read."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = waited = 0
    loop = loop_ran = None
    read = 0
    for tid in tids:
        demand = stub_process.thread_schedstat(pid, tid)
        if demand is not None:
            ran, wait = demand
            total += ran + wait
            waited += wait
            if loop_tid is not None and tid == str(loop_tid):
                loop, loop_ran = (ran + wait) / 1e9, ran / 1e9
            read += 1
    return CpuDemand(total / 1e9, waited / 1e9, loop, loop_ran) if read else None


# System call numbers (they differ by architecture) of the waits `thread_wait` tells apart.
_SYSCALLS = {"x86_64": {"futex": 202, "sleeps": (35, 230), "wait4": 61},   # nanosleep, clock_nanosleep
             "aarch64": {"futex": 98, "sleeps": (101, 115), "wait4": 260}}.get(platform.machine())
_FUTEX_PRIVATE = 0x80
_FUTEX_CMD = 0x7F
_FUTEX_WAITS = (0, 6, 9, 11, 13)   # WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2


@dataclass(frozen=True)
class ThreadWait:
    """What a sleeping thread waits in. `own`: only another thread of its own process or the
    clock can end the wait (a lock or event waited for with no timeout: a deadlock looks like
    this; a sleep), so it does not wait on tritonserver, and a starved host is no reason for it
    to sleep on. A futex shared with another process (the 2.51 stub waits on tritonserver that
    way: a `Metric.set`, a message) or a wait with a timeout (the GIL: CPython waits for it in
    5 ms slices) is not."""
    own: bool
    what: str


def _syscall(pid: int, tid: int) -> tuple[int, list[int]] | None:
    """The system call a thread sleeps in and its first four arguments
    (/proc/<pid>/task/<tid>/syscall); None when it runs, is gone or cannot be read."""
    fields = _read(f"/proc/{pid}/task/{tid}/syscall").split()
    try:
        return (int(fields[0]), [int(a, 16) for a in fields[1:5]]) if len(fields) >= 5 else None
    except ValueError:   # "running"
        return None


def thread_wait(pid: int, tid: int) -> ThreadWait | None:
    """The system call a thread sleeps in (/proc/<pid>/task/<tid>/syscall); None when it runs,
    is gone, cannot be read, or on an architecture not known here."""
    call = _syscall(pid, tid)
    if _SYSCALLS is None or call is None:
        return None
    nr, args = call
    if nr == _SYSCALLS["futex"] and (args[1] & _FUTEX_CMD) in _FUTEX_WAITS:
        if not args[1] & _FUTEX_PRIVATE:
            return ThreadWait(False, "a futex shared with another process")
        if args[3]:
            return ThreadWait(False, "a lock with a timeout (or the GIL)")
        return ThreadWait(True, "a lock or event of its own process, with no timeout")
    if nr in _SYSCALLS["sleeps"]:
        return ThreadWait(True, "a sleep")
    return ThreadWait(False, f"system call {nr}")


def awaited_stubs(server_pid: int) -> list[Stub]:
    """The live stubs that some thread of tritonserver waits in `waitpid` to see exit (2.51 does
    so when it gave up on a stub: after killing it, or after telling it to stop); [] where the
    threads' system calls cannot be read."""
    if _SYSCALLS is None:
        return []
    try:
        tids = os.listdir(f"/proc/{server_pid}/task")
    except OSError:
        return []
    found = []
    for tid in tids:
        call = _syscall(server_pid, int(tid))
        if call is None or call[0] != _SYSCALLS["wait4"]:
            continue
        pid = call[1][0]
        ppid, pid_state = _ppid_and_state(pid) if pid > 0 else (-1, "?")
        stub = parse_stub(pid) if ppid == server_pid and pid_state != "Z" else None
        if stub is not None:
            found.append(stub)
    return found


def runnable_threads(pid: int, but: int | None = None) -> int:
    """How many of the process's threads (but `but`) run or wait for a CPU now (state R)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    count = 0
    for tid in tids:
        if tid != str(but):
            count += _stat_fields(f"/proc/{pid}/task/{tid}/stat")[:1] == ["R"]
    return count


def reads_thread_waits() -> bool:
    """Whether `thread_wait` can tell anything here (a known architecture, /proc/.../syscall)."""
    return _SYSCALLS is not None and bool(_read(f"/proc/self/task/{threading.get_native_id()}/syscall"))


@dataclass(frozen=True)
class BeatThread:
    """The thread whose work the stub's heartbeat proves: its event loop's, or its batch worker's."""
    tid: int
    what: str   # "event loop", "batch worker"


def beat_thread(folder: str, stub: Stub) -> BeatThread | None:
    """The thread the stub's heartbeat file names (stub_process.start_heartbeat: `<tid> <what>`);
    None before it said."""
    if not folder:
        return None
    tid, _, what = _read(os.path.join(folder, str(stub.pid))).decode(errors="replace").strip().partition(" ")
    return BeatThread(int(tid), what or stub_process.EVENT_LOOP) if tid.isdigit() else None


def since_boot() -> float:
    """Now on the clock of `started_at`: seconds since the host booted."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def started_at(stub: Stub) -> float | None:
    """When the stub process started (`since_boot` seconds, to 1/CLK_TCK); None when it is gone."""
    fields = _stat_fields(f"/proc/{stub.pid}/stat")
    return int(fields[19]) / _TICKS if len(fields) > 19 else None


_STATES = {"R": "running", "S": "sleeping", "D": "waiting on I/O", "T": "stopped", "t": "traced", "Z": "a zombie"}


def state(stub: Stub) -> str:
    """The stub's scheduling state, in words (/proc/<pid>/stat)."""
    code = _ppid_and_state(stub.pid)[1]
    return _STATES.get(code, "gone" if code == "?" else code)


def stopped(stub: Stub) -> bool:
    """Stopped by a signal (SIGSTOP, SIGTSTP) or a tracer: it will answer nothing."""
    return _ppid_and_state(stub.pid)[1] in ("T", "t")


def heartbeat_age(folder: str, stub: Stub) -> float | None:
    """Seconds since the stub last beat (omni_backend/stubs/stub_process.py); None before its
    first beat, or for a model that does not beat."""
    if not folder:
        return None
    try:
        return max(0.0, time.time() - os.stat(os.path.join(folder, str(stub.pid))).st_mtime)
    except OSError:
        return None


def _marked_after_beat(folder: str, stub: Stub, suffix: str, beat_age: float) -> str | None:
    """The path of the stub's mark `<pid><suffix>` when it was touched after its last beat."""
    if not folder:
        return None
    path = os.path.join(folder, f"{stub.pid}{suffix}")
    try:
        return path if time.time() - os.stat(path).st_mtime < beat_age else None
    except OSError:
        return None


def responses_stalled(folder: str, stub: Stub, beat_age: float) -> bool:
    """Whether the stub's loop ran after its last heartbeat but withheld it because its responses
    stopped leaving (stub_process.RESPONSES_STALLED_SUFFIX)."""
    return _marked_after_beat(folder, stub, stub_process.RESPONSES_STALLED_SUFFIX, beat_age) is not None


def overrun(folder: str, stub: Stub, beat_age: float) -> str | None:
    """Why the stub's batch worker withheld its heartbeat (its batch ran far past what batches
    before it took: stub_process.WorkWatch), when it said so after its last beat; else None."""
    path = _marked_after_beat(folder, stub, stub_process.OVERRUN_SUFFIX, beat_age)
    return (_read(path).decode(errors="replace").strip() or None) if path else None


def alive(stub: Stub) -> bool:
    """The stub is still running (not exited, not a zombie, its pid not reused)."""
    _, state = _ppid_and_state(stub.pid)
    return state not in ("Z", "X", "?") and parse_stub(stub.pid) == stub


def kill(stubs: list[Stub]) -> None:
    for stub in stubs:
        try:
            os.kill(stub.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def mapped_regions() -> set[str]:
    """Region names some live process has mapped."""
    names = set()
    for pid in _pids():
        for line in _read(f"/proc/{pid}/maps").decode(errors="replace").splitlines():
            i = line.find(str(SHM_DIR / SHM_PREFIX))
            if i >= 0:
                names.add(Path(line[i:].split()[0]).name)
    return names


REGION_RECHECK_S = 0.2


def remove_stale_regions(min_age_s: float = 10.0, names: set[str] | None = None,
                         newer_than: float | None = None) -> list[str]:
    """Unlink regions no process maps (left by a crashed or killed server). `names` limits it to
    those; `newer_than` to those made since that wall-clock time (by a server that is gone now);
    otherwise any such region older than `min_age_s` (a server that is starting has mapped its new
    regions long before that).

    Another server on the host may be creating a region meanwhile: it exists a moment before its
    creator maps it, and reading every process's mappings takes tens of milliseconds. A region
    counts as unmapped only if it was there before the first read and is unmapped in a second
    read `REGION_RECHECK_S` later: a server that stopped once removed a starting server's fresh
    regions this way, and that server's stubs failed ("Unable to initialize shared memory key",
    then "double free or corruption"), so it never became ready."""
    if not SHM_DIR.is_dir():
        return []
    now = time.time()
    candidates = []   # chosen before reading the mappings: see above
    for path in SHM_DIR.glob(f"{SHM_PREFIX}*"):
        if names is not None and path.name not in names:
            continue
        try:
            made = path.stat().st_mtime
        except OSError:
            continue
        if newer_than is not None and made < newer_than:
            continue
        if names is None and newer_than is None and now - made < min_age_s:
            continue
        candidates.append(path)
    if not candidates:
        return []
    in_use = mapped_regions()
    if any(path.name not in in_use for path in candidates):
        time.sleep(REGION_RECHECK_S)
        in_use |= mapped_regions()
    removed = []
    for path in candidates:
        if path.name in in_use:
            continue
        try:
            path.unlink()
            removed.append(path.name)
        except OSError:
            pass
    return removed
