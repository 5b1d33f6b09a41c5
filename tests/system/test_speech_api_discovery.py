"""A stand-in for a Kubernetes headless Service: two supervised tritonservers, each on its own
loopback address and the same ports (two pods), and one speech API that finds them through one
name (`--triton-service triton-pods.test:PORT`) resolved by the system resolver.

The name lives in a hosts file that is bind-mounted over /etc/hosts in the speech API's own
mount namespace (`unshare -m`): the speech API resolves it with the same `getaddrinfo` call it
makes in a pod, nothing in it knows about the test, and the machine's /etc/hosts is untouched.
Editing that file is the Service's address list changing (a pod becoming ready, or leaving).

Under load: a pod that joins the name takes its share; a WebSocket session stays on one pod;
one pod's server killed mid-stream ends its stream with a coded error while the other's goes on,
new requests and new sessions go to the survivor, nothing hangs; brought back, it takes traffic
again; an address removed from the name takes no new streams.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path

import httpx
import pytest

from client.speech_api.process import ShimProcess
from client.speech_stream_client import SpeechStreamClient, ws_url
from client.triton_process import TritonProcess, free_port
from tests.system.speech_api_helpers import hibari_repository, metric, wait_for
from tests.system.test_speech_api_failover import next_event, race, sse_stream

pytestmark = pytest.mark.system

NAME = "triton-pods.test"
POD_ADDRESSES = ("127.0.0.2", "127.0.0.3")
SHORT = {"model": "tts-1", "voice": "alloy", "input": "Discovery check.", "response_format": "wav"}
SENTENCE = {"model": "hibari", "voice": "heart", "response_format": "pcm", "split_granularity": "sentence"}


class NamespacedShim(ShimProcess):
    """The speech API with `hosts` as its /etc/hosts (a mount namespace of its own)."""

    def __init__(self, hosts: Path, **kwargs):
        super().__init__([], **kwargs)
        self.hosts = hosts

    def command(self) -> list[str]:
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts), *super().command()]


def write_hosts(path: Path, addresses: list[str]) -> None:
    # written in place (same inode): the bind mount shows the new content
    base = Path("/etc/hosts").read_text()
    path.write_text(base + "".join(f"{a} {NAME}\n" for a in addresses))


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    """Two supervised tritonservers serving hibari, same ports on two loopback addresses."""
    base = tmp_path_factory.mktemp("pods")
    repo = hibari_repository(base / "model_repository")
    http, grpc, metrics = free_port(), free_port(), free_port()
    servers = [TritonProcess(repo, http, grpc, metrics, host=address, log_path=base / f"tritonserver-{address}.log")
               for address in POD_ADDRESSES]
    try:
        for server in servers:   # from this thread: a server ends with the thread that started it
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def hosts_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("names") / "hosts"


@pytest.fixture(scope="module")
def discovering_shim(pods, hosts_file, tmp_path_factory):
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed for the speech API's own /etc/hosts")
    write_hosts(hosts_file, [POD_ADDRESSES[0]])   # one pod ready so far
    log = tmp_path_factory.mktemp("discovering_shim") / "shim.log"
    shim = NamespacedShim(hosts_file, log_path=log, extra_args=[
        "--triton-service", f"{NAME}:{pods[0].grpc_port}", "--resolve-interval", "0.5", "--probe-interval", "0.5"])
    shim.start()
    try:
        yield shim
    finally:
        shim.stop()


def health(shim: ShimProcess) -> dict[str, dict]:
    return {t["url"]: t for t in httpx.get(f"{shim.url}/health", timeout=10).json()["tritons"]}


def served(pod: TritonProcess) -> float:
    return metric(pod, "omni_requests_total", pipeline="hibari", outcome="ok")


def counts(pods: list[TritonProcess]) -> list[float]:
    return [served(p) for p in pods]


def served_since(pods: list[TritonProcess], before: list[float], total: int) -> list[float]:
    """Requests each pod counted since ``before``, once all ``total`` are counted: a pod counts a
    request just after its last response, which the client may have read already."""
    wait_for(lambda: sum(counts(pods)) - sum(before) >= total, 5)
    return [a - b for a, b in zip(counts(pods), before)]


def speak(shim: ShimProcess) -> None:
    r = httpx.post(f"{shim.url}/v1/audio/speech", json=SHORT, timeout=30)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) > 10000


async def utterances(shim: ShimProcess, texts: list[str]) -> list:
    async with SpeechStreamClient(ws_url(shim.url), SENTENCE) as session:
        out = []
        for text in texts:
            await session.send_text(text)
            out.append(await asyncio.wait_for(session.finish(), 60))
        return out


class Session:
    """A WebSocket session held open across the test's steps (its own event loop thread)."""

    def __init__(self, shim: ShimProcess):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = SpeechStreamClient(ws_url(shim.url), SENTENCE)
        self.run(self.client.__aenter__())

    def run(self, coro, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def say(self, text: str):
        async def go():
            await self.client.send_text(text)
            return await self.client.finish(timeout_s=60)
        return self.run(go())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self.client.__aexit__(None, None, None), 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_pods_found_through_one_name_fail_over_and_come_back(pods, discovering_shim, hosts_file):
    shim = discovering_shim
    urls = [f"{address}:{pods[0].grpc_port}" for address in POD_ADDRESSES]

    # one address: one endpoint, found through the name
    assert list(health(shim)) == [urls[0]]
    assert health(shim)[urls[0]]["healthy"] and health(shim)[urls[0]]["service"] == f"{NAME}:{pods[0].grpc_port}"

    # a second pod becomes ready: the name resolves to both, the new one joins and takes its share
    write_hosts(hosts_file, list(POD_ADDRESSES))
    assert wait_for(lambda: all(h["healthy"] for h in health(shim).values()) and len(health(shim)) == 2, 10), \
        health(shim)
    before = counts(pods)
    for _ in range(4):
        speak(shim)
    assert served_since(pods, before, 4) == [2, 2]

    # a WebSocket session stays on one pod (idle pods would otherwise take turns)
    session = Session(shim)
    try:
        before = counts(pods)
        for text in ("First utterance.", "Second utterance.", "Third utterance."):
            assert not session.say(text).errors
        delta = served_since(pods, before, 3)
        assert sorted(delta) == [0, 3], delta
        home = delta.index(3)
        victim, survivor = pods[home], pods[1 - home]

        # under load: one stream on each pod, then the session's pod is killed (server and all)
        with httpx.Client(timeout=60) as one, httpx.Client(timeout=60) as two:
            with sse_stream(one, shim) as first, sse_stream(two, shim) as second:
                assert next_event(first)["type"] == next_event(second)["type"] == "speech.audio.delta"
                assert [h["active_streams"] for h in health(shim).values()] == [1, 1]
                os.killpg(victim.proc.pid, signal.SIGKILL)
                # the stream on the dead pod ends with a coded error; the other goes on
                dead, _ = race([first, second])
                assert [next_event([first, second][1 - dead])["type"] for _ in range(3)] == \
                    ["speech.audio.delta"] * 3
        victim.stop()

        # new requests, the open session's next utterance and a new session: all on the survivor
        before = served(survivor)
        for _ in range(3):
            speak(shim)
        moved = session.say("After the failure.")
        assert not moved.errors, moved.errors
        fresh = asyncio.run(utterances(shim, ["A new session."]))
        assert not fresh[0].errors, fresh[0].errors
        assert served(survivor) - before == 5
        assert wait_for(lambda: not health(shim)[urls[home]]["healthy"], 5)
    finally:
        session.close()

    # the pod comes back on its address: it rejoins and takes traffic again
    victim.start()
    assert wait_for(lambda: health(shim)[urls[home]]["healthy"], 15), health(shim)
    before = served(victim)
    for _ in range(4):
        speak(shim)
    assert served(victim) - before >= 1

    # an address leaves the name (its pod terminating): no new streams go there
    write_hosts(hosts_file, [POD_ADDRESSES[home]])
    assert wait_for(lambda: list(health(shim)) == [urls[home]], 10), health(shim)
    before = counts(pods)
    for _ in range(2):
        speak(shim)
    assert served(victim) - before[home] == 2 and served(survivor) == before[1 - home]
