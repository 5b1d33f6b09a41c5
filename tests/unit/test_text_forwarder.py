"""The entry's text appends (omni_backend/triton/text_input.py): pieces reach the stages in
order; a stream that ends answers every append still waiting, the one on its way included
(that one used to wait for ever: its append request, and the client's, never returned)."""
from __future__ import annotations

import asyncio

import pytest

from omni_backend.errors import InvalidRequest
from omni_backend.triton.text_input import TextForwarder, TextInputs


class Target:
    def __init__(self, hang: bool = False):
        self.got: list[tuple[str, bool]] = []
        self.hang = hang
        self.reached = asyncio.Event()

    async def append_text(self, text: str, end: bool) -> None:
        self.reached.set()
        if self.hang:
            await asyncio.sleep(3600)
        self.got.append((text, end))


def test_pieces_reach_every_stage_in_order_and_the_end_closes_the_text():
    async def run():
        a, b = Target(), Target()
        forwarder = TextForwarder([a, b])
        await asyncio.gather(*(forwarder.send(p, p == "c") for p in "abc"))
        with pytest.raises(InvalidRequest, match="text has ended"):
            await forwarder.send("d", False)
        await forwarder.aclose()
        return a.got, b.got
    a, b = asyncio.run(run())
    assert a == b == [("a", False), ("b", False), ("c", True)]


def test_a_stream_that_ends_answers_the_append_on_its_way_and_those_queued():
    async def run():
        target = Target(hang=True)
        inputs = TextInputs()
        forwarder = inputs.register("r1", [target])
        on_its_way = asyncio.ensure_future(forwarder.send("first", False))
        await target.reached.wait()
        queued = asyncio.ensure_future(forwarder.send("second", False))
        await asyncio.sleep(0)
        await asyncio.wait_for(inputs.unregister("r1", forwarder), 5)
        results = await asyncio.wait_for(asyncio.gather(on_its_way, queued, return_exceptions=True), 5)
        return results, inputs.open
    results, still_open = asyncio.run(run())
    assert still_open == {}
    for result in results:
        assert isinstance(result, InvalidRequest) and result.field == "request_id", result
        assert "ended before this text reached it" in str(result)
