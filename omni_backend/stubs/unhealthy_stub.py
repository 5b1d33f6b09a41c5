"""A stage stub that tritonserver called "not healthy" is killed at once, before it runs again.

While tritonserver waits for a stub to take a call (2.51's `StubLauncher::ReceiveMessageFromStub`)
it gives up after a second in which the stub's health thread did not run, answers the call with
"Stub process '<instance>' is not healthy.", and frees the call's message. The stub, once the host
runs it again, still takes that message: it reads freed memory (a stage stub died of a garbled
input tensor that way under overload), answers, and leaves the two message queues one message
apart, so that the server's next call to it reads a stale answer and aborts the whole server
(perf/investigations/stub_health_desync.py). A stub that is killed before it runs again never takes the message:
the server lives, later calls are answered "not healthy" until the supervisor, which sees the stub
gone, reloads the pipeline. The entry sees these answers first (every stage call is its BLS call),
so it kills the named stub itself. A reloaded model's new stub has the same instance name as the
old one, whose calls still queued are answered "not healthy" too: only a stub that was running
when the call was made is killed.
"""
from __future__ import annotations

import os
import re

from omni_backend.stubs import server_stubs as stubs

# `ReceiveMessageFromStub` names the instance; `SendMessageToStub` does not ("Stub process is not
# healthy."); "Failed to obtain the health mutex." is a stub stuck or dead while holding it.
_NAMED = re.compile(r"Stub process '([^']+)' is not healthy")
_UNNAMED = ("Stub process is not healthy", "Failed to obtain the health mutex")


def unhealthy_instance(message: str) -> str | None:
    """The instance a Triton error says is not healthy ("" when it names none: any instance of
    the model called), or None when the message says nothing of the kind."""
    named = _NAMED.search(message)
    if named is not None:
        return named.group(1)
    return "" if any(text in message for text in _UNNAMED) else None


def kill_unhealthy_stub(message: str, model_name: str, called_at: float,
                        server_pid: int | None = None) -> list[stubs.Stub]:
    """Kill the stub(s) `message` calls not healthy (SIGKILL, so that they never run again), among
    `model_name`'s stubs under tritonserver (`server_pid`, by default this stub's parent) that
    started before the call was made (`called_at`, `stubs.since_boot()` seconds). Returns the stubs killed;
    none when the message is another error."""
    instance = unhealthy_instance(message)
    if instance is None:
        return []
    server = os.getppid() if server_pid is None else server_pid
    found = [s for s in stubs.stubs_of(server) if s.model == model_name and instance in ("", s.instance)
             and (stubs.started_at(s) or called_at) < called_at]
    stubs.kill(found)
    return found
