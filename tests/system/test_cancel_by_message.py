"""A client that leaves ends its stream by message (CONTROL=cancel naming the stream's request id):
the entry sends the stream's final response at once and frees its stages, and the gRPC stream
ends without a cancel (a cancelled gRPC stream leaves a few KB in tritonserver 2.51 for good)."""
from __future__ import annotations

import asyncio
import time

import pytest
import tritonclient.grpc.aio as aioclient

from client.triton_stream import TritonStreamError, acontrol, astream, astream_parts, stream, synthesize
from tests.metrics_scrape import metric, wait_for

LONG = " ".join(f"This is sentence number {i} of a long story." for i in range(40))


def run(coro):
    return asyncio.run(coro)


async def _first_part_then(triton, request_id: str, then):
    client = aioclient.InferenceServerClient(triton.grpc_url)
    try:
        parts = astream_parts(client, "hibari", LONG, None, request_id)
        first = await parts.__anext__()
        assert first.audio is not None and first.audio.size > 0
        try:
            return await then(client, parts)
        finally:
            await parts.aclose()
    finally:
        await client.close()


def test_a_cancel_message_ends_the_named_stream_at_once(triton):
    async def cancel_and_read_on(client, parts):
        before = metric(triton.metrics_url, "omni_requests_total", pipeline="hibari", outcome="cancelled")
        t0 = time.monotonic()
        await acontrol(client, "hibari", "cancel", "x-cancel", params={"request_id": "cancel-me"})
        rest = [p async for p in parts]    # what was on its way, then the final response
        return time.monotonic() - t0, len(rest), before
    took, rest, before = run(_first_part_then(triton, "cancel-me", cancel_and_read_on))
    # A chunk per sentence: the 40 would be 40 chunks. What still comes was made while the cancel
    # travelled (a sentence takes tens of ms on a loaded host) or was already on its way.
    assert took < 4.0 and rest <= 10, (took, rest)
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline="hibari") == 0
    assert wait_for(triton.metrics_url, "omni_stage_active_requests", 0, model="hibari__synthesizer") == 0
    assert metric(triton.metrics_url, "omni_requests_total", pipeline="hibari", outcome="cancelled") == before + 1
    assert synthesize(triton.grpc_url, "hibari", "Still serving.").audio_s > 0.3


@pytest.mark.parametrize("params, field", [
    ({"request_id": "no-such-stream"}, "request_id"),
    ({"request_id": ""}, "params"),
    ({"request_id": 7}, "params"),
    ({"request_id": "x", "end": True}, "params"),
    ({}, "params"),
])
def test_a_cancel_that_names_no_single_stream_is_refused_and_touches_none(triton, params, field):
    async def bad_cancel(client, parts):
        with pytest.raises(TritonStreamError) as e:
            await acontrol(client, "hibari", "cancel", "bad-cancel", params=params)
        nxt = await asyncio.wait_for(parts.__anext__(), 60)   # the running stream goes on
        return str(e.value), nxt
    message, nxt = run(_first_part_then(triton, "running-one", bad_cancel))
    assert message.startswith(f"invalid_request: {field}:"), message
    assert nxt.audio is not None and nxt.audio.size > 0


def test_two_streams_with_one_id_are_not_cancelled_by_message(triton):
    async def both():
        client = aioclient.InferenceServerClient(triton.grpc_url)
        a = astream_parts(client, "hibari", LONG, None, "same-id")
        b = astream_parts(client, "hibari", LONG, None, "same-id")
        try:
            await a.__anext__()
            await b.__anext__()
            with pytest.raises(TritonStreamError) as e:
                await acontrol(client, "hibari", "cancel", "c", params={"request_id": "same-id"})
            return str(e.value), (await a.__anext__()).audio.size, (await b.__anext__()).audio.size
        finally:
            await a.aclose()
            await b.aclose()
            await client.close()
    message, a_more, b_more = run(both())
    assert message.startswith("invalid_request: request_id:") and "2 open streams" in message
    assert a_more > 0 and b_more > 0
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline="hibari") == 0


class RecordingClient:
    """The real aio client; remembers each call it opened and whether the client cancelled it."""

    def __init__(self, url: str):
        self.client = aioclient.InferenceServerClient(url)
        self.calls: list = []
        self.cancelled: list[bool] = []

    def stream_infer(self, **kwargs):
        call = self.client.stream_infer(**kwargs)
        index = len(self.calls)
        self.calls.append(call)
        self.cancelled.append(False)
        real_cancel = call.cancel

        def cancel():
            self.cancelled[index] = True
            return real_cancel()
        call.cancel = cancel
        return call


@pytest.mark.parametrize("request_id, by_message", [("", True), ("given-id", False)])
def test_a_client_leaving_early_ends_its_stream_by_message_when_its_id_is_its_own(triton, request_id, by_message):
    """`astream` without a request id makes a unique one, so its early close asks the entry to
    end the stream and reads it to its end; with a caller's id (which may repeat) it cancels."""
    async def leave():
        recording = RecordingClient(triton.grpc_url)
        try:
            chunks = astream(recording, "hibari", LONG, None, request_id)
            async for _ in chunks:
                break
            t0 = time.monotonic()
            await chunks.aclose()
            return time.monotonic() - t0, recording.cancelled
        finally:
            await recording.client.close()
    before = metric(triton.metrics_url, "omni_requests_total", pipeline="hibari", outcome="cancelled")
    took, cancelled = run(leave())
    assert took < 4.0
    if by_message:
        assert cancelled == [False, False]   # the stream, then the cancel request: both ended by Triton
    else:
        assert cancelled == [True]
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline="hibari") == 0
    assert wait_for(triton.metrics_url, "omni_requests_total", before + 1, pipeline="hibari",
                    outcome="cancelled") == before + 1


@pytest.mark.parametrize("leave_early", [True, False])
def test_the_synchronous_stream_ends_by_message_and_is_never_cancelled(triton, monkeypatch, leave_early):
    """`stream` asks the entry to end a stream left early, on that same gRPC stream, and closes
    it without a gRPC cancel; a whole stream is closed without asking."""
    import tritonclient.grpc as grpcclient
    stops: list[bool] = []
    real_stop = grpcclient.InferenceServerClient.stop_stream

    def stop_stream(self, cancel_requests=False):
        stops.append(cancel_requests)
        return real_stop(self, cancel_requests=cancel_requests)
    monkeypatch.setattr(grpcclient.InferenceServerClient, "stop_stream", stop_stream)
    before = metric(triton.metrics_url, "omni_requests_total", pipeline="hibari", outcome="cancelled")
    chunks = stream(triton.grpc_url, "hibari", LONG if leave_early else "Short and whole.")
    if leave_early:
        audio, _ = next(chunks)
        t0 = time.monotonic()
        chunks.close()
        assert audio.size and time.monotonic() - t0 < 4.0
    else:
        assert sum(a.size for a, _ in chunks) > 0
    assert stops and True not in stops   # close() stops the stream again, never cancelling
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline="hibari") == 0
    expected = before + 1 if leave_early else before
    assert wait_for(triton.metrics_url, "omni_requests_total", expected, pipeline="hibari",
                    outcome="cancelled") == expected


def test_a_whole_stream_is_neither_cancelled_nor_asked_to_end(triton):
    async def whole():
        recording = RecordingClient(triton.grpc_url)
        try:
            audio = [a async for a, _ in astream(recording, "hibari", "Short and whole.")]
            return audio, recording.cancelled
        finally:
            await recording.client.close()
    audio, cancelled = run(whole())
    assert audio and cancelled == [False]


def test_many_clients_leaving_by_message_at_once_leave_the_entry_serving(triton):
    """A stream's task is cancelled while it may be waiting for a response to leave; that once
    killed the entry's response thread and every later response of the pipeline waited for ever."""
    async def storm():
        client = aioclient.InferenceServerClient(triton.grpc_url)

        async def leave() -> None:
            chunks = astream(client, "hibari", "One short sentence. And a second one.")
            async for _ in chunks:
                break
            await chunks.aclose()
        try:
            for _ in range(5):
                await asyncio.wait_for(asyncio.gather(*(leave() for _ in range(8))), 120)
        finally:
            await client.close()
    run(storm())
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline="hibari") == 0
    assert synthesize(triton.grpc_url, "hibari", "Still serving after the storm.").audio_s > 0.5
