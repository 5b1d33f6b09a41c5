"""What stage calls need of the model that makes them (the entry): the `StageHost` protocol.

Transfers (omni_backend/triton/transfer.py) call stages through it and never through the entry itself, so the API families write against
does not depend on the entry's internals (and the entry may import them freely).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from omni_backend.triton.decoupled import StreamContext
    from omni_backend.triton.local_stage import LocalStage
    from omni_backend.triton.stage_liveness import StageLiveness

T = TypeVar("T")


class StageHost(Protocol):
    """The model whose threads carry BLS calls to its stages."""

    executor: "Executor"        # BLS calls run here, never on the event loop
    liveness: "StageLiveness"   # told of every stage answer (its pings then need not wait)
    local_stages: "dict[int, LocalStage]"   # stages in this process (`process: entry`), by stage id

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the executor."""
        ...

    async def wait(self, ctx: "StreamContext", awaitable: Awaitable[T]) -> T:
        """Await while watching for the client of `ctx` going away (then Cancelled is raised)."""
        ...
