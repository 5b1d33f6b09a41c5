"""tritonserver's output, passed on as it comes, and watched for the line its crash handler
writes first ("Signal (11) received.").

That handler can hang instead of ending the process: in a soak, a double free in 2.51's gRPC
frontend (`grpc_byte_buffer_destroy`) aborted one thread, whose handler then waited for ever on the
heap lock that the failed `free` still held. The process stayed alive, each thread that
allocated from that heap stopped in turn, and the server served less and less for six minutes,
then nothing; no exit, so no restart. A process that said it crashed is ended within
`FATAL_EXIT_S` (killed if it does not end by itself), and the supervisor restarts it.

`Loading` follows the models the log says are loading, so that a start-up that never becomes
ready can be reported by the models it still waits for.
"""
from __future__ import annotations

import asyncio
import re
import sys
from typing import BinaryIO, Callable

# Written by tritonserver's own handler for SIGILL, SIGABRT, SIGBUS, SIGFPE and SIGSEGV (stubs
# write nothing like it); "Signal (15) received." is a normal SIGTERM.
FATAL_SIGNAL = re.compile(rb"Signal \((4|6|7|8|11)\) received\.")
FATAL_EXIT_S = 10.0   # the handler's own backtrace and exit take well under a second
_TAIL = 256           # enough to find the line split across two reads
# model_lifecycle.cc's lines: `"loading: <name>:<version>"`, `"successfully loaded '<name>'"`,
# `"failed to load '<name>' version <v>: ..."`
_LOADING = re.compile(rb'"loading: ([^"]+):\d+"')
_LOADED = re.compile(rb"\"(?:successfully loaded|failed to load) '([^']+)'")


class Loading:
    """The models tritonserver said it started loading and has not yet said it loaded or failed."""

    def __init__(self) -> None:
        self._pending: dict[str, None] = {}   # in the order they started
        self._partial = b""

    def feed(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-4096:]
        for line in lines:
            if found := _LOADING.search(line):
                self._pending[found.group(1).decode(errors="replace")] = None
            elif found := _LOADED.search(line):
                self._pending.pop(found.group(1).decode(errors="replace"), None)

    @property
    def pending(self) -> list[str]:
        return list(self._pending)


async def forward(stream: asyncio.StreamReader, on_fatal: Callable[[bytes], None],
                  out: BinaryIO | None = None, loading: Loading | None = None) -> None:
    """Copy `stream` to `out` (stdout) until it ends; call `on_fatal(line)` once, the first time
    the crash handler's line is seen (it must not block: the handler's backtrace still has to
    get through); `loading` is fed everything."""
    out = out or sys.stdout.buffer
    tail = b""
    seen = False
    while True:
        data = await stream.read(1 << 16)
        if not data:
            return
        out.write(data)
        out.flush()
        if loading is not None:
            loading.feed(data)
        if seen:
            continue
        tail = (tail + data)[-(len(data) + _TAIL):]
        found = FATAL_SIGNAL.search(tail)
        if found:
            seen = True
            on_fatal(found.group(0))
        tail = tail[-_TAIL:]
