"""Tritons found through a DNS name: addresses join and leave the pool as the name changes, an
address that leaves keeps its running streams, a name that fails keeps what it had, and a
session's preferred endpoint wins while it can serve. (Resolution through the system resolver
and real servers: tests/system/test_speech_api_discovery.py.)"""
from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import pytest

from client.speech_api.__main__ import parse_args
from client.speech_api.catalog import Catalog
from client.speech_api.discovery import TritonService, grpc_address
from client.speech_api.pool import TritonPool
from client.triton_process import free_port


@dataclass(frozen=True)
class ListedService(TritonService):
    """A name whose answer the test sets: the pool's side of discovery, without a resolver."""
    answers: tuple = ()

    async def addresses(self) -> list[str]:
        answer = self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return sorted(grpc_address(ip, self.port) for ip in answer)


def test_service_names_are_parsed_with_the_flag_named_in_errors():
    assert TritonService.parse("triton-pods.tts.svc.cluster.local:8001") == \
        TritonService("triton-pods.tts.svc.cluster.local", 8001)
    for bad in ("triton-pods", ":8001", "triton-pods:http", "triton-pods:0", "triton-pods:70000"):
        with pytest.raises(ValueError, match="--triton-service: expected NAME:PORT"):
            TritonService.parse(bad)
    assert grpc_address("::1", 8001) == "[::1]:8001"


def test_the_system_resolver_gives_every_address_of_a_name():
    got = asyncio.run(TritonService("localhost", 8123).addresses())
    want = {grpc_address(info[4][0], 8123) for info in socket.getaddrinfo("localhost", 8123, type=socket.SOCK_STREAM)}
    assert set(got) == want and got


def test_command_line_takes_services_instead_of_urls():
    args = parse_args(["--triton-service", "triton-pods:8001", "--resolve-interval", "2"])
    assert args.triton is None and args.triton_service == ["triton-pods:8001"] and args.resolve_interval == 2
    with pytest.raises(SystemExit):
        parse_args(["--triton-service", "triton-pods"])
    with pytest.raises(SystemExit):
        parse_args(["--triton-service", "triton-pods:8001", "--resolve-interval", "0"])


def test_addresses_join_and_leave_as_the_name_changes():
    port = free_port()   # nothing listens: every endpoint is probed down, which is not the point here
    answers: list = [["127.0.0.2", "127.0.0.3"]]
    service = ListedService("triton-pods", port, answers)  # type: ignore[arg-type]

    async def scenario():
        pool = TritonPool([], Catalog(), probe_interval_s=60, probe_timeout_s=0.5, services=[service],
                          resolve_interval_s=60)
        await pool.start()
        try:
            assert [ep.url for ep in pool.endpoints] == [f"127.0.0.2:{port}", f"127.0.0.3:{port}"]
            assert all(ep.service == service for ep in pool.endpoints)

            # a pod leaves while one stream runs on it: no new streams, its channel stays open
            # until that stream ends, then it is closed
            leaving = pool.endpoints[1]
            client = leaving.acquire()
            answers[0] = ["127.0.0.2"]
            await pool.resolve_all()
            assert [ep.url for ep in pool.endpoints] == [f"127.0.0.2:{port}"]
            assert leaving.removed and not leaving.healthy and "no longer an address" in leaving.last_error
            assert leaving.client is client
            await leaving.release(client)
            with pytest.raises(Exception):
                await client.is_server_live(client_timeout=1)   # closed with its last stream

            # a failure to resolve keeps the endpoints it had; the next answer applies again
            answers[0] = OSError("Name or service not known")
            await pool.resolve_all()
            assert [ep.url for ep in pool.endpoints] == [f"127.0.0.2:{port}"]
            assert "not known" in pool.resolve_errors[str(service)]
            answers[0] = ["127.0.0.4", "127.0.0.2"]
            await pool.resolve_all()
            assert [ep.url for ep in pool.endpoints] == [f"127.0.0.2:{port}", f"127.0.0.4:{port}"]
            assert not pool.resolve_errors
            assert [s["service"] for s in pool.status()] == [f"triton-pods:{port}"] * 2
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_a_preferred_endpoint_wins_while_it_can_serve():
    async def scenario():
        pool = TritonPool(["127.0.0.1:1", "127.0.0.1:2"], Catalog(), probe_interval_s=60)
        a, b = pool.endpoints
        for ep in (a, b):
            ep.healthy, ep.pipelines = True, {"hibari": None}
        a.active = 3   # busier: without a preference b is picked
        assert pool.choose("hibari", []) is b
        assert pool.choose("hibari", [], prefer=a) is a
        a.healthy = False
        assert pool.choose("hibari", [], prefer=a) is b
        a.healthy, a.pipelines = True, {}
        assert pool.choose("hibari", [], prefer=a) is b

    asyncio.run(scenario())


def test_resolutions_at_once_add_an_address_once():
    """The resolver loop and a request that found every endpoint down may resolve together."""
    port = free_port()
    service = ListedService("triton-pods", port, [["127.0.0.2", "127.0.0.3"]])  # type: ignore[arg-type]

    async def scenario():
        pool = TritonPool(["127.0.0.1:1"], Catalog(), probe_interval_s=60, probe_timeout_s=0.5,
                          services=[service], resolve_interval_s=60)
        try:
            await asyncio.gather(pool.resolve_all(), pool.resolve_all(), pool.resolve_all())
            assert sorted(ep.url for ep in pool.endpoints) == ["127.0.0.1:1", f"127.0.0.2:{port}", f"127.0.0.3:{port}"]
        finally:
            await pool.close()

    asyncio.run(scenario())
