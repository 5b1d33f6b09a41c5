"""A pulled stage stream answers each call with exactly one response, in order, and nothing it
keeps outlives its caller."""
from __future__ import annotations

import time

import pytest

from omni_backend.triton import pulled_stream
from omni_backend.triton.pulled_stream import FINAL, PulledStream
from omni_backend.triton.response_thread import ResponseThread


class Caller:
    """One BLS call's response sender: records what it was answered."""

    def __init__(self):
        self.sent: list = []

    def send(self, response=None, flags: int = 0) -> None:
        self.sent.append((response, flags))


@pytest.fixture
def responses():
    thread = ResponseThread("test", lambda message: None)
    yield thread
    thread.close()


def settle(thread: ResponseThread) -> None:
    thread.send(Caller()).result(5)   # everything queued before it has left


def test_the_opening_call_gets_the_first_response_and_each_pull_the_next(responses):
    opening = Caller()
    stream = PulledStream(opening, responses)
    stream.send("chunk 0")
    stream.send("chunk 1")
    stream.send("chunk 2")
    stream.send(None, FINAL)
    assert opening.sent == [("chunk 0", FINAL)]
    pulls = [Caller() for _ in range(3)]
    for pull in pulls:
        assert not stream.finished
        stream.pull(pull)
    settle(responses)
    assert [p.sent for p in pulls] == [[("chunk 1", FINAL)], [("chunk 2", FINAL)], [(None, FINAL)]]
    assert stream.finished


def test_a_pull_that_comes_first_waits_for_the_next_response(responses):
    stream = PulledStream(Caller(), responses)
    stream.send("chunk 0")
    pull = Caller()
    stream.pull(pull)
    settle(responses)
    assert pull.sent == []
    stream.send("chunk 1")
    assert pull.sent == [("chunk 1", FINAL)]
    later = Caller()
    stream.pull(later)
    stream.send(None, FINAL)
    assert later.sent == [(None, FINAL)]
    assert stream.finished


def test_a_stream_that_ends_at_once_answers_its_opening_call_with_the_end(responses):
    opening = Caller()
    stream = PulledStream(opening, responses)
    stream.send(None, FINAL)
    assert opening.sent == [(None, FINAL)]
    assert stream.finished


def test_closing_answers_the_waiting_call_and_drops_what_comes_later(responses):
    stream = PulledStream(Caller(), responses)
    stream.send("chunk 0")
    stream.send("kept")
    stream.close()
    assert stream.finished and stream.unclaimed_for() == 0.0
    pull = Caller()
    stream.pull(pull)                 # a pull after the caller left still gets an answer: the end
    stream.send("after close")
    settle(responses)
    assert pull.sent == [(None, FINAL)]


def test_a_caller_that_closes_while_its_pull_waits_gets_the_end(responses):
    stream = PulledStream(Caller(), responses)
    stream.send("chunk 0")
    pull = Caller()
    stream.pull(pull)
    stream.close()
    settle(responses)
    assert pull.sent == [(None, FINAL)]


def test_kept_responses_say_how_long_nobody_pulled_them(responses):
    stream = PulledStream(Caller(), responses)
    stream.send("chunk 0")
    assert stream.unclaimed_for() == 0.0
    stream.send("chunk 1")
    time.sleep(0.05)
    assert stream.unclaimed_for() >= 0.05
    stream.pull(Caller())
    assert stream.unclaimed_for() < 0.05          # the next one is newer
    stream.pull(Caller())
    assert stream.unclaimed_for() == 0.0
    assert pulled_stream.UNCLAIMED_S >= 30        # a live entry pulls far more often than that


def test_a_response_without_final_and_without_outputs_is_not_an_end(responses):
    opening = Caller()
    stream = PulledStream(opening, responses)
    stream.send(None, 0)
    assert opening.sent == [] and not stream.finished
