"""A WebSocket utterance whose Triton stream fails in a way nobody coded (a raw gRPC error on a
text append, a gRPC call cancelled under it, a bug): the client is told with a coded error, gets
audio.done with `error: true` and the utterance's session.done, and the session goes on. Before,
such a failure left the client without any of them until the idle timeout closed the connection
(client/speech_api/speech_stream.py, pool.py, client/triton_stream.py)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from client.speech_api.config import StreamLimits
from client.speech_api.errors import ApiError
from client.speech_api.pool import PoolTextStream, TritonEndpoint
from client.speech_api.speech_stream import Utterance
from client.speech_api.stream_config import error_message
from client.triton_stream import TritonStreamError, acontrol


class RawRpcError(grpc.RpcError):
    """What grpc.aio raises when a call fails: an RpcError with a status code."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Socket closed"


class Stream:
    """The audio side of a text stream: one chunk, then waits until the text has ended."""

    def __init__(self, append_error: BaseException | None, audio_error: BaseException | None = None,
                 frame_limit: bool = False):
        self.append_error, self.audio_error = append_error, audio_error
        self.frame_limit = frame_limit   # the audio ends without waiting for the text's end
        self.ended = asyncio.Event()
        self.appended: list[str] = []
        self.endpoint = None

    async def append(self, text: str) -> None:
        if self.append_error is not None:
            raise self.append_error
        self.appended.append(text)

    async def end(self) -> None:
        self.ended.set()

    async def chunks(self):
        yield np.zeros(480, np.float32), 24000
        if self.audio_error is not None:
            raise self.audio_error
        if not self.frame_limit:
            await self.ended.wait()


class Admitted:
    def __init__(self, stream: Stream):
        self.stream = stream
        self.access: dict = {}
        self.sample_rate = None
        self.audio_samples = 0
        self.closed = False

    async def open_text(self, first: str, params: dict, prefer=None) -> Stream:
        return self.stream

    async def open(self, text: str, params: dict, prefer=None) -> None:
        await self.stream.append(text)

    def finished(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


class Session:
    """What an Utterance uses of its session; records what the client would be sent."""

    def __init__(self, split: str, stream: Stream):
        self.config = SimpleNamespace(split=split, response_format="pcm", transport="binary", sample_rate=None,
                                      request=SimpleNamespace(params={}, speed=SimpleNamespace(stretch=1.0)))
        self.limits = StreamLimits()
        self.home = None
        self.session_id = "test"
        self.sent: list = []
        self.admitted: list[Admitted] = []
        self.stream = stream
        self.stopped: BaseException | None = None

    def admit(self, request) -> Admitted:
        self.admitted.append(Admitted(self.stream))
        return self.admitted[-1]

    async def send_json(self, payload: dict) -> None:
        self.sent.append(payload)

    async def send_error(self, error: ApiError) -> None:
        self.sent.append(error_message(error))

    async def send_audio(self, config, data: bytes, *rest) -> None:
        self.sent.append(data)

    def log_access(self, admitted, spoken) -> None:
        pass

    def stop(self, failure: BaseException) -> None:
        self.stopped = failure


def _speak(split: str, stream: Stream, pieces: list[str]) -> Session:
    async def run() -> Session:
        session = Session(split, stream)
        utterance = Utterance(session, 0, None)
        for piece in pieces:
            utterance.add_text(piece)
            await asyncio.sleep(0.01)
        utterance.finish()
        await asyncio.wait_for(utterance.task, 10)
        return session
    return asyncio.run(run())


def _messages(session: Session) -> list[dict]:
    return [m for m in session.sent if isinstance(m, dict)]


FAILURES = {   # what the append raises, the code and message the client is told
    "grpc error": (RawRpcError(), "internal", "internal: RawRpcError"),
    "a bug": (RuntimeError("boom"), "internal", "internal: RuntimeError: boom"),
    "triton's error": (TritonStreamError("unavailable: the server is restarting"), "unavailable",
                       "unavailable: the server is restarting"),
    # grpc.aio ends a call cancelled by anyone with CancelledError: the feeder must not end "cancelled"
    "grpc's cancel": (asyncio.CancelledError(), "unavailable", "unavailable: a gRPC call to Triton was cancelled"),
}


@pytest.mark.parametrize("failure,code,told", list(FAILURES.values()), ids=list(FAILURES))
def test_an_append_that_fails_ends_the_utterance_with_a_coded_error(failure, code, told):
    session = _speak("append", Stream(failure), ["Hello there, ", "how are ", "you?"])
    messages = _messages(session)
    assert [m["type"] for m in messages] == ["audio.start", "error", "audio.done", "session.done"], messages
    error = messages[1]
    assert error["code"] == code and told in error["message"], error
    assert messages[2]["error"] is True and messages[3]["utterance_index"] == 0
    assert session.stopped is None and session.admitted[0].closed


def test_an_audio_stream_that_fails_with_a_bug_is_told_in_every_split():
    for split in ("append", "sentence", "none"):
        session = _speak(split, Stream(None, RuntimeError("boom")), ["One. ", "Two."])
        messages = _messages(session)
        kinds = [m["type"] for m in messages]
        assert kinds[-1] == "session.done" and "error" in kinds, (split, messages)
        errors = [m for m in messages if m["type"] == "error"]
        assert all(e["code"] == "internal" and "RuntimeError: boom" in e["message"] for e in errors), errors
        assert all(m["error"] for m in messages if m["type"] == "audio.done"), messages


def test_a_failure_outside_a_unit_still_ends_the_utterance_after_its_input_done():
    """A failure before any unit ran (here: the admission itself) is told; session.done still
    comes after the client's input.done, not before it."""
    async def run() -> Session:
        session = Session("sentence", Stream(None))

        def broken_admit(request):
            raise RuntimeError("admission broke")
        session.admit = broken_admit
        utterance = Utterance(session, 0, None)
        utterance.add_text("One. Two. ")
        await asyncio.sleep(0.05)
        assert not utterance.task.done()      # still takes text until input.done
        utterance.add_text("Three.")
        utterance.finish()
        await asyncio.wait_for(utterance.task, 10)
        return session
    messages = _messages(asyncio.run(run()))
    assert [m["type"] for m in messages] == ["audio.start", "error", "session.done"], messages
    assert "admission broke" in messages[1]["message"]


def test_a_text_append_whose_channel_fails_is_a_503_and_marks_its_server_down():
    async def run():
        endpoint = TritonEndpoint("localhost:1")
        endpoint.healthy = True
        stream = PoolTextStream.__new__(PoolTextStream)
        stream.endpoint = endpoint

        async def raw():
            raise RawRpcError()

        async def refused():
            raise TritonStreamError("invalid_request: text: is empty")
        with pytest.raises(ApiError) as gone:
            await stream._control(raw())
        with pytest.raises(ApiError) as bad:
            await stream._control(refused())
        return endpoint, gone.value, bad.value
    endpoint, gone, bad = asyncio.run(run())
    assert gone.status == 503 and "went away while taking text" in str(gone) and not endpoint.healthy
    assert bad.status == 400 and str(bad) == "input: is empty"


class CancelledCall:
    """A stream_infer call that grpc.aio ended as cancelled (a closed channel)."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise asyncio.CancelledError()

    def cancel(self) -> None:
        pass


def test_a_control_call_cancelled_by_grpc_is_unavailable_but_our_own_cancel_propagates():
    client = SimpleNamespace(stream_infer=lambda inputs_iterator: CancelledCall())

    async def foreign():
        with pytest.raises(TritonStreamError) as e:
            await acontrol(client, "m", "append", "r-append-1", "more", {"request_id": "r", "end": False})
        return e.value

    error = asyncio.run(foreign())
    assert error.code == "unavailable" and "cancelled" in str(error)

    async def ours():
        task = asyncio.ensure_future(acontrol(client, "m", "append", "r-append-1", "more", {"request_id": "r"}))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(ours())


def test_an_append_utterance_that_failed_ends_at_the_clients_input_done():
    """The client is told at once (error, audio.done); text it sends before its input.done has
    nowhere to go, and session.done follows input.done as after a success."""
    async def run() -> tuple[Session, bool]:
        session = Session("append", Stream(RuntimeError("boom")))
        utterance = Utterance(session, 0, None)
        utterance.add_text("Hello there, ")
        utterance.add_text("more text")
        for _ in range(200):
            if any(isinstance(m, dict) and m["type"] == "audio.done" for m in session.sent):
                break
            await asyncio.sleep(0.01)
        waiting = not utterance.task.done()
        utterance.add_text("and more")
        utterance.finish()
        await asyncio.wait_for(utterance.task, 10)
        return session, waiting
    session, waiting = asyncio.run(run())
    assert waiting
    assert [m["type"] for m in _messages(session)] == ["audio.start", "error", "audio.done", "session.done"]


def test_text_after_an_append_request_reached_its_frame_limit_is_no_error():
    """The request ends at its frame limit while text still comes: appends to it are refused
    (the stream is gone), which is no failure of the utterance: its audio is complete."""
    async def run() -> Session:
        ended = TritonStreamError("invalid_request: request_id: no open stream 'ws-1' takes text on this instance "
                                  "(it ended, or was not opened with streaming_input)")
        session = Session("append", Stream(ended, frame_limit=True))
        utterance = Utterance(session, 0, None)
        utterance.add_text("Hello there, ")
        await asyncio.sleep(0.05)
        utterance.add_text("text past the limit")
        await asyncio.sleep(0.05)
        assert not utterance.task.done()   # the utterance takes text until input.done
        utterance.finish()
        await asyncio.wait_for(utterance.task, 10)
        return session
    session = asyncio.run(run())
    messages = _messages(session)
    assert [m["type"] for m in messages] == ["audio.start", "audio.done", "session.done"], messages
    assert messages[1]["error"] is False and messages[1]["sentence_text"] == "Hello there, text past the limit"
    assert any(isinstance(m, bytes) for m in session.sent)
