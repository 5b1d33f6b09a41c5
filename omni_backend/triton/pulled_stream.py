"""A stage stream whose caller pulls each response with a call of its own (`CONTROL=open`, then
`CONTROL=pull`), so every BLS call between entry and stage gets exactly one response.

Why: a BLS stream that answers with many responses can freeze the caller's whole stub in the
2.51 Python backend (and every later release so far). Three of its locks form a cycle: a thread
woken in `ResponseIterator::Next` holds the iterator's mutex while it waits for the GIL; the stub's
message thread holds the iterator map's mutex while it waits for that iterator's mutex to hand it
the stream's next response; a thread that holds the GIL opens another BLS call, and
`exec(decoupled=True)` waits for the map's mutex with the GIL held. perf/investigations/bls_lock_cycle.py makes
it happen within seconds with two plain Python models, and shows the three stacks. A call whose
one response carries the FINAL flag never gets a later response, so no reader ever waits in
`Next` and the cycle cannot form.

The stage still streams as before into a `PulledStream` that stands in for the request's
response sender: the first response answers the opening request, each later one the next pull;
a response with no pull waiting is kept until one comes. The end of the stream is a response
with no outputs.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

FINAL = 1   # TRITONSERVER_RESPONSE_COMPLETE_FINAL (tritonserver.h; pb_utils has the same value)

# A stream whose responses nobody pulled for this long lost its caller (an entry that died):
# its stage stops it and forgets what it kept.
UNCLAIMED_S = 60.0


class PulledStream:
    """Stands in for a stream's response sender (`send`, `is_cancelled`); `send` is called from
    the model's response thread, everything else from its event loop."""

    def __init__(self, opening_sender: Any, responses: Any):
        self._responses = responses              # the model's ResponseThread
        self._lock = threading.Lock()
        self._kept: deque = deque()              # responses waiting for a pull; None is the end
        self._waiting: deque = deque([opening_sender])   # callers waiting for a response
        self._kept_since: float | None = None    # when the oldest kept response came
        self.closed = False                      # the caller is gone or the end was handed out

    def is_cancelled(self) -> bool:
        # The caller leaves by `CONTROL=cancel` (stage.StageModel.control), never otherwise.
        return False

    def send(self, response: Any = None, flags: int = 0) -> None:
        """One response of the stream (None with FINAL: its end), from the response thread."""
        if response is None and not flags & FINAL:
            return
        with self._lock:
            if self.closed:
                return
            if not self._waiting:
                if not self._kept:
                    self._kept_since = time.monotonic()
                self._kept.append(response)
                return
            sender = self._waiting.popleft()
            self.closed = response is None
        _answer(sender, response)   # on the response thread already: in order with the rest

    def pull(self, sender: Any) -> None:
        """Answer `sender` with the next response, now or when it comes."""
        with self._lock:
            if self.closed and not self._kept:
                item, ready = None, True
            elif self._kept:
                item, ready = self._kept.popleft(), True
                self._kept_since = time.monotonic() if self._kept else None
                self.closed = self.closed or item is None
            else:
                self._waiting.append(sender)
                return
        self._responses.send(sender, item, FINAL)

    def close(self) -> None:
        """The caller left: whoever still waits gets the end; later responses are dropped."""
        with self._lock:
            self.closed = True
            waiting, self._waiting = list(self._waiting), deque()
            self._kept.clear()
            self._kept_since = None
        for sender in waiting:
            self._responses.send(sender, None, FINAL)

    def unclaimed_for(self) -> float:
        """Seconds the oldest kept response has waited for a pull (0 with none kept)."""
        with self._lock:
            return 0.0 if self._kept_since is None else time.monotonic() - self._kept_since

    @property
    def finished(self) -> bool:
        """The end was handed out (or the caller left): nothing more will be pulled."""
        with self._lock:
            return self.closed and not self._kept


def _answer(sender: Any, response: Any) -> None:
    if response is None:
        sender.send(flags=FINAL)
    else:
        sender.send(response, flags=FINAL)
