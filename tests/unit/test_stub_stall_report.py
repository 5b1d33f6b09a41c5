"""A stub's event loop that stops ticking has every thread's stack written once per stall."""
from __future__ import annotations

import asyncio
import os
import threading
import time

from omni_backend.triton import stub_process


def test_a_stalled_loop_has_its_stacks_reported_once(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(stub_process.HEARTBEAT_ENV, str(tmp_path))
    monkeypatch.setattr(stub_process, "STALL_REPORT_S", 1.0)   # over the 0.5 s tick
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        stub_process.start_heartbeat(loop)
        time.sleep(1.5)                      # ticking: nothing reported
        assert "stalled" not in capfd.readouterr().err

        def hold_the_loop() -> None:         # what a blocking call on the loop does
            time.sleep(2.5)
        loop.call_soon_threadsafe(hold_the_loop)
        time.sleep(3.0)
        err = capfd.readouterr().err
        assert err.count("event loop stalled") == 1, err
        assert "hold_the_loop" in err        # the stack shows what held it
        time.sleep(1.5)                      # ticking again: no second report
        assert "stalled" not in capfd.readouterr().err
    finally:
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
        stalled[0] = 1.5                                          # responses stuck past the bound
        time.sleep(2.0)
        assert time.time() - beat.stat().st_mtime > 1.2          # the beat stopped, the loop still ticks
        err = capfd.readouterr().err
        assert err.count("with none leaving") == 1, err
        assert "event loop stalled" not in err
        stalled[0] = 0.0                                          # a response left
        time.sleep(1.0)
        assert time.time() - beat.stat().st_mtime < 0.8          # beating again
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()
