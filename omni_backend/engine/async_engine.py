"""An asyncio-friendly wrapper around :class:`AREngine` (Triton-free).

A background thread runs ``engine.step()`` while requests exist and sleeps otherwise. Each
request gets a :class:`FrameStream`, an async iterator of its :class:`FrameEvent`\\ s that ends
after the request's last event. Frames are handed to the request's event loop as soon as the
step that made them returns.

    engine = AsyncEngine(AREngine(runner, num_threads=2))
    stream = engine.add_request("req-1", prompt, params)   # inside a running event loop
    async for event in stream:
        ...  # event.codes, event.finished, event.finish_reason
    engine.cancel("req-1")                                 # or: await stream.aclose()
    engine.close()

A request added with ``after_event=fn`` has ``fn(event)`` called in the engine thread on each of its
events before the event is delivered: side work on a request's frames (a codec decoding its own
windows) runs there between steps, in turn with them, instead of in another thread of the process
that would contend with the steps for the GIL. An exception in it ends the request with that error.
An event for which ``fn`` returns False is not delivered (its last event always is): a consumer
that only reads the side work's results is woken when there is one, not once per frame, and each
wake-up it is spared is a GIL hand-over the engine thread does not wait for.

A request added with ``input_open=True`` takes more input with ``append_input`` (thread-safe).
While every running request waits for input the thread sleeps until input, a new request or a
cancellation wakes it (or ``IDLE_POLL_S`` passes: the engine's input-wait bound is checked then).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable, Optional

from .ar_engine import AREngine
from .sequence import FrameEvent, SamplingParams

__all__ = ["AsyncEngine", "FrameStream", "EngineClosedError"]

logger = logging.getLogger(__name__)

IDLE_POLL_S = 0.05


class EngineClosedError(RuntimeError):
    pass


class FrameStream:
    """The events of one request, in order; the last one has ``finished=True``."""

    def __init__(self, engine: "AsyncEngine", request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._held: BaseException | None = None   # an error met by drain(), raised by the next __anext__
        self.finished = False

    def _push(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> "FrameStream":
        return self

    async def __anext__(self) -> FrameEvent:
        if self.finished:
            raise StopAsyncIteration
        if self._held is not None:
            self.finished = True
            raise self._held
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def drain(self) -> list[FrameEvent]:
        """The events already delivered, without waiting (a consumer that handles them together
        saves a wake-up per token); an error among them is raised by the next ``__anext__``."""
        events = []
        while not self.finished and self._held is None and not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, BaseException):
                self._held = item
                break
            events.append(item)
            if item.finished:
                self.finished = True
        return events

    def cancel(self) -> bool:
        return self._engine.cancel(self.request_id)

    async def aclose(self) -> None:
        """Cancel the request if it is still running and drain its events."""
        if self.finished:
            return
        self.cancel()
        async for _ in self:
            pass


class AsyncEngine:
    def __init__(self, engine: AREngine, start: bool = True) -> None:
        self.engine = engine
        self._streams: dict[str, FrameStream] = {}
        self._after_event: dict[str, Callable[[FrameEvent], Optional[bool]]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        if start:
            self.start()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ar-engine", daemon=True)
            self._thread.start()

    def add_request(self, request_id: str, prompt: Any, params: Optional[SamplingParams] = None,
                    input_open: bool = False,
                    after_event: Optional[Callable[[FrameEvent], Optional[bool]]] = None) -> FrameStream:
        """Queue a request (call from a running event loop). Bad parameters raise here.
        ``after_event``: called in the engine thread on each of its events before delivery (an
        event it returns False for is not delivered, unless it is the last)."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        loop = asyncio.get_running_loop()
        stream = FrameStream(self, request_id, loop)
        with self._lock:
            self.engine.add_request(request_id, prompt, params, input_open=input_open)
            self._streams[request_id] = stream
            if after_event is not None:
                self._after_event[request_id] = after_event
        self._wake.set()
        return stream

    def append_input(self, request_id: str, data: Any, end: bool = False) -> bool:
        """Thread-safe: more input for a request added with ``input_open`` (see AREngine)."""
        accepted = self.engine.append_input(request_id, data, end)
        self._wake.set()
        return accepted

    def cancel(self, request_id: str) -> bool:
        """Thread-safe; the request's stream ends with a ``cancelled`` event."""
        cancelled = self.engine.cancel(request_id)
        self._wake.set()
        return cancelled

    @property
    def num_requests(self) -> int:
        with self._lock:
            return len(self._streams)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; every open stream ends with ``EngineClosedError``."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
            self._after_event.clear()
        for stream in streams:
            self._deliver(stream, EngineClosedError("the engine was closed"))

    async def __aenter__(self) -> "AsyncEngine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    # -- engine thread
    def _deliver(self, stream: FrameStream, item: Any) -> None:
        try:
            stream._loop.call_soon_threadsafe(stream._push, item)
        except RuntimeError:  # the stream's loop is closed: nobody is listening
            pass

    def _run(self) -> None:
        while not self._closed:
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                events = self.engine.step()
            except Exception as exc:  # a bug in the engine itself: fail every open stream
                logger.exception("engine step failed")
                with self._lock:
                    streams, self._streams = list(self._streams.values()), {}
                    self._after_event.clear()
                for stream in streams:
                    self.engine.cancel(stream.request_id)
                    self._deliver(stream, exc)
                continue
            for event in events:
                with self._lock:
                    stream = (self._streams.pop(event.request_id, None) if event.finished
                              else self._streams.get(event.request_id))
                    after = (self._after_event.pop(event.request_id, None) if event.finished
                             else self._after_event.get(event.request_id))
                if stream is None:
                    continue
                if after is not None:
                    try:
                        if after(event) is False and not event.finished:
                            continue
                    except Exception as exc:  # noqa: BLE001 - the request's own side work: it ends with it
                        if not event.finished:
                            with self._lock:
                                self._streams.pop(event.request_id, None)
                                self._after_event.pop(event.request_id, None)
                            self.engine.cancel(event.request_id)
                        self._deliver(stream, exc)
                        continue
                self._deliver(stream, event)
            if self.engine.idle and not events:   # every running request waits for input
                self._wake.wait(timeout=IDLE_POLL_S)
                self._wake.clear()
