"""The response thread outlives a stream that stopped waiting for its send (its task cancelled)."""
from __future__ import annotations

import threading
import time

from omni_backend.triton.response_thread import ResponseThread


class Sender:
    """Stands in for a Triton response sender: records what was sent; the first send blocks
    until released, so a waiter can give up while its response is still queued."""

    def __init__(self):
        self.sent: list = []
        self.release = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        if not self.sent:
            self.release.wait(5)
        self.sent.append((response, flags))


def test_a_cancelled_waiter_does_not_stop_later_responses():
    errors: list[str] = []
    thread = ResponseThread("test", errors.append)
    sender = Sender()
    first = thread.send(sender, "a")
    queued = thread.send(sender, "b")
    assert queued.cancel()          # its stream's task was cancelled while "b" waited in the queue
    sender.release.set()
    first.result(5)
    later = thread.send(sender, "c", flags=1)
    later.result(5)                 # the thread is still there
    assert sender.sent == [("a", 0), ("b", 0), ("c", 1)]   # "b" still left, in order
    assert not errors
    thread.close()


def test_a_failed_send_is_reported_to_its_waiter_and_the_thread_goes_on():
    class Failing(Sender):
        def send(self, response=None, flags: int = 0) -> None:
            raise RuntimeError("the client is gone")
    errors: list[str] = []
    thread = ResponseThread("test", errors.append)
    failed = thread.send(Failing(), "x", flags=1)
    try:
        failed.result(5)
        raise AssertionError("the failure was not reported")
    except RuntimeError as e:
        assert "client is gone" in str(e)
    ok = Sender()
    ok.release.set()
    thread.send(ok, "y").result(5)
    assert ok.sent == [("y", 0)] and len(errors) == 1
    thread.close()


def test_stalled_for_counts_only_while_responses_wait_with_none_leaving():
    thread = ResponseThread("test", lambda _: None)
    sender = Sender()
    time.sleep(0.3)
    assert thread.stalled_for() == 0.0          # idle is not stalled, however long
    first = thread.send(sender, "a")            # blocks in send until released
    thread.send(sender, "b")
    time.sleep(0.5)
    assert 0.4 <= thread.stalled_for() < 2.0    # counted from when the queue filled
    sender.release.set()
    first.result(5)
    thread.send(sender, "c").result(5)
    assert thread.stalled_for() == 0.0
    thread.close()
