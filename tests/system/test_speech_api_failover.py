"""Two tritonservers behind one shim: streams spread over both, a killed server costs new
requests nothing, streams on it end with an error event, and it rejoins when it is back."""
from __future__ import annotations

import contextlib
import json
import os
import signal

import httpx
import pytest

from client.speech_api.process import ShimProcess
from tests.served_pipeline import running
from tests.system.speech_api_helpers import LONG_TEXT, hibari_repository, metric, wait_for

pytest_plugins = ["tests.system.speech_api_fixtures"]
pytestmark = pytest.mark.system

SHORT = {"model": "tts-1", "voice": "alloy", "input": "Failover check.", "response_format": "wav"}


@pytest.fixture(scope="module")
def second_triton(tmp_path_factory):
    base = tmp_path_factory.mktemp("second_triton")
    with running(hibari_repository(base / "model_repository"), base / "tritonserver.log") as server:
        yield server


@pytest.fixture(scope="module")
def pair_shim(triton, second_triton, tmp_path_factory):
    log = tmp_path_factory.mktemp("pair_shim") / "shim.log"
    server = ShimProcess([triton.grpc_url, second_triton.grpc_url], log_path=log,
                         extra_args=["--probe-interval", "0.5"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def served(server: TritonProcess) -> float:
    return metric(server, "omni_requests_total", pipeline="hibari", outcome="ok")


def health(shim: ShimProcess) -> dict[str, dict]:
    return {t["url"]: t for t in httpx.get(f"{shim.url}/health").json()["tritons"]}


def speak(shim: ShimProcess) -> httpx.Response:
    r = httpx.post(f"{shim.url}/v1/audio/speech", json=SHORT, timeout=30)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) > 10000
    return r


@contextlib.contextmanager
def sse_stream(client: httpx.Client, shim: ShimProcess):
    with client.stream("POST", f"{shim.url}/v1/audio/speech",
                       json={"model": "hibari", "voice": "heart", "input": LONG_TEXT, "speed": 0.5,
                             "response_format": "pcm", "stream_format": "sse"}) as response:
        assert response.status_code == 200
        yield response.iter_lines()


def next_event(lines) -> dict:
    for line in lines:
        if line.startswith("data: "):
            return json.loads(line[len("data: "):])
    return {"type": "eof"}


def race(streams: list) -> tuple[int, list[int]]:
    """Read the streams in turn, one event each, until one ends; return its index and how many
    deltas each delivered. Events already on their way from a killed server still arrive first:
    the shim may hold several sentences of its audio (0.5 s a delta) when the server dies. The
    survivor's stream ends with `done` only after every sentence: should the dead server's stream
    not end first with an error, that `done` fails the assertion below."""
    deltas = [0] * len(streams)
    while True:
        for i, lines in enumerate(streams):
            event = next_event(lines)
            if event["type"] != "speech.audio.delta":
                assert event["type"] == "speech.audio.error", (event, deltas)
                assert event["error"]["type"] == "server_error", event
                return i, deltas
            deltas[i] += 1


def test_spread_failover_and_rejoin(triton, second_triton, pair_shim):
    a, b = triton.grpc_url, second_triton.grpc_url
    assert all(h["healthy"] for h in health(pair_shim).values())

    # idle servers take turns
    before_a, before_b = served(triton), served(second_triton)
    for _ in range(4):
        speak(pair_shim)
    # a request is counted as its entry finishes it, just after the last audio leaves
    assert wait_for(lambda: served(triton) - before_a == 2 and served(second_triton) - before_b == 2, 5)

    with httpx.Client(timeout=60) as one, httpx.Client(timeout=60) as two:
        with sse_stream(one, pair_shim) as first, sse_stream(two, pair_shim) as second:
            assert next_event(first)["type"] == next_event(second)["type"] == "speech.audio.delta"
            # fewest active streams first: one stream on each server
            assert [h["active_streams"] for h in health(pair_shim).values()] == [1, 1]

            os.killpg(second_triton.proc.pid, signal.SIGKILL)

            # the stream that was on the dead server ends with an error event; the other goes on
            dead, _ = race([first, second])
            survivor = [first, second][1 - dead]
            assert [next_event(survivor)["type"] for _ in range(3)] == ["speech.audio.delta"] * 3
    second_triton.stop()

    # new requests succeed at once, on the survivor, before and after the prober notices
    before_a = served(triton)
    for _ in range(4):
        speak(pair_shim)
    assert wait_for(lambda: served(triton) - before_a == 4, 5), served(triton) - before_a
    assert wait_for(lambda: not health(pair_shim)[b]["healthy"], 5)
    assert health(pair_shim)[a]["healthy"]

    # back on the same ports: it rejoins and takes its share again
    second_triton.start()
    assert wait_for(lambda: health(pair_shim)[b]["healthy"], 15), health(pair_shim)
    for _ in range(4):
        speak(pair_shim)
    assert served(second_triton) >= 1


def test_a_dead_endpoint_is_skipped_before_the_first_audio(triton):
    """Before the prober has noticed, a stream sent to a dead server moves to a live one."""
    import asyncio

    from client.speech_api.catalog import Catalog
    from client.speech_api.pool import TritonPool
    from client.triton_process import free_port

    async def scenario():
        dead = f"localhost:{free_port()}"
        pool = TritonPool([dead, triton.grpc_url], Catalog(), probe_interval_s=60)
        await pool.start()
        try:
            ghost = pool.endpoints[0]
            assert not ghost.healthy
            ghost.healthy, ghost.pipelines, ghost.last_pick = True, {"hibari": None}, -1  # looks fine
            stream = await pool.open_stream("hibari", "Moved along.", {}, "skip-dead")
            try:
                assert stream.endpoint.url == triton.grpc_url and stream.first is not None
                samples = sum([len(audio) async for audio, _ in stream.chunks()])
            finally:
                await stream.aclose()
            assert samples > 10000
            assert not ghost.healthy and "UNAVAILABLE" in ghost.last_error
            assert [ep.active for ep in pool.endpoints] == [0, 0]
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_probes_timing_out_on_a_busy_server_do_not_cut_its_streams(triton):
    """A server too busy to answer a probe in time is marked down on the second timeout, and its
    channel is renewed; the streams running on the old channel play to their end, equal to the
    same request on a quiet pool, and the old channel is closed after them."""
    import asyncio

    import numpy as np

    from client.speech_api.catalog import Catalog
    from client.speech_api.pool import TritonPool

    params = {"seed": 7}

    async def play(stream) -> np.ndarray:
        parts = []
        try:
            async for audio, _ in stream.chunks():
                parts.append(audio)
        finally:
            await stream.aclose()
        return np.concatenate(parts)

    async def scenario():
        quiet = TritonPool([triton.grpc_url], Catalog(), probe_interval_s=60)
        await quiet.start()
        try:
            alone = await play(await quiet.open_stream("hibari", LONG_TEXT, params, "busy-alone"))
        finally:
            await quiet.close()

        pool = TritonPool([triton.grpc_url], Catalog(), probe_interval_s=0.1)
        await pool.start()
        try:
            ep = pool.endpoints[0]
            stream = await pool.open_stream("hibari", LONG_TEXT, params, "busy-probed")
            pool.probe_timeout_s = 1e-4          # every probe now times out
            for _ in range(100):                 # two timeouts: down; the next probe renews the channel
                if ep.client is not stream.client:
                    break
                await asyncio.sleep(0.05)
            assert ep.client is not stream.client and not ep.healthy
            assert "Deadline" in ep.last_error or "DEADLINE" in ep.last_error, ep.last_error
            old = stream.client
            audio = await play(stream)
            assert np.array_equal(audio, alone)
            assert ep.active == 0
            with pytest.raises(Exception):       # closed once its last stream ended
                await old.is_server_live(client_timeout=5)
            pool.probe_timeout_s = 5.0
            await pool.probe_all()
            assert ep.healthy
        finally:
            await pool.close()

    asyncio.run(scenario())


WS_CONFIG = {"model": "hibari", "voice": "heart", "response_format": "pcm", "split_granularity": "none"}


def _ws_lines(shim: ShimProcess, start: int) -> list[str]:
    return [ln for ln in shim.log_text()[start:].splitlines() if '"WS /v1/audio/speech/stream"' in ln]


def _landed_on(line: str) -> str:
    return line.split(" triton=")[1].split()[0]


def test_a_websocket_utterance_is_admitted_logged_and_moves_off_its_dead_server(triton, second_triton, pair_shim):
    """A WebSocket session's utterances go through the HTTP routes' admission: each gets an
    access-log line (method WS), and when the session's server dies between two utterances the
    next one is spoken by the other server."""
    import asyncio

    from client.speech_stream_client import SpeechStreamClient, ws_url

    a, b = triton.grpc_url, second_triton.grpc_url
    # the previous test restarted the second server: on a busy host its load takes a while
    assert wait_for(lambda: all(h["healthy"] for h in health(pair_shim).values()), 60), health(pair_shim)
    # idle servers take turns: once an HTTP request landed on `a`, the session's first utterance lands on `b`
    for i in range(3):
        speak_id = f"before-ws-{i}"
        assert httpx.post(f"{pair_shim.url}/v1/audio/speech", json=SHORT, timeout=30,
                          headers={"x-request-id": speak_id}).status_code == 200
        line = wait_for(lambda: [ln for ln in pair_shim.log_text().splitlines() if speak_id in ln], 5)
        assert line, pair_shim.log_tail()
        if _landed_on(line[-1]) == a:
            break

    async def scenario():
        # a busy host can break the turns: a session whose first utterance landed on `a` is
        # closed, and the next one tried (the shared `a` must not be killed)
        for _ in range(5):
            start = len(pair_shim.log_text())
            async with SpeechStreamClient(ws_url(pair_shim.url), WS_CONFIG) as session:
                await session.send_text("The first utterance.")
                first = await session.finish()
                spoken = wait_for(lambda: _ws_lines(pair_shim, start) or None, 5)
                assert spoken and len(spoken) == 1, pair_shim.log_tail()
                if _landed_on(spoken[0]) != b:
                    continue
                os.killpg(second_triton.proc.pid, signal.SIGKILL)   # the session's server
                await session.send_text("The second utterance.")
                second = await session.finish()
                return start, first, second
        raise AssertionError(f"no session's first utterance landed on {b}: {pair_shim.log_tail()}")

    try:
        start, first, second = asyncio.run(scenario())
        assert not first.errors and not second.errors, (first.errors, second.errors)
        assert len(first.audio) > 10000 and len(second.audio) > 10000
        lines = wait_for(lambda: _ws_lines(pair_shim, start) if len(_ws_lines(pair_shim, start)) == 2 else None, 5)
        assert lines, pair_shim.log_tail()
        for line in lines:
            assert "access: ws-" in line and '"WS /v1/audio/speech/stream" 200' in line, line
            assert "model=hibari" in line and "stream=ws" in line and "outcome=ok" in line, line
            assert float(line.split("ttfa_ms=")[1].split()[0]) > 0 and "audio_s=" in line, line
        assert [_landed_on(line) for line in lines] == [b, a], lines
    finally:
        second_triton.stop()
        second_triton.start()
