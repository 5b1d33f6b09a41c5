"""A whole answer computed while the client is watched (client/speech_api/response.py): the
client leaving cancels it; grpc.aio cancelling a call under it is a coded 503, not a client gone
(which would have sent no response at all)."""
from __future__ import annotations

import asyncio

import pytest

from client.speech_api.errors import ApiError
from client.speech_api.response import WatchedResponse


async def _never_leaves() -> dict:
    await asyncio.sleep(3600)
    return {"type": "http.disconnect"}


async def _leaves() -> dict:
    await asyncio.sleep(0.01)
    return {"type": "http.disconnect"}


def _respond(answer, receive) -> tuple[list[dict], list[str]]:
    sent: list[dict] = []
    abandoned: list[str] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def abandon() -> None:
        abandoned.append("freed")

    async def run() -> None:
        await WatchedResponse(answer, "audio/wav", abandon=abandon)({}, receive, send)
    asyncio.run(run())
    return sent, abandoned


def test_an_answer_is_sent_whole():
    async def answer():
        return 200, {"content-length": "3"}, b"abc"
    sent, abandoned = _respond(answer(), _never_leaves)
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"abc" and not abandoned


def test_a_client_that_leaves_cancels_the_answer_and_frees_it():
    async def answer():
        await asyncio.sleep(3600)
    sent, abandoned = _respond(answer(), _leaves)
    assert sent == [] and abandoned == ["freed"]


def test_a_grpc_cancel_under_the_answer_is_a_503():
    async def answer():
        await asyncio.sleep(0.01)
        raise asyncio.CancelledError()   # what grpc.aio raises for a call cancelled by anyone
    with pytest.raises(ApiError) as e:
        _respond(answer(), _never_leaves)
    assert e.value.status == 503 and "cancelled" in str(e.value)
