"""A stub's event loop that stops ticking has every thread's stack written once per stall."""
from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import threading
import time
from pathlib import Path

import pytest

from omni_backend.stubs import stub_process


def _stall_reported(err: str) -> int:
    return err.count("Timeout (0:00:01)!")   # faulthandler's watchdog, STALL_REPORT_S = 1


def _hold_the_loop_without_the_gil() -> None:   # what a blocking call on the loop does
    time.sleep(2.5)


def _hold_the_loop_and_the_gil() -> None:        # a C call that keeps the GIL while it blocks
    ctypes.PyDLL(None).sleep(3)


@pytest.mark.parametrize("hold", [_hold_the_loop_without_the_gil, _hold_the_loop_and_the_gil])
def test_a_stalled_loop_has_its_stacks_reported_once(hold, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(stub_process.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setattr(stub_process, "STALL_REPORT_S", 1.0)   # over the 0.5 s tick
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        stub_process.start_heartbeat(loop)
        time.sleep(1.5)                      # ticking: nothing reported
        assert not _stall_reported(capfd.readouterr().err)
        loop.call_soon_threadsafe(hold)
        time.sleep(3.5)
        err = capfd.readouterr().err
        assert _stall_reported(err) == 1, err
        assert hold.__name__ in err          # the stack shows what held it
        time.sleep(1.5)                      # ticking again: no second report
        assert not _stall_reported(capfd.readouterr().err)
    finally:
        stub_process.stop_loop_watch()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()                         # the reporter leaves with its loop


def test_responses_that_never_leave_stop_the_heartbeat_and_are_reported(tmp_path, monkeypatch, capfd):
    """The loop ticks, but the response thread is stuck: the supervisor must see a stuck stub."""
    monkeypatch.setenv(stub_process.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setattr(stub_process, "STALL_REPORT_S", 1.0)
    stalled = [0.0]
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    beat = tmp_path / str(os.getpid())
    try:
        stub_process.start_heartbeat(loop, lambda: stalled[0])
        time.sleep(1.0)
        assert time.time() - beat.stat().st_mtime < 0.8          # beating
        assert beat.read_text() == f"{runner.native_id} event loop"   # it names the loop's thread
        stalled[0] = 1.5                                          # responses stuck past the bound
        time.sleep(2.0)
        assert time.time() - beat.stat().st_mtime > 1.2          # the beat stopped, the loop still ticks
        err = capfd.readouterr().err
        assert err.count("with none leaving") == 1, err
        assert not _stall_reported(err)
        stalled[0] = 0.0                                          # a response left
        time.sleep(1.0)
        assert time.time() - beat.stat().st_mtime < 0.8          # beating again
    finally:
        stub_process.stop_loop_watch()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def _age(path: Path) -> float:
    """Seconds since the heartbeat folder's file was touched; inf when there is none."""
    return time.time() - path.stat().st_mtime if path.exists() else float("inf")


def test_a_batch_worker_beats_while_it_waits_or_works_and_stops_while_it_sleeps_mid_batch(tmp_path, monkeypatch):
    """A model without an event loop beats from a thread of its own, which watches its worker
    (stub_process.WorkWatch): a worker blocked in its batch (a deadlock) stops the beat, one that
    computes does not, and a send that never returns marks its responses stalled."""
    monkeypatch.setenv(stub_process.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setattr(stub_process, "STALL_REPORT_S", 1.5)
    work = stub_process.WorkWatch()
    phase: queue.SimpleQueue = queue.SimpleQueue()
    release = threading.Event()

    def worker() -> None:
        while True:
            work.enter(work.WAITING)
            what = phase.get()
            if what is None:
                work.enter(work.DONE)                     # the heartbeat's thread ends too
                return
            work.enter(what)
            if what == work.WORKING:
                end = time.monotonic() + 2.0
                while time.monotonic() < end and not release.is_set():
                    pass                                  # computing
            release.wait()                                # then blocked (or a send that waits)
            release.clear()

    runner = threading.Thread(target=worker, daemon=True)
    runner.start()
    beat = tmp_path / str(os.getpid())
    stalled = tmp_path / f"{os.getpid()}{stub_process.RESPONSES_STALLED_SUFFIX}"

    stub_process.start_heartbeat(work=work)
    try:
        time.sleep(1.5)
        assert _age(beat) < 0.8                                    # waiting for work: beating
        assert beat.read_text() == f"{runner.native_id} batch worker"
        phase.put(work.WORKING)
        time.sleep(1.8)
        assert _age(beat) < 0.8                                    # computing: beating
        time.sleep(2.2)
        assert _age(beat) > 1.5                                    # blocked mid-batch: silent
        release.set()
        time.sleep(1.0)
        assert _age(beat) < 0.8                                    # waiting for work again
        phase.put(work.SENDING)
        time.sleep(1.0)
        assert _age(beat) < 0.8 and _age(stalled) == float("inf")  # a send may wait a while
        time.sleep(1.5)
        assert _age(beat) > 1.0 and _age(stalled) < 0.8            # then its responses are stalled
    finally:
        release.set()
        phase.put(None)
        runner.join(5)
    time.sleep(1.0)
    assert not [t for t in threading.enumerate() if t.name == "heartbeat"]


def test_a_batch_that_runs_far_past_the_batches_before_it_stops_the_beat_and_says_why(tmp_path, monkeypatch):
    """WorkWatch's budget: a stage's first batch may run as long as it takes (it may be cold);
    after it, a batch that has used OVERRUN_FACTOR times the CPU of the costliest batch before it
    (and at least OVERRUN_FLOOR_S) is one that does not end: the beat stops and `<pid>.overrun`
    says why. A long batch within its budget beats on."""
    monkeypatch.setenv(stub_process.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setattr(stub_process.WorkWatch, "OVERRUN_FLOOR_S", 1.0)
    work = stub_process.WorkWatch()
    batches: queue.SimpleQueue = queue.SimpleQueue()
    ended: queue.SimpleQueue = queue.SimpleQueue()   # each batch's seconds, once it is done

    def compute(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def worker() -> None:
        while True:
            work.enter(work.WAITING)
            seconds = batches.get()
            if seconds is None:
                work.enter(work.DONE)
                return
            work.enter(work.WORKING)
            work.run_started(2)
            compute(seconds)
            work.run_ended()
            ended.put(seconds)

    runner = threading.Thread(target=worker, daemon=True)
    runner.start()
    beat = tmp_path / str(os.getpid())
    overrun = tmp_path / f"{os.getpid()}{stub_process.OVERRUN_SUFFIX}"

    stub_process.start_heartbeat(work=work)
    try:
        batches.put(2.0)                                          # the first batch: no budget
        time.sleep(2.6)
        assert _age(beat) < 0.8 and not overrun.exists()
        batches.put(0.01)                                         # quick batches: 20x is under the floor
        batches.put(0.9)                                          # a long one within the floor
        time.sleep(1.5)
        assert _age(beat) < 0.8 and not overrun.exists()
        batches.put(3.0)                                          # over the floor, under 20x the first 2 s
        time.sleep(2.0)
        assert not overrun.exists()                               # budget 40 s
        while ended.get(timeout=30) != 3.0:                       # 3 s of CPU: later in wall time on a busy host
            pass
        assert not overrun.exists()
        # from now on the budget is the floor, 1 s of CPU (0.25 x 2 s is under it): the next batch
        # runs on past it, the overrun is declared, and from then on the beat stops (changed while
        # the 3-s batch still ran, it would have declared that one, which then ended: a fresh beat)
        monkeypatch.setattr(stub_process.WorkWatch, "OVERRUN_FACTOR", 0.25)
        batches.put(3.0)
        deadline = time.monotonic() + 30
        while not overrun.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert overrun.exists()
        time.sleep(1.0)
        assert _age(beat) > 0.8 and _age(overrun) < 0.8
        said = overrun.read_text()
        assert said.startswith("its batch of 2 has run ") and "a computation that does not end" in said
        # it ends after all (3 s of CPU: later on a busy host): beating again
        deadline = time.monotonic() + 10
        while _age(beat) >= 0.8 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _age(beat) < 0.8
    finally:
        batches.put(None)
        runner.join(10)
    time.sleep(1.0)
    assert not [t for t in threading.enumerate() if t.name == "heartbeat"]
