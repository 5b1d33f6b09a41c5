"""A stream's waits never hold it in a reference cycle: when it ends, what it held is freed at
once, not at the next full garbage collection (which an idle process never runs)."""
from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest

from client.triton_stream import next_watched
from omni_backend.errors import Cancelled
from omni_backend.glibc_heaps import release_garbage_and_free_memory
from omni_backend.triton.stream_waits import in_arrival_order, watched


@pytest.fixture
def no_collector():
    """Only reference counting frees objects during the test."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Context:
    """Stands in for a stream's context: what a cycle through a wait's frame would keep."""

    def __init__(self):
        self.audio = np.zeros(1 << 20, np.float32)
        self.left = False

    def cancelled(self) -> bool:
        return self.left


class Frames:
    """A stage stream: `n` items, each after `delay_s`."""

    def __init__(self, name: str, n: int, delay_s: float = 0.0):
        self.name, self.n, self.delay_s = name, n, delay_s
        self.buffer = np.zeros(1 << 18, np.float32)

    async def __aiter__(self):
        for i in range(self.n):
            await asyncio.sleep(self.delay_s)
            yield f"{self.name}{i}"


def test_a_step_that_ends_the_stream_frees_its_context_at_once(no_collector):
    async def engine_events(ctx: Context) -> list[str]:
        iterator = Frames("f", 2).__aiter__()
        seen = []
        while True:
            try:
                seen.append(await watched(iterator.__anext__(), ctx.cancelled, 0.01))
            except StopAsyncIteration:
                return seen

    async def scenario() -> weakref.ref:
        ctx = Context()
        assert await engine_events(ctx) == ["f0", "f1"]
        return weakref.ref(ctx)

    assert asyncio.run(scenario())() is None


def test_a_step_that_raises_frees_its_context_at_once(no_collector):
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("engine: out of memory")

    async def scenario() -> weakref.ref:
        ctx = Context()
        with pytest.raises(ValueError):
            await watched(failing(), ctx.cancelled, 0.01)
        return weakref.ref(ctx)

    assert asyncio.run(scenario())() is None


def test_a_watched_client_step_that_ends_the_stream_frees_it_at_once(no_collector):
    """The client side's watched step (the speech API's streams, `client.triton_stream`)."""
    async def scenario() -> weakref.ref:
        ctx = Context()

        async def still_routed() -> None:
            if ctx.cancelled():
                raise RuntimeError("not routed")

        iterator = Frames("f", 2).__aiter__()
        seen = []
        while True:
            try:
                seen.append(await next_watched(iterator, 0.01, still_routed))
            except StopAsyncIteration:
                break
        assert seen == ["f0", "f1"]
        del still_routed
        return weakref.ref(ctx)

    assert asyncio.run(scenario())() is None


def test_a_client_that_leaves_ends_the_wait():
    async def scenario() -> None:
        ctx = Context()
        slow = asyncio.ensure_future(asyncio.sleep(5))
        ctx.left = True
        with pytest.raises(Cancelled):
            await watched(slow, ctx.cancelled, 0.01)
        assert not slow.done()   # left to finish; its outcome is dropped
        slow.cancel()

    asyncio.run(scenario())


def test_streams_in_arrival_order_are_freed_when_they_end(no_collector):
    async def scenario() -> tuple[list, list[weakref.ref]]:
        streams = [(1, Frames("audio", 2, 0.02)), (0, Frames("text", 3, 0.005))]
        ctx = Context()
        got = [item async for _, item in in_arrival_order(streams, lambda k: k,
                                                          lambda step: watched(step, ctx.cancelled, 0.01))]
        refs = [weakref.ref(s) for _, s in streams] + [weakref.ref(ctx)]
        del streams, ctx
        return got, refs

    got, refs = asyncio.run(scenario())
    assert sorted(got) == ["audio0", "audio1", "text0", "text1", "text2"]
    assert got.index("text0") < got.index("audio0")
    assert [r() for r in refs] == [None, None, None]


def test_items_that_arrive_together_come_in_rank_order():
    async def scenario() -> list:
        streams = [(2, Frames("c", 1)), (0, Frames("a", 1)), (1, Frames("b", 1))]
        return [key async for key, _ in in_arrival_order(streams, lambda k: k, lambda step: step)]

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_closing_early_stops_the_running_steps():
    async def scenario() -> None:
        stopped = asyncio.Event()

        class Hanging:
            async def __aiter__(self):
                yield "first"
                try:
                    await asyncio.sleep(60)
                finally:
                    stopped.set()
                yield "never"

        merged = in_arrival_order([(0, Hanging())], lambda k: k, lambda step: step)
        assert await merged.__anext__() == (0, "first")
        await asyncio.sleep(0.01)      # the next step is running
        await asyncio.wait_for(merged.aclose(), 1)
        assert stopped.is_set()

    asyncio.run(scenario())


def test_a_second_cancellation_still_lets_the_running_steps_finish():
    """The consumer's task cancelled again while the merge stops its steps (a cancel message
    right after the client was seen gone): the steps still end before the merge does, so the
    stage streams can be closed after it (else: "aclose(): asynchronous generator is already
    running", and the stream's cleanup stops half way)."""
    async def scenario() -> None:
        class SlowToStop:
            async def __aiter__(self):
                yield "first"
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    await asyncio.sleep(0.2)   # closing a stage stream takes a round trip
                    raise
                yield "never"

        source = SlowToStop().__aiter__()

        class Once:
            def __aiter__(self):
                return source

        async def consume() -> None:   # as the entry reads its stages' streams
            merged = in_arrival_order([(0, Once())], lambda k: k, lambda step: step)
            try:
                async for _ in merged:
                    await asyncio.sleep(60)
            finally:
                await merged.aclose()

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()                  # the client left
        await asyncio.sleep(0.05)
        task.cancel()                  # and its cancel message came
        with pytest.raises(asyncio.CancelledError):
            await task
        await source.aclose()          # not running any more

    asyncio.run(scenario())


def test_the_periodic_release_frees_cycles(no_collector):
    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    a.audio = np.zeros(1 << 20, np.float32)
    ref = weakref.ref(a)
    del a, b
    assert ref() is not None        # a cycle: reference counting alone never frees it
    release_garbage_and_free_memory()
    assert ref() is None
