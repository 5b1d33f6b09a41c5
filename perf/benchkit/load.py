"""Client load: closed loop (c clients back to back) and open loop (arrivals at a rate).

`one(client, i)` makes the i-th request of a client and returns its result; a request that fails
with a stream error or a broken connection is counted, with its message, and the load goes on."""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from client.triton_stream import TritonStreamError

Request = Callable[[int, int], Any]


def run_clients(concurrency: int, requests: int, one: Request) -> tuple[list, list[str], float]:
    """`concurrency` clients, each calling `one(client, i)` for i < `requests` back to back:
    (results, error messages, wall seconds)."""
    results, errors = [], []
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(requests):
            try:
                r = one(k, i)
                with lock:
                    results.append(r)
            except (TritonStreamError, OSError) as e:
                with lock:
                    errors.append(str(e))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors, time.perf_counter() - started


def run_arrivals(rate: float, requests: int, one: Request, seed: int = 0,
                 poisson: bool = True) -> tuple[list, list[str], float]:
    """`requests` calls of `one(0, i)`, each on its own thread, started `rate` per second: as a
    Poisson process (exponential gaps, seeded) or, with `poisson=False`, evenly spaced:
    (results, error messages, wall seconds)."""
    results, errors = [], []
    lock = threading.Lock()
    gaps = random.Random(seed)

    def call(i: int) -> None:
        try:
            r = one(0, i)
            with lock:
                results.append(r)
        except (TritonStreamError, OSError) as e:
            with lock:
                errors.append(str(e))

    started = time.perf_counter()
    due = started
    threads = []
    for i in range(requests):
        time.sleep(max(0.0, due - time.perf_counter()))
        threads.append(threading.Thread(target=call, args=(i,)))
        threads[-1].start()
        due += gaps.expovariate(rate) if poisson else 1 / rate
    for t in threads:
        t.join()
    return results, errors, time.perf_counter() - started
