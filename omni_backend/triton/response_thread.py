"""Responses leave from a thread of their own, never from the event loop.

A decoupled response is a round trip to tritonserver over shared memory: the stub waits for the
server to take it. On a busy host that wait is long, and made on the event loop it held up every
other stream of the model, its control requests and its heartbeat (a loop seen blocked for 5 s
and more under overload). Triton's own vLLM backend sends from a response thread too. One thread
keeps each stream's responses in order; a stream awaits its own sends, so it cannot run ahead
of what has left.

`stalled_for` tells the heartbeat (stub_process.start_heartbeat) how long responses have waited
with none leaving: a stub whose loop ticks but whose responses never leave (this thread dead or
blocked) is as stuck as one whose loop stopped, and once went unnoticed while every stream hung.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any, Callable


class ResponseThread:
    def __init__(self, name: str, on_error: Callable[[str], None]):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._on_error = on_error
        self._lock = threading.Lock()
        self._pending = 0                       # queued or being sent
        self._progress_at = time.monotonic()    # the last time one left, or the queue filled
        self._thread = threading.Thread(target=self._run, name=f"{name}-responses", daemon=True)
        self._thread.start()

    def send(self, sender: Any, response: Any = None, flags: int = 0) -> Future:
        """Queue one response (or, with `response=None`, only the flags); the future completes
        once it has left, with the exception if sending failed."""
        done: Future = Future()
        with self._lock:
            if self._pending == 0:
                self._progress_at = time.monotonic()
            self._pending += 1
        self._queue.put((done, sender, response, flags))
        return done

    def stalled_for(self) -> float:
        """Seconds that responses have been waiting with none leaving; 0 when none wait."""
        with self._lock:
            return 0.0 if self._pending == 0 else time.monotonic() - self._progress_at

    def close(self, timeout_s: float = 2.0) -> None:
        """Let what is queued leave (up to `timeout_s`), then stop."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            done, sender, response, flags = item
            # A stream whose task was cancelled (its client left by a cancel request, an abort)
            # cancels the future it awaited; its response still leaves, in order, and nobody is
            # told. Setting a cancelled future's result raises: that once ended this thread, and
            # every later response of the model waited for ever (a wedge).
            waited = done.set_running_or_notify_cancel()
            try:
                if response is None:
                    sender.send(flags=flags)
                else:
                    sender.send(response, flags=flags)
                if waited:
                    done.set_result(None)
            except Exception as e:  # noqa: BLE001 - the client may be gone; its stream learns of it
                if waited:
                    done.set_exception(e)
                if flags:
                    self._on_error(f"could not send the last response: {traceback.format_exc(limit=1)}")
            with self._lock:
                self._pending -= 1
                self._progress_at = time.monotonic()
            del item, done, sender, response
