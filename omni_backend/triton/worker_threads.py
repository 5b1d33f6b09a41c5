"""A thread pool of daemon threads for a model's blocking calls (BLS iterators, library calls).

`concurrent.futures.ThreadPoolExecutor` joins its workers when the interpreter exits. A BLS
iterator whose stage died blocks its worker forever, so a stub with such a worker never exits
after `finalize`, and Triton waits on it. Daemon workers die with the process instead.
"""
from __future__ import annotations

import collections
import threading
from concurrent.futures import Executor, Future
from typing import Any, Callable


class DaemonThreadPool(Executor):
    def __init__(self, max_workers: int, thread_name_prefix: str = "worker"):
        self.max_workers = max_workers
        self.prefix = thread_name_prefix
        self._cond = threading.Condition()
        self._items: collections.deque = collections.deque()
        self._threads = 0
        self._idle = 0          # workers waiting for work (exact: both sides hold the lock)
        self._shutdown = False

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("the thread pool is shut down")
            self._items.append((future, fn, args, kwargs))
            if len(self._items) <= self._idle:
                self._cond.notify()
            elif self._threads < self.max_workers:
                self._threads += 1
                threading.Thread(target=self._run, name=f"{self.prefix}_{self._threads}", daemon=True).start()
        return future

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._shutdown:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._items:
                    self._threads -= 1
                    return
                future, fn, args, kwargs = self._items.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # noqa: BLE001 - handed to whoever awaits the future
                    future.set_exception(e)
            del future, fn, args, kwargs

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """Stop taking work; queued work is cancelled; running work is never waited for."""
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._items:
                    self._items.popleft()[0].cancel()
            self._cond.notify_all()
