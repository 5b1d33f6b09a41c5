"""AsyncEngine: concurrent streams get the same frames as the synchronous engine, frames arrive
while the request is still running, cancel ends a stream, close fails open streams."""
from __future__ import annotations

import asyncio

import pytest

from omni_backend.engine import AsyncEngine, EngineClosedError, SamplingParams
from omni_backend.models.qwen3_tts.runner import create_engine


pytestmark = pytest.mark.usefixtures("qwen3_threads")


@pytest.fixture(scope="module")
def cv(qwen3_loaded, qwen3_tiny_cv):
    return qwen3_loaded(qwen3_tiny_cv)


def test_streams_match_sync_engine(cv):
    builder = cv.prompt_builder()
    requests = [(f"r{i}", builder.build(text, speaker=spk, language="auto"), SamplingParams.greedy(max_new_tokens=n))
                for i, (text, spk, n) in enumerate([("Hello there.", "ryan", 8), ("你好。", "eric", 6),
                                                    ("How are you today?", "vivian", 10)])]
    expected = create_engine(cv, max_num_seqs=4, max_model_len=128, num_threads=1).generate(requests)

    async def main():
        engine = AsyncEngine(create_engine(cv, max_num_seqs=4, max_model_len=128, num_threads=1))
        try:
            async def consume(req):
                frames, seen_running = [], False
                async for event in engine.add_request(*req):
                    if event.codes is not None:
                        frames.append(event.codes)
                    seen_running |= not event.finished
                    last = event
                assert last.finished and last.finish_reason == "length" and seen_running
                return req[0], frames

            results = dict(await asyncio.gather(*(consume(r) for r in requests)))
            assert engine.num_requests == 0
            return results
        finally:
            engine.close()

    assert asyncio.run(main()) == expected


def test_cancel_and_close(cv):
    prompt = cv.prompt_builder().build("A long request that we will cancel.", speaker="ryan")

    async def main():
        engine = AsyncEngine(create_engine(cv, max_num_seqs=2, max_model_len=256, num_threads=1))
        stream = engine.add_request("long", prompt, SamplingParams.greedy(max_new_tokens=200))
        first = await stream.__anext__()
        assert first.codes is not None and not first.finished
        assert stream.cancel()
        rest = [event async for event in stream]
        assert rest[-1].finished and rest[-1].finish_reason == "cancelled"
        assert len(rest) < 50 and stream.finished
        # aclose() cancels and drains
        other = engine.add_request("other", prompt, SamplingParams.greedy(max_new_tokens=200))
        await other.__anext__()
        await other.aclose()
        assert other.finished
        # close() fails streams still open
        third = engine.add_request("third", prompt, SamplingParams.greedy(max_new_tokens=200))
        await asyncio.get_running_loop().run_in_executor(None, engine.close)
        with pytest.raises(EngineClosedError):
            async for _ in third:
                pass
        with pytest.raises(EngineClosedError):
            engine.add_request("late", prompt, SamplingParams.greedy())
        fresh = AsyncEngine(create_engine(cv, max_num_seqs=1, max_model_len=64, num_threads=1))
        with pytest.raises(ValueError):
            fresh.add_request("bad", prompt, SamplingParams(max_new_tokens=0))
        fresh.close()

    asyncio.run(main())


def test_after_event_runs_in_the_engine_thread_before_delivery(cv):
    """`after_event` sees each event of its request, in the engine's thread, before the stream
    does; an exception in it ends that request with it, and the others run on unchanged."""
    import threading

    builder = cv.prompt_builder()
    prompt = builder.build("Hello there.", speaker="ryan")
    seen: list[tuple[int, str]] = []

    def after(event):
        seen.append((event.index, threading.current_thread().name))

    def failing(event):
        if event.index == 2:
            raise ValueError("side work failed")

    async def main():
        engine = AsyncEngine(create_engine(cv, max_num_seqs=4, max_model_len=128, num_threads=1))
        try:
            async def consume(rid, hook):
                out = []
                async for event in engine.add_request(rid, prompt, SamplingParams.greedy(max_new_tokens=6),
                                                      after_event=hook):
                    if hook is after:   # the hook ran on this event before it arrived
                        assert event.index in [i for i, _ in seen]
                    out.append(event.codes)
                return out

            plain, hooked, failed = await asyncio.gather(consume("a", None), consume("b", after),
                                                         consume("c", failing), return_exceptions=True)
            assert engine.num_requests == 0
            return plain, hooked, failed
        finally:
            engine.close()

    plain, hooked, failed = asyncio.run(main())
    assert hooked == plain and len(plain) >= 3   # so the failing hook met index 2
    assert [i for i, _ in seen] == list(range(len(plain))) and {name for _, name in seen} == {"ar-engine"}
    assert isinstance(failed, ValueError) and str(failed) == "side work failed"


def test_events_the_hook_declines_are_not_delivered(cv):
    """`after_event` returning False keeps that event from the stream (its consumer is woken only
    for what it reads); the last event is delivered whatever the hook says."""
    prompt = cv.prompt_builder().build("Hello there.", speaker="ryan")
    hooked: list[int] = []

    def every_third(event):
        hooked.append(event.index)
        return event.index % 3 == 0

    async def main():
        engine = AsyncEngine(create_engine(cv, max_num_seqs=2, max_model_len=128, num_threads=1))
        try:
            params = SamplingParams.greedy(max_new_tokens=8)
            plain = [e async for e in engine.add_request("a", prompt, params)]
            kept = [e async for e in engine.add_request("b", prompt, params, after_event=lambda e: False)]
            some = [e async for e in engine.add_request("c", prompt, params, after_event=every_third)]
            return plain, kept, some
        finally:
            engine.close()

    plain, kept, some = asyncio.run(main())
    assert len(plain) >= 5 and plain[-1].finished
    assert [(e.index, e.finished) for e in kept] == [(plain[-1].index, True)]
    assert hooked == [e.index for e in plain]
    assert [e.index for e in some] == [e.index for e in plain if e.index % 3 == 0 or e.finished]
    assert [e.codes for e in some] == [e.codes for e in plain if e.index % 3 == 0 or e.finished]
