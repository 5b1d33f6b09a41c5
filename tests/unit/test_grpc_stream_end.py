"""A client's gRPC stream to Triton: a complete request's stream is left for Triton to end (a
cancelled one leaves state in tritonserver 2.51); one still running, or one that does not end, is
cancelled."""
from __future__ import annotations

import asyncio

from omni_backend.grpc_streams import end_stream


class Call:
    """The part of a `stream_infer` call that end_stream uses: iteration and cancel()."""

    def __init__(self, rest: int, hang: bool = False):
        self.rest, self.hang, self.cancelled, self.read = rest, hang, False, 0

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.rest == 0:
            if self.hang:
                await asyncio.sleep(3600)
            raise StopAsyncIteration
        self.rest -= 1
        self.read += 1
        return None, None


def test_a_complete_stream_is_read_to_its_end_not_cancelled():
    call = Call(rest=1)   # what the server sends after the final response, then its status
    asyncio.run(end_stream(call, complete=True))
    assert call.read == 1 and not call.cancelled


def test_a_running_stream_is_cancelled():
    call = Call(rest=5)
    asyncio.run(end_stream(call, complete=False))
    assert call.cancelled and call.read == 0


def test_a_complete_stream_that_does_not_end_is_cancelled_after_the_timeout():
    call = Call(rest=0, hang=True)
    asyncio.run(end_stream(call, complete=True, timeout_s=0.1))
    assert call.cancelled


def test_a_running_stream_asked_to_end_is_read_to_its_end_not_cancelled():
    call = Call(rest=3)   # responses in flight, the final one, then the stream's status
    asked = []

    async def ask() -> None:
        asked.append(True)
    asyncio.run(end_stream(call, complete=False, ask_to_end=ask))
    assert asked and call.read == 3 and not call.cancelled


def test_a_running_stream_whose_ask_is_refused_or_slow_is_cancelled():
    async def refused() -> None:
        raise RuntimeError("invalid_request: REQUEST_ID: 0 open streams")

    async def slow() -> None:
        await asyncio.sleep(3600)
    for ask in (refused, slow):
        call = Call(rest=3)
        asyncio.run(end_stream(call, complete=False, ask_to_end=ask, timeout_s=0.1))
        assert call.cancelled and call.read == 0


class CancelledByGrpc(Call):
    """A call whose rest grpc.aio ends as cancelled (a closed channel), not this task."""

    async def __anext__(self):
        raise asyncio.CancelledError()


def test_a_stream_that_grpc_cancels_while_it_is_read_to_its_end_is_cancelled_not_raised():
    """grpc.aio's CancelledError is no cancel of ours: it used to escape end_stream (and a
    control call's `finally`), so a WebSocket utterance's text feeder ended as if cancelled."""
    call = CancelledByGrpc(rest=0)
    asyncio.run(end_stream(call, complete=True))
    assert call.cancelled


def test_our_own_cancel_while_a_stream_is_read_to_its_end_propagates():
    async def run() -> None:
        call = Call(rest=0, hang=True)
        task = asyncio.ensure_future(end_stream(call, complete=True, timeout_s=10))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return
        raise AssertionError("our cancel was swallowed")
    asyncio.run(run())


class Endless(Call):
    """A running request's call: no response comes."""

    async def __anext__(self):
        await asyncio.sleep(3600)


class AnsweredAtOnce(Call):
    """The answer to a control request: the call ends at once."""

    async def __anext__(self):
        raise StopAsyncIteration


def test_a_consumer_that_is_cancelled_asks_the_entry_to_end_its_request_by_id():
    """The consumer's task cancelled while it waits (a client hanging up): the request is ended
    by a cancel message naming its id, not by cancelling the call (which leaves state in
    tritonserver 2.51); grpc.aio's own cancel has nobody to ask."""
    from types import SimpleNamespace

    from client.triton_stream import astream_parts

    calls: list = []

    def stream_infer(inputs_iterator):
        calls.append(Endless(rest=0) if not calls else AnsweredAtOnce(rest=0))
        return calls[-1]

    async def run() -> None:
        client = SimpleNamespace(stream_infer=stream_infer)

        async def consume() -> None:
            async for _ in astream_parts(client, "m", "Hello.", {}, watch_s=None):
                pass
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(run())
    assert len(calls) == 2   # the request, then the cancel message naming it
