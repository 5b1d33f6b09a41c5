"""The models' daemon thread pool and the entry's stage liveness check (no Triton needed)."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError

import pytest

from omni_backend.errors import Unavailable
from omni_backend.triton.stage_liveness import StageLiveness
from omni_backend.triton.worker_threads import DaemonThreadPool


def test_pool_runs_work_and_hands_back_results_and_errors():
    pool = DaemonThreadPool(4, "t")
    assert [f.result(5) for f in [pool.submit(pow, 2, n) for n in range(10)]] == [2 ** n for n in range(10)]
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    pool.shutdown()


def test_pool_grows_past_blocked_workers_up_to_its_limit():
    pool = DaemonThreadPool(3, "t")
    gate = threading.Event()
    blocked = [pool.submit(gate.wait) for _ in range(2)]     # two workers stuck (a dead stage's BLS)
    assert pool.submit(lambda: "served").result(5) == "served"
    late = [pool.submit(gate.wait), pool.submit(lambda: "queued")]  # the third blocks; the fourth waits
    time.sleep(0.2)
    assert not late[1].done()
    gate.set()
    assert late[1].result(5) == "queued" and all(f.result(5) for f in blocked)
    pool.shutdown()


def test_shutdown_cancels_queued_work_and_never_waits():
    pool = DaemonThreadPool(1, "t")
    gate = threading.Event()
    running = pool.submit(gate.wait)
    while not running.running():
        time.sleep(0.01)
    queued = pool.submit(lambda: "never")
    t0 = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - t0 < 0.5
    with pytest.raises(CancelledError):
        queued.result(1)
    with pytest.raises(RuntimeError):
        pool.submit(print)
    gate.set()
    assert running.result(5) is True


def test_a_worker_blocked_forever_does_not_keep_the_process_alive():
    code = ("import threading\n"
            "from omni_backend.triton.worker_threads import DaemonThreadPool\n"
            "DaemonThreadPool(2).submit(threading.Event().wait)\n"
            "print('exiting', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "exiting" in done.stdout


def test_liveness_counts_the_pings_answer_any_other_answer_and_names_a_silent_stage():
    async def main():
        live = StageLiveness()
        await live.check("s", asyncio.sleep(0.05), 1.0)                 # the ping's own answer

        async def slow_ping():
            await asyncio.sleep(10)

        async def other_answer():
            await asyncio.sleep(0.1)
            live.answered("s")                                          # real work came back

        t0 = time.monotonic()
        await asyncio.gather(live.check("s", slow_ping(), 5.0), other_answer())
        assert time.monotonic() - t0 < 1.0
        with pytest.raises(Unavailable, match=r"^unavailable: codec: no answer in 0.2 s"):
            await live.check("codec", slow_ping(), 0.2)

        async def failing():
            raise Unavailable("codec: not healthy")

        with pytest.raises(Unavailable, match="not healthy"):
            await live.check("codec", failing(), 1.0)

    asyncio.run(main())
