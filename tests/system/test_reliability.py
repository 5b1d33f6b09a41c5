"""The server under abuse: a stage's stub killed or frozen mid-stream, SIGTERM under load, the
server or its supervisor killed with SIGKILL. Each test runs its own supervised tritonserver (the
session's is never disturbed) and checks what a client, a load balancer and the host see."""
from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from client.speech_api.process import ShimProcess
from client.triton_process import TritonProcess
from client.triton_stream import TritonStreamError, astream, stream
from omni_backend.errors import error_code
from omni_backend.stubs import server_stubs as stubs
from omni_backend.testing import long_streams
from tests.metrics_scrape import metric
from tests.served_pipeline import regions_left_behind, shm_regions

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
QWEN = long_streams.QWEN
# eos is held back for the tiny model's first LONG_FRAMES frames (`long_streams`): minutes of audio
LONG_FRAMES = 4000
LONG = {"max_new_tokens": LONG_FRAMES}
RESTART_FOR_LOST_STREAMS = "restarting tritonserver so that they end"
HIBARI_LONG = " ".join(f"Sentence number {i} keeps this stream going for a while." for i in range(40))


def repository(base: Path, pipelines: list[str]) -> Path:
    return long_streams.repository(base / "model_repository", pipelines, eos_after=LONG_FRAMES)


def server_pid(server: TritonProcess) -> int:
    """The tritonserver the supervisor runs."""
    pid = server.server_pid
    assert pid is not None
    return pid


def stage_stubs(server: TritonProcess, model: str) -> list[stubs.Stub]:
    return [s for s in stubs.stubs_of(server_pid(server)) if s.model == model]


def ready(server: TritonProcess) -> int | None:
    try:
        with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def model_ready(server: TritonProcess, model: str) -> bool:
    """The model's own readiness (the server's counts no model that is unloaded)."""
    try:
        with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def healed(server: TritonProcess) -> bool:
    """The supervisor reloaded the pipeline, restarted the server to end the client streams of an
    entry that is gone, or restarted it after it aborted on the Python backend's lock_exception
    (a stub killed while it held the backend's shared-memory lock)."""
    log = server.log_text()
    return ("reloaded" in log or RESTART_FOR_LOST_STREAMS in log
            or ("lock_exception" in log and "restarting" in log))


def wait_until(predicate, timeout_s: float, step_s: float = 0.05) -> float:
    """Seconds until predicate() held; fails after timeout_s."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(step_s)
    return time.monotonic() - t0


@dataclass
class Stream:
    """One gRPC stream read on its own thread: chunks, then how it ended and when."""
    url: str
    model: str
    text: str
    params: dict | None = None
    chunks: int = 0
    end: str | None = None            # "final" or the error message
    status: str | None = None         # the gRPC status of an error
    ended_at: float | None = None
    first: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "Stream":
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        inputs = [grpcclient.InferInput("TEXT", [1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([self.text.encode()], dtype=np.object_))
        if self.params:
            inputs.append(grpcclient.InferInput("PARAMS", [1], "BYTES"))
            inputs[1].set_data_from_numpy(np.array([json.dumps(self.params).encode()], dtype=np.object_))
        try:
            try:
                client.async_stream_infer(self.model, inputs, enable_empty_final_response=True)
            except InferenceServerException:   # the stream failed at once: its callback has why
                pass
            while True:
                try:
                    result, error = responses.get(timeout=120)
                except queue.Empty:
                    self.end = "no answer for 120 s"
                    break
                if error is not None:
                    self.end, self.status = error.message(), error.status()
                    break
                if result.as_numpy("AUDIO") is not None and result.as_numpy("AUDIO").size:
                    self.chunks += 1
                    self.first.set()
                if result.get_response().parameters["triton_final_response"].bool_param:
                    self.end = "final"
                    break
        finally:
            self.ended_at = time.monotonic()
            self.first.set()
            client.stop_stream(cancel_requests=True)
            client.close()

    def wait(self, timeout_s: float) -> None:
        wait_until(lambda: self.ended_at is not None, timeout_s)


@pytest.fixture
def own_server(tmp_path, request):
    """A supervised tritonserver with hibari and the tiny Qwen3-TTS, for this test alone (a
    test's `server_args` mark adds flags)."""
    mark = request.node.get_closest_marker("server_args")
    server = TritonProcess(repository(tmp_path, ["hibari", QWEN]), log_path=tmp_path / "tritonserver.log",
                           extra_args=list(mark.args) if mark else None)
    server.start(timeout_s=300)
    # the supervisor has recorded the stubs once it logs that it watches them
    wait_until(lambda: "watching" in server.log_text(), 30)
    try:
        yield server
    finally:
        server.stop()


def test_a_killed_stage_is_noticed_and_the_pipeline_heals(own_server, triton, tmp_path):
    server = own_server
    shim = ShimProcess([server.grpc_url], log_path=tmp_path / "shim.log", extra_args=["--probe-interval", "0.5"])
    shim.start()
    # a second speech API over this server and the session's: it routes around the reload
    pair = ShimProcess([server.grpc_url, triton.grpc_url], log_path=tmp_path / "pair.log",
                       extra_args=["--probe-interval", "0.5"])
    pair.start()
    try:
        streams = [Stream(server.grpc_url, QWEN, f"Stream number {i} talks for a long time.", LONG).start()
                   for i in range(4)]
        for s in streams:
            assert s.first.wait(120), s.end
        talker = stage_stubs(server, f"{QWEN}__talker")
        assert len(talker) == 1
        killed_at = time.monotonic()
        os.kill(talker[0].pid, signal.SIGKILL)

        # every open stream ends within 5 s with a coded error, none hangs
        for s in streams:
            s.wait(10)
            assert s.ended_at - killed_at < 5.0, (s.end, s.ended_at - killed_at)
        # A stub killed while it holds the Python backend's shared-memory lock makes the server's
        # next lock throw boost::interprocess::lock_exception (SIGABRT): then the whole server
        # went, its connections closed (gRPC UNAVAILABLE), and it is restarted, not healed.
        aborted = any(not s.end.startswith(f"unavailable: {QWEN}:") for s in streams)
        if aborted:
            wait_until(lambda: "lock_exception" in server.log_text(), 5)
        for s in streams:
            told = s.end.startswith(f"unavailable: {QWEN}:")
            assert told or (aborted and s.status == str(grpc.StatusCode.UNAVAILABLE)), (s.status, s.end)
        # what a load balancer and the speech API's clients see
        assert wait_until(lambda: ready(server) not in (200,), 5) < 5
        assert wait_until(lambda: shim.health() == 503, 5) < 5
        if not aborted:   # the other pipeline keeps serving while this one reloads
            hibari = Stream(server.grpc_url, "hibari", "Still here.").start()
            hibari.wait(60)
            assert hibari.end == "final" and hibari.chunks >= 1
        for _ in range(3):
            r = httpx.post(f"{pair.url}/v1/audio/speech", timeout=60,
                           json={"model": QWEN, "input": "Routed to the healthy server.", "voice": "vivian",
                                 "response_format": "wav"})
            assert r.status_code == 200 and r.headers["x-omni-model"] == QWEN, r.text[:300]
        assert pair.health() == 200   # every pipeline is still served by one of its servers
        # a request that arrives meanwhile is told to retry, not left hanging (the held entry's
        # answer; gRPC's own UNAVAILABLE when the kill took tritonserver down and it restarts)
        early = Stream(server.grpc_url, QWEN, "Too early.").start()
        early.wait(60)
        assert early.end == "final" or error_code(early.end) == "unavailable", early.end

        # healed without a person: ready again, a new stage process, streams work, gauges true
        wait_until(lambda: ready(server) == 200 and model_ready(server, QWEN), 180, 0.2)
        assert wait_until(lambda: shim.health() == 200, 10) < 10
        new_talker = stage_stubs(server, f"{QWEN}__talker")
        assert len(new_talker) == 1 and new_talker[0].pid != talker[0].pid
        after = Stream(server.grpc_url, QWEN, "Back again.").start()
        after.wait(120)
        assert after.end == "final" and after.chunks >= 1
        r = httpx.post(f"{shim.url}/v1/audio/speech", timeout=60,
                       json={"model": QWEN, "input": "Through the speech API.", "voice": "vivian",
                             "response_format": "wav"})
        assert r.status_code == 200, r.text[:300]
        assert len(r.content) > 1000
        # the entry counts a stream gone just after its last bytes left: a leak stays, a moment passes
        assert wait_until(lambda: metric(server.metrics_url, "omni_active_streams", pipeline=QWEN) == 0, 10) < 10
        assert wait_until(lambda: metric(server.metrics_url, "omni_stage_active_requests",
                                         model=f"{QWEN}__talker") == 0, 10) < 10
        # healed by reloading the pipeline or, when the kill took tritonserver down with it, by
        # restarting the server
        assert healed(server), server.log_text()[-3000:]
    finally:
        pair.stop()
        shim.stop()


def test_a_killed_entry_that_holds_the_talker_comes_back_with_it(tmp_path):
    """The whole Qwen3-TTS pipeline in the entry's process (`process: entry`, code2wav in the
    talker): killing that one stub ends its streams with a coded error within 5 s, and the
    supervisor brings back an entry that holds a new engine and speaks as before."""
    talker = {"process": "entry", "options": {"code2wav": "in_talker"}}
    repo = long_streams.repository(tmp_path / "model_repository", [QWEN], eos_after=LONG_FRAMES, talker=talker)
    assert not (repo / f"{QWEN}__talker").exists()
    server = TritonProcess(repo, log_path=tmp_path / "tritonserver.log")
    server.start(timeout_s=300)
    try:
        wait_until(lambda: "watching" in server.log_text(), 30)
        before = Stream(server.grpc_url, QWEN, "Before the kill.", {"max_new_tokens": 12}).start()
        before.wait(120)
        assert before.end == "final" and before.chunks >= 1
        streams = [Stream(server.grpc_url, QWEN, f"Stream {i} talks for a long time.", LONG).start() for i in range(2)]
        for s in streams:
            assert s.first.wait(120), s.end
        entry = stage_stubs(server, QWEN)
        assert len(entry) == 1 and not stage_stubs(server, f"{QWEN}__talker")
        first_server = server_pid(server)
        killed_at = time.monotonic()
        os.kill(entry[0].pid, signal.SIGKILL)
        for s in streams:
            s.wait(15)
            assert s.end != "final" and s.ended_at - killed_at < 5.0, (s.end, s.ended_at - killed_at)
            assert s.status == "StatusCode.UNAVAILABLE" or error_code(s.end) == "unavailable", (s.status, s.end)
        wait_until(lambda: server.server_pid not in (None, first_server) and ready(server) == 200
                   and model_ready(server, QWEN), 180, 0.2)
        again = Stream(server.grpc_url, QWEN, "Before the kill.", {"max_new_tokens": 12}).start()
        again.wait(120)
        assert again.end == "final" and again.chunks == before.chunks
        new_entry = stage_stubs(server, QWEN)
        assert len(new_entry) == 1 and new_entry[0].pid != entry[0].pid
        assert metric(server.metrics_url, "omni_stage_active_requests", model=f"{QWEN}__talker") == 0
    finally:
        server.stop()


def test_a_frozen_stage_is_killed_and_reloaded(own_server):
    server = own_server
    stream = Stream(server.grpc_url, "hibari", HIBARI_LONG, {"speed": 0.5}).start()
    assert stream.first.wait(60), stream.end
    synthesizer = stage_stubs(server, "hibari__synthesizer")
    frozen_at = time.monotonic()
    os.kill(synthesizer[0].pid, signal.SIGSTOP)
    try:
        stream.wait(15)
        assert stream.end == "final" or stream.end.startswith("unavailable: hibari:"), stream.end
        if stream.end != "final":
            assert stream.ended_at - frozen_at < 6.0
        wait_until(lambda: not stubs.alive(synthesizer[0]), 10)   # killed, not left stopped
        wait_until(lambda: ready(server) == 200 and model_ready(server, "hibari")
                   and stage_stubs(server, "hibari__synthesizer"), 120, 0.2)
        again = Stream(server.grpc_url, "hibari", "Thawed.").start()
        again.wait(60)
        assert again.end == "final" and again.chunks >= 1
    finally:
        try:
            os.kill(synthesizer[0].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.server_args("--supervisor-restart-on-lost-streams=false")
def test_a_frozen_entry_leaves_no_stub_of_its_old_instances_after_the_heal(own_server):
    """An entry that stops with streams open is killed. By default the server is then restarted to
    end its clients' streams (the test above); here it may not, so its pipeline is reloaded: the
    old stage stubs, whose streams nobody can answer now, may never finish unloading in 2.51 and
    are killed too (else each heal keeps a stage's memory, a GPU's included, for good)."""
    server = own_server
    streams = [Stream(server.grpc_url, QWEN, f"Stream number {i} talks for a long time.", LONG).start()
               for i in range(4)]
    for s in streams:
        assert s.first.wait(120), s.end
    old = [s for s in stubs.stubs_of(server_pid(server)) if s.model.startswith(QWEN)]
    assert {s.model for s in old} == {QWEN, f"{QWEN}__talker", f"{QWEN}__code2wav"}
    entry = next(s for s in old if s.model == QWEN)
    os.kill(entry.pid, signal.SIGSTOP)
    try:
        # healed by a reload or, when killing the stopped stub made tritonserver abort
        # (boost::interprocess::lock_exception: it held the Python backend's shared-memory lock), by
        # a restart of the server; either way none of the old stubs may stay beside the new ones
        wait_until(lambda: healed(server), 180, 0.2)
        wait_until(lambda: ready(server) == 200 and model_ready(server, QWEN), 180, 0.2)
        # gone within the supervisor's grace after the heal (15 s), not left beside the new ones
        wait_until(lambda: not any(stubs.alive(s) for s in old), 30, 0.2)
        new = [s for s in stubs.stubs_of(server_pid(server)) if s.model.startswith(QWEN)]
        assert sorted(s.model for s in new) == sorted(s.model for s in old)
        again = Stream(server.grpc_url, QWEN, "Back again.").start()
        again.wait(120)
        assert again.end == "final" and again.chunks >= 1
    finally:
        for s in old:
            try:
                os.kill(s.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_server_that_crashed_but_did_not_exit_is_killed_and_restarted(own_server):
    """tritonserver's crash handler once hung instead of ending the process (a double free in its
    gRPC frontend; the handler then waited for ever on the heap lock): the server was alive and
    served less and less until nothing, and nothing restarted it. Its handler's first line is
    written here into the server's own output, as a hung handler leaves it: the supervisor must
    end that server (it does not exit by itself) and start a new one that serves."""
    server = own_server
    pid = server_pid(server)
    with open(f"/proc/{pid}/fd/1", "wb", buffering=0) as out:   # the pipe the supervisor reads
        out.write(b"Signal (11) received.\n")
    said = time.monotonic()
    wait_until(lambda: server.server_pid not in (None, pid), 40, 0.2)
    assert time.monotonic() - said < 10.0 + 5.0
    assert "hung in its crash handler: killing it" in server.log_text()
    wait_until(lambda: ready(server) == 200 and model_ready(server, "hibari"), 180, 0.2)
    again = Stream(server.grpc_url, "hibari", "Restarted.").start()
    again.wait(60)
    assert again.end == "final" and again.chunks >= 1


def test_a_killed_entry_ends_every_client_stream_and_the_server_comes_back(own_server, tmp_path):
    """Triton 2.51 cannot answer the streams of an entry whose stub died, and keeps them open for
    ever: the supervisor restarts the server, which ends them. Every client sees its stream end
    within 5 s with a coded error: tritonclient used directly (gRPC UNAVAILABLE), the speech API's
    SSE (service_unavailable) and `client.triton_stream`, sync and asyncio (`unavailable:`); the
    other pipeline's streams end with `unavailable:` too. Then the server serves again."""
    server = own_server
    shim = ShimProcess([server.grpc_url], log_path=tmp_path / "shim.log", extra_args=["--probe-interval", "0.5"])
    shim.start()
    events: list[list[dict]] = [[], []]
    ended: list[float | None] = [None, None]
    direct: dict[str, tuple[int, str, float] | None] = {"sync": None, "asyncio": None}
    raw = [Stream(server.grpc_url, "hibari", HIBARI_LONG, {"speed": 0.5}),
           Stream(server.grpc_url, QWEN, "The other pipeline talks for a long time.", LONG)]

    def listen_sync() -> None:
        chunks = 0
        try:
            for _ in stream(server.grpc_url, "hibari", HIBARI_LONG, {"speed": 0.5}, timeout_s=60):
                chunks += 1
            error = "finished"
        except TritonStreamError as e:
            error = str(e)
        direct["sync"] = (chunks, error, time.monotonic())

    def listen_asyncio() -> None:
        async def run() -> None:
            client = aioclient.InferenceServerClient(server.grpc_url)
            chunks = 0
            try:
                async for _ in astream(client, "hibari", HIBARI_LONG, {"speed": 0.5}):
                    chunks += 1
                error = "finished"
            except TritonStreamError as e:
                error = str(e)
            except grpc.RpcError as e:   # the channel itself failed: kept as such (failover)
                error = f"unavailable: {e.code()}"
            finally:
                await client.close()
            direct["asyncio"] = (chunks, error, time.monotonic())
        asyncio.run(run())

    # a WebSocket session that appends text to a running Qwen3-TTS request while the server goes
    # away: told with a coded error, audio.done and session.done, never left until the idle timeout
    ws: dict = {}

    def listen_ws() -> None:
        from client.speech_stream_client import SpeechStreamClient, ws_url

        async def run() -> None:
            config = {"model": QWEN, "voice": "ryan", "split_granularity": "append", "response_format": "pcm",
                      **LONG}
            async with SpeechStreamClient(ws_url(shim.url), config) as session:
                await session.send_text("Text that keeps coming ")
                while "killed" not in ws or time.monotonic() - ws["killed"] < 3.0:
                    await session.send_text("and coming ")
                    await asyncio.sleep(0.1)
                    if any(r.audio for r in session.received):
                        ws["speaking"] = True
                ws["utterance"] = await session.finish(timeout_s=30)
            ws["ended"] = time.monotonic()
        try:
            asyncio.run(run())
        except Exception as e:  # noqa: BLE001 - the assertion shows it
            ws["failed"] = repr(e)

    def listen(i: int) -> None:
        body = {"model": "hibari", "voice": "heart", "input": HIBARI_LONG, "speed": 0.5,
                "response_format": "pcm", "stream_format": "sse"}
        with httpx.stream("POST", f"{shim.url}/v1/audio/speech", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events[i].append(json.loads(line[6:]))
        ended[i] = time.monotonic()

    try:
        threads = [threading.Thread(target=listen, args=(i,), daemon=True) for i in range(2)]
        threads += [threading.Thread(target=listen_sync, daemon=True),
                    threading.Thread(target=listen_asyncio, daemon=True),
                    threading.Thread(target=listen_ws, daemon=True)]
        for t in threads:
            t.start()
        for s in raw:
            s.start()
        wait_until(lambda: all(events), 60)
        for s in raw:
            assert s.first.wait(120), s.end
        wait_until(lambda: ws.get("speaking") or "failed" in ws, 60)
        assert "failed" not in ws, ws
        time.sleep(1.0)                      # the direct streams have begun too
        first_server = server_pid(server)
        killed_at = ws["killed"] = time.monotonic()
        os.kill(stage_stubs(server, "hibari")[0].pid, signal.SIGKILL)
        for t in threads:
            t.join(15)
        for s in raw:
            s.wait(15)
            assert s.end is not None and s.end != "final", s.end
            assert s.ended_at - killed_at < 5.0, (s.model, s.end, s.ended_at - killed_at)
        assert raw[0].status == "StatusCode.UNAVAILABLE", (raw[0].status, raw[0].end)   # gRPC's own code
        assert raw[1].end.startswith(f"unavailable: {QWEN}: the server is restarting (hibari failed)") \
            or raw[1].status == "StatusCode.UNAVAILABLE", (raw[1].status, raw[1].end)
        for i in range(2):
            assert ended[i] is not None and ended[i] - killed_at < 5.0
            last = events[i][-1]
            assert last["type"] == "speech.audio.error", last
            assert last["error"]["code"] == "service_unavailable", last
        for kind, seen in direct.items():
            assert seen is not None, kind
            chunks, error, at = seen
            assert error.startswith("unavailable:"), (kind, error)
            assert at - killed_at < 5.0, (kind, at - killed_at)
        assert "failed" not in ws and "utterance" in ws, ws
        told = ws["utterance"].messages
        assert [m["type"] for m in told] == ["audio.start", "error", "audio.done", "session.done"], told
        assert told[1]["code"] == "unavailable" and told[2]["error"] is True, told
        assert ws["utterance"].audio and ws["ended"] - killed_at < 10.0, ws["ended"] - killed_at
        assert RESTART_FOR_LOST_STREAMS in server.log_text()
        wait_until(lambda: server.server_pid not in (None, first_server) and ready(server) == 200
                   and model_ready(server, "hibari") and model_ready(server, QWEN), 180, 0.2)
        wait_until(lambda: shim.health() == 200, 120, 0.2)
        r = httpx.post(f"{shim.url}/v1/audio/speech", timeout=60,
                       json={"model": "hibari", "voice": "heart", "input": "Back.", "response_format": "wav"})
        assert r.status_code == 200, r.text[:300]
        again = Stream(server.grpc_url, QWEN, "Back again.").start()
        again.wait(120)
        assert again.end == "final" and again.chunks >= 1
    finally:
        shim.stop()


def _regions_of(stub_list: list[stubs.Stub]) -> set[str]:
    return {s.region for s in stub_list if s.region}


def test_sigterm_under_load_drains_and_exits_clean(own_server, triton, tmp_path):
    server = own_server
    shim = ShimProcess([server.grpc_url, triton.grpc_url], log_path=tmp_path / "shim.log",
                       extra_args=["--probe-interval", "0.5"])
    shim.start()
    try:
        own_stubs = stubs.stubs_of(server_pid(server))
        regions = _regions_of(own_stubs)
        running = [Stream(server.grpc_url, QWEN, f"Long stream {i}.", LONG).start() for i in range(3)]
        running += [Stream(server.grpc_url, "hibari", "A short one. It ends soon.").start()]
        for s in running:
            assert s.first.wait(120), s.end
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        late = Stream(server.grpc_url, "hibari", "Arriving during the drain.").start()
        late.wait(10)
        assert error_code(late.end) == "unavailable", late.end
        # the speech API sends new requests to the other server meanwhile
        r = httpx.post(f"{shim.url}/v1/audio/speech", timeout=60,
                       json={"model": "hibari", "input": "Failing over.", "voice": "heart", "response_format": "wav"})
        assert r.status_code == 200 and len(r.content) > 1000, r.text[:300]
        server.proc.wait(timeout=12)
        exit_s = time.monotonic() - t0
        assert exit_s < 10.0, exit_s
        for s in running:   # each finished or ended with a stable code
            s.wait(5)
            assert s.end == "final" or s.end.startswith("unavailable:"), s.end
        assert [s for s in running if s.model == "hibari"][0].end == "final"
        time.sleep(0.5)
        assert not [s for s in own_stubs if stubs.alive(s)]
        left = {p.name for p in stubs.SHM_DIR.glob(f"{stubs.SHM_PREFIX}*")} & regions
        assert not left, left
        assert "drained" in server.log_text()
    finally:
        shim.stop()


def test_sigkill_of_the_server_or_its_supervisor_leaves_nothing_behind(own_server, tmp_path):
    """tritonserver killed: the supervisor cleans up after it and starts a new one at once, also
    while some other process holds the server's output pipe open (as a stub still starting or an
    engine's worker can: a server that aborted while loading once looked alive for as long as
    that lasted). Then the supervisor killed: nothing outlives it."""
    server = own_server
    first = server_pid(server)
    first_stubs = stubs.stubs_of(first)
    with open(f"/proc/{first}/fd/1", "wb", buffering=0):   # the pipe the supervisor reads
        os.kill(first, signal.SIGKILL)   # tritonserver dies: the supervisor cleans up and restarts it
        killed = time.monotonic()
        wait_until(lambda: server.server_pid not in (None, first), 30, 0.1)
        assert time.monotonic() - killed < 10
    wait_until(lambda: not [s for s in first_stubs if stubs.alive(s)], 10)
    wait_until(lambda: ready(server) == 200, 180, 0.2)
    assert server_pid(server) != first
    assert not {p.name for p in stubs.SHM_DIR.glob(f"{stubs.SHM_PREFIX}*")} & _regions_of(first_stubs)
    done = Stream(server.grpc_url, "hibari", "Restarted.").start()
    done.wait(60)
    assert done.end == "final"

    second = server_pid(server)
    second_stubs = stubs.stubs_of(second)
    os.kill(server.proc.pid, signal.SIGKILL)   # the supervisor itself: nothing may outlive it
    server.proc.wait()
    wait_until(lambda: _state(second) in ("gone", "Z"), 10)   # the kernel ends tritonserver too
    wait_until(lambda: not [s for s in second_stubs if stubs.alive(s)], 10)
    wait_until(lambda: not {p.name for p in stubs.SHM_DIR.glob(f"{stubs.SHM_PREFIX}*")} & _regions_of(second_stubs), 10)
    # a new server on the same host starts cleanly
    again = TritonProcess(server.repo, log_path=tmp_path / "again.log")
    again.start(timeout_s=300)
    try:
        stream = Stream(again.grpc_url, "hibari", "A new server.").start()
        stream.wait(60)
        assert stream.end == "final"
    finally:
        again.stop()


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rfind(")") + 2:].split()[0]


def test_sigterm_while_models_load_leaves_nothing_behind(tmp_path):
    """SIGTERM to the supervisor while the repository is still loading (hibari loaded, the vLLM
    Orpheus stage starting): it exits within 10 s, and no stub, vLLM worker or shared-memory
    region of that server is left."""
    import subprocess

    repo = repository(tmp_path, ["hibari", "orpheus_tiny_random"])
    server = TritonProcess(repo, log_path=tmp_path / "tritonserver.log")
    before = shm_regions()
    workers_before = _vllm_workers()
    log = open(tmp_path / "supervisor.log", "w")
    proc = subprocess.Popen(server.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: "successfully loaded 'hibari'" in (tmp_path / "supervisor.log").read_text(), 120, 0.1)
        assert "watching" not in (tmp_path / "supervisor.log").read_text(), "the server was ready already"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert children, "tritonserver runs"
        server_stubs = stubs.stubs_of(int(children[0]))
        assert server_stubs, "stubs were started"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert proc.returncode == 0
    wait_until(lambda: not any(stubs.alive(s) for s in server_stubs), 5)
    left = regions_left_behind(before)
    assert not left, f"shared memory left behind: {left}"
    wait_until(lambda: not _vllm_workers() - workers_before, 5)


def _vllm_workers() -> set[int]:
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"vllm_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(int(pid))
        except OSError:
            pass
    return out


def pause_while_it_initializes(server: TritonProcess, model: str, paused: list[stubs.Stub],
                               but: int | None = None, pause_s: float = 4.0) -> threading.Thread:
    """A thread that SIGSTOPs the first stub of `model` (but pid `but`) seen while its model
    initializes, for `pause_s`, as a starved host would not schedule it; the stub goes to `paused`."""
    def pause() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pid = server.server_pid
            for stub in stubs.stubs_of(pid) if pid else []:
                # its model's own threads (heartbeat, event loop, ...) exist: initialize() runs
                if stub.model == model and stub.pid != but and len(os.listdir(f"/proc/{stub.pid}/task")) >= 6:
                    os.kill(stub.pid, signal.SIGSTOP)
                    paused.append(stub)
                    time.sleep(pause_s)
                    os.kill(stub.pid, signal.SIGCONT)
                    return
            time.sleep(0.01)

    thread = threading.Thread(target=pause, daemon=True)
    thread.start()
    return thread


def test_a_stub_paused_while_its_model_initializes_does_not_hang_the_start(tmp_path):
    """A stub that is not scheduled for a second while its model initializes (a starved host) is
    taken as dead by 2.51, which then waits for it to exit; the stub, running again, finishes
    and waits for work, and the load never ends. The supervisor sees tritonserver wait for a live
    stub and starts it again: the server is ready within a minute or two and serves."""
    server = TritonProcess(repository(tmp_path, ["hibari"]), log_path=tmp_path / "tritonserver.log")
    paused: list[stubs.Stub] = []
    pauser = pause_while_it_initializes(server, "hibari", paused)
    server.start(timeout_s=180)
    try:
        pauser.join(10)
        assert paused, "the entry's stub was never seen initializing"
        log = server.log_text()
        assert f"gave up on the stub of hibari (stub {paused[0].pid})" in log, log[-3000:]
        assert "starting it again (1 of 3)" in log
        done = Stream(server.grpc_url, "hibari", "Started after all.").start()
        done.wait(60)
        assert done.end == "final"
    finally:
        server.stop()


def test_a_stub_paused_while_a_heal_loads_it_does_not_hang_the_heal(own_server):
    """The same wait in a heal: the talker is killed, and its new stub is paused while it
    initializes. The supervisor kills the stub tritonserver waits on, and the heal loads the
    talker again: the pipeline serves again (before, it stayed unready for good)."""
    server = own_server
    talker = f"{QWEN}__talker"
    old = stage_stubs(server, talker)
    assert len(old) == 1
    paused: list[stubs.Stub] = []
    pauser = pause_while_it_initializes(server, talker, paused, but=old[0].pid)
    os.kill(old[0].pid, signal.SIGKILL)
    pauser.join(60)
    assert paused, "the new talker stub was never seen initializing"
    wait_until(lambda: ready(server) == 200 and model_ready(server, QWEN), 120, 0.2)
    log = server.log_text()
    if "lock_exception" not in log:   # (killing a stub can abort 2.51: then the server restarted)
        assert f"for the stub of {talker} (stub {paused[0].pid}) to exit: killing it" in log, log[-3000:]
    after = Stream(server.grpc_url, QWEN, "Back again.").start()
    after.wait(120)
    assert after.end == "final" and after.chunks >= 1


def test_a_server_whose_starter_is_killed_stops_and_cleans_up(tmp_path):
    """A process that started a server (a test run, a benchmark) and was SIGKILLed leaves no
    orphan: the supervisor gets SIGTERM from the kernel, drains, and takes its stubs and shared
    memory with it."""
    import subprocess
    import sys

    repo = repository(tmp_path, ["hibari"])
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
            "from client.triton_process import TritonProcess\n"
            f"s = TritonProcess({str(repo)!r}, log_path={str(tmp_path / 'server.log')!r}).start()\n"
            "print(s.proc.pid, s.server_pid, flush=True)\n"
            "time.sleep(600)\n")
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    supervisor, server = (int(x) for x in starter.stdout.readline().split())
    server_stubs = stubs.stubs_of(server)
    assert server_stubs
    regions = _regions_of(server_stubs)
    starter.kill()
    starter.wait()
    wait_until(lambda: not Path(f"/proc/{supervisor}").exists() and not Path(f"/proc/{server}").exists(), 20)
    wait_until(lambda: not any(stubs.alive(s) for s in server_stubs), 5)
    assert not {p.name for p in stubs.SHM_DIR.glob(f"{stubs.SHM_PREFIX}*")} & regions


class Hammer:
    """Requests one after another on `threads` threads (gRPC streams to `model`, and speech API
    POSTs when a shim is given), each outcome kept, until stopped: what clients hear while the
    server heals or drains."""

    def __init__(self, url: str, model: str, text: str, threads: int = 2, shim: ShimProcess | None = None,
                 voice: str = "heart"):
        self.url, self.model, self.text, self.shim, self.voice = url, model, text, shim, voice
        self.streams: list[Stream] = []
        self.posts: list[tuple[int | None, str | None, str]] = []   # (status, Retry-After, body)
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._streams, daemon=True) for _ in range(threads)]
        if shim is not None:
            self.threads.append(threading.Thread(target=self._posts, daemon=True))

    def __enter__(self) -> "Hammer":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(150)

    def _streams(self) -> None:
        while not self.stopped.is_set():
            s = Stream(self.url, self.model, self.text)
            s._run()
            self.streams.append(s)

    def _posts(self) -> None:
        while not self.stopped.is_set():
            try:
                r = httpx.post(f"{self.shim.url}/v1/audio/speech", timeout=60,
                               json={"model": self.model, "input": self.text, "voice": self.voice,
                                     "response_format": "wav"})
                self.posts.append((r.status_code, r.headers.get("retry-after"), r.text[:200] if r.status_code != 200
                                   else ""))
            except httpx.HTTPError as e:
                self.posts.append((None, None, repr(e)))

    def errors(self) -> list[tuple[str | None, str]]:
        return [(s.status, s.end) for s in self.streams if s.end != "final"]


def _told_to_retry(status: str | None, end: str) -> bool:
    """Our coded, retryable answer (the entry's `unavailable:`), or gRPC's own UNAVAILABLE (a
    server that is gone); never Triton's "unknown model", which a client takes as permanent."""
    return (status is None and end.startswith("unavailable:")) or status == "StatusCode.UNAVAILABLE"


@pytest.fixture
def hibari_server(tmp_path):
    """A supervised tritonserver serving hibari alone (quick to start and to heal)."""
    server = TritonProcess(repository(tmp_path, ["hibari"]), log_path=tmp_path / "tritonserver.log")
    server.start(timeout_s=300)
    wait_until(lambda: "watching" in server.log_text(), 30)
    try:
        yield server
    finally:
        server.stop()


def test_requests_during_a_heal_are_told_to_retry_never_that_the_pipeline_is_unknown(hibari_server, tmp_path):
    """While a pipeline reloads after its stage died, its entry stays loaded: every request that
    arrives hears `unavailable: hibari: the pipeline is restarting ...; retry` (it used to hear
    Triton's "Request for unknown model: 'hibari' has no available versions" while the entry was
    unloaded), and the speech API answers 503 with Retry-After."""
    server = hibari_server
    shim = ShimProcess([server.grpc_url], log_path=tmp_path / "shim.log", extra_args=["--probe-interval", "0.5"])
    shim.start()
    try:
        with Hammer(server.grpc_url, "hibari", "Knocking again.", shim=shim) as hammer:
            wait_until(lambda: any(s.end == "final" for s in hammer.streams), 60)
            # a stub killed while it holds the Python backend's shared-memory lock can take
            # tritonserver down (lock_exception, SIGABRT): it is restarted, not healed; kill again
            for _ in range(3):
                seen = len(server.log_text())
                os.kill(stage_stubs(server, "hibari__synthesizer")[0].pid, signal.SIGKILL)
                wait_until(lambda: any(said in server.log_text()[seen:]
                                       for said in ("reloaded", "tritonserver exited with")), 120, 0.2)
                wait_until(lambda: ready(server) == 200 and stage_stubs(server, "hibari__synthesizer"), 120, 0.2)
                served = len(hammer.streams)
                wait_until(lambda: any(s.end == "final" for s in hammer.streams[served:]), 60)   # serving again
                if "reloaded" in server.log_text()[seen:]:
                    break
            assert "reloaded" in server.log_text()[seen:], server.log_text()[-3000:]
        errors = hammer.errors()
        assert errors, "no request arrived during the heal"
        wrong = [e for e in errors if not _told_to_retry(*e)]
        assert not wrong, wrong[:5]
        assert any(end.startswith("unavailable: hibari: the pipeline is restarting (hibari__synthesizer failed)")
                   for _, end in errors), errors[:5]
        assert {status for status, _, _ in hammer.posts} <= {200, 503}, hammer.posts
        refused = [p for p in hammer.posts if p[0] == 503]
        assert all(retry is not None for _, retry, _ in refused), refused
        assert "holds" in server.log_text()   # the entry was not unloaded
    finally:
        shim.stop()


def test_requests_during_a_drain_are_told_to_retry_never_that_the_pipeline_is_unknown(hibari_server, tmp_path):
    """On SIGTERM the entries turn new streams away with `unavailable: ... shutting down` and stay
    loaded until the server is gone (tritonserver's own stop unloaded them first, and requests
    meanwhile heard "unknown model"); then the connection is refused (gRPC UNAVAILABLE). The
    speech API answers 503 with Retry-After throughout."""
    server = hibari_server
    own_stubs = stubs.stubs_of(server_pid(server))
    regions = _regions_of(own_stubs)
    shim = ShimProcess([server.grpc_url], log_path=tmp_path / "shim.log", extra_args=["--probe-interval", "0.5"])
    shim.start()
    try:
        with Hammer(server.grpc_url, "hibari", "Knocking again.", threads=3, shim=shim) as hammer:
            wait_until(lambda: any(s.end == "final" for s in hammer.streams), 60)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(timeout=12)
            assert time.monotonic() - t0 < 10.0
            time.sleep(1.0)   # requests to a server that is gone
        errors = hammer.errors()
        wrong = [e for e in errors if not _told_to_retry(*e)]
        assert not wrong, wrong[:5]
        assert any(end.startswith("unavailable: hibari: the server is shutting down") for _, end in errors), errors[:5]
        assert any(status == "StatusCode.UNAVAILABLE" for status, _ in errors), errors[-5:]
        assert {status for status, _, _ in hammer.posts} <= {200, 503}, hammer.posts
        refused = [p for p in hammer.posts if p[0] == 503]
        assert refused and all(retry is not None for _, retry, _ in refused), refused
        # killed, not stopped by itself: still nothing left behind
        time.sleep(0.5)
        assert not [s for s in own_stubs if stubs.alive(s)]
        left = {p.name for p in stubs.SHM_DIR.glob(f"{stubs.SHM_PREFIX}*")} & regions
        assert not left, left
    finally:
        shim.stop()
