"""The Triton endpoints behind the shim, and how a stream picks one.

Each `--triton` URL is an endpoint with its own gRPC client. A prober checks every endpoint
each `probe_interval_s` (server live + repository index), so the shim knows which pipelines
each one serves: a pipeline is served when its entry model and every stage model it names are
READY. A pipeline being reloaded (its stage died) is therefore not routed to, while the same
server's other pipelines still are. An endpoint that refuses the connection is marked down at
once; one whose probe times out, on the second probe in a row (a server this busy still streams).
A down endpoint is re-probed on a fresh channel (no gRPC reconnect back-off) until it answers
again, then it rejoins. The old channel is closed once the streams still running on it end:
closing it cancels them, and a probe that timed out on a busy server is no reason to cut them.

A new stream goes to the healthy endpoint serving its pipeline with the fewest active streams
(ties: the one picked longest ago). Until the first audio arrives a stream may move: an endpoint
that is unreachable, lacks the model, or answers `unavailable` (at capacity, draining before a
shutdown, restarting a pipeline) is skipped and the next one is tried, so a dead or stopping
server costs a client nothing. After the first audio the stream stays where it is. A caller that
names a `prefer`red endpoint (a WebSocket session's previous one) gets it while it can serve. A
stream that takes its text while it runs (`open_text_stream`) goes to a healthy endpoint the same
way but is not moved once open: its first audio may wait for text the client has not written.

Endpoints come from `--triton` URLs and from `--triton-service` names (discovery.py), resolved
again every `resolve_interval_s`: a new address joins (probed first), an address gone from the
name takes no new streams, and its channel is closed once the streams still on it end (a pod
that is terminating drains them). A name that fails to resolve keeps the endpoints it had: the
prober judges those.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from typing import Any, AsyncIterator, Awaitable

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio

from client.speech_api.catalog import Catalog, entry_pipeline_name
from client.speech_api.discovery import TritonService
from client.speech_api.errors import ApiError, from_triton, internal, no_backend
from client.triton_stream import StreamPart, TritonStreamError, astream, astream_parts, next_watched
from client.triton_text_stream import TextInputStream

log = logging.getLogger("omni.speech_api")

# Error messages that mean "this endpoint cannot serve the model", not "the request is bad".
_MODEL_MISSING = ("unknown model", "is not found", "is not ready", "no version is available")
_ENDPOINT_DOWN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                  grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


class TritonEndpoint:
    def __init__(self, url: str, service: TritonService | None = None):
        self.url = url
        self.service = service                        # the name it was discovered through, if any
        self.removed = False                          # gone from that name: no new streams
        self.client: Any = None
        self.healthy = False
        self.active = 0
        self.pipelines: dict[str, str | None] = {}   # pipeline -> its catalog (entry parameter), ready ones
        self.seen: set[str] = set()                   # every pipeline this endpoint has served
        self.unready: set[str] = set()                # seen, but its models are not all READY now
        self.avoid: dict[str, float] = {}             # pipeline -> until when new streams go elsewhere
        self.probe_lock = asyncio.Lock()
        self.configs: dict[str, dict] = {}
        self.last_pick = 0
        self.last_error = "not probed yet"
        self.probed_at = 0.0
        self.probe_timeouts = 0                       # probes in a row that timed out
        self._streams: dict[Any, int] = {}            # client -> streams open on it
        self._retired: set[Any] = set()               # replaced clients, closed when their streams end

    def acquire(self) -> Any:
        """The client a new stream runs on, counted until `release`."""
        self.active += 1
        self._streams[self.client] = self._streams.get(self.client, 0) + 1
        return self.client

    async def release(self, client: Any) -> None:
        self.active -= 1
        left = self._streams.get(client, 1) - 1
        if left > 0:
            self._streams[client] = left
            return
        self._streams.pop(client, None)
        if client in self._retired:
            self._retired.discard(client)
            await _close(client)
        if self.removed and self.active == 0:
            await self.close()

    async def reconnect(self) -> None:
        old, self.client = self.client, grpcaio.InferenceServerClient(self.url)
        if old is None:
            return
        if self._streams.get(old):
            self._retired.add(old)   # its streams still run: closing the channel would cancel them
        else:
            await _close(old)

    async def close(self) -> None:
        for client in {self.client, *self._retired} - {None}:
            await _close(client)
        self._retired.clear()

    def mark_down(self, reason: str) -> None:
        if self.healthy:
            log.warning("triton %s is down: %s", self.url, reason)
        self.healthy = False
        self.last_error = reason
        self.configs.clear()

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "healthy": self.healthy, "active_streams": self.active,
                "pipelines": sorted(self.pipelines), "last_error": None if self.healthy else self.last_error,
                "service": str(self.service) if self.service else None}


async def _close(client: Any) -> None:
    try:
        await client.close()
    except Exception:  # noqa: BLE001 - a dead channel may fail to close
        pass


def _timed_out(error: BaseException) -> bool:
    if isinstance(error, grpc.RpcError):
        return error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return "DEADLINE_EXCEEDED" in str(error) or "Deadline Exceeded" in str(error)


class PoolStream:
    """One Triton stream on one endpoint; iterate (audio, rate) chunks (or `StreamPart`s, when
    opened with ``parts``), then `aclose()`.

    A stream whose pipeline the prober sees unloaded on its server (the supervisor restarting it
    after its entry's stub died) ends with a 503: Triton 2.51 cannot answer the streams of a dead
    entry, they would hang."""

    def __init__(self, endpoint: TritonEndpoint, client: Any, source: AsyncIterator,
                 first: tuple[np.ndarray, int] | StreamPart | None,
                 pipeline: str = "", watch_s: float = 0.5):
        self.endpoint = endpoint
        self.client = client
        self._source = source
        self.first = first
        self.pipeline = pipeline
        self.watch_s = watch_s
        self._closed = False

    async def _next(self, it: AsyncIterator):
        async def still_routed() -> None:
            if self.pipeline in self.endpoint.unready:
                raise no_backend(f"'{self.pipeline}' is restarting on Triton at {self.endpoint.url}; "
                                 "the stream was cut, retry")
        return await next_watched(it, self.watch_s, still_routed)

    async def chunks(self) -> AsyncIterator[tuple[np.ndarray, int]]:
        if self.first is None:
            return
        yield self.first
        async for chunk in self._rest():
            yield chunk

    async def _rest(self) -> AsyncIterator[tuple[np.ndarray, int]]:
        """What follows the first response."""
        it = self._source.__aiter__()
        try:
            while True:
                try:
                    chunk = await self._next(it)
                except StopAsyncIteration:
                    return
                yield chunk
        except (grpc.RpcError, TritonStreamError) as e:
            raise self._coded(e, "mid-stream") from None

    def _coded(self, error: "grpc.RpcError | TritonStreamError", when: str) -> ApiError:
        """A failure as the client is told: the channel's own failure is a 503 (and marks the
        endpoint down); Triton's answers keep their code."""
        if isinstance(error, grpc.RpcError):
            self.endpoint.mark_down(f"{error.code().name}: {error.details()}")
            return no_backend(f"Triton at {self.endpoint.url} went away {when}")
        return from_triton(str(error))

    async def aclose(self) -> None:
        """End the stream; if Triton is still producing, this cancels its request."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._source.aclose()
        finally:
            await self.endpoint.release(self.client)


class PoolTextStream(PoolStream):
    """A stream that takes its text while it runs (client/triton_text_stream.py): `append` more,
    `end` it; no first response is waited for (it may need more text)."""

    def __init__(self, endpoint: TritonEndpoint, client: Any, text: TextInputStream, first_piece: str,
                 pipeline: str = "", watch_s: float = 0.5):
        super().__init__(endpoint, client, text.start(first_piece), None, pipeline, watch_s)
        self.text = text

    async def chunks(self) -> AsyncIterator[tuple[np.ndarray, int]]:
        async for chunk in self._rest():
            yield chunk

    async def append(self, text: str) -> None:
        await self._control(self.text.append(text))

    async def end(self) -> None:
        await self._control(self.text.end())

    async def _control(self, call: Awaitable[None]) -> None:
        """An append's failure, coded as the audio's."""
        try:
            await call
        except (grpc.RpcError, TritonStreamError) as e:
            raise self._coded(e, "while taking text") from None


class TritonPool:
    def __init__(self, urls: list[str], catalog: Catalog, probe_interval_s: float = 1.0,
                 probe_timeout_s: float = 2.0, services: list[TritonService] | None = None,
                 resolve_interval_s: float = 5.0):
        self.services = list(services or [])
        if not urls and not self.services:
            raise ValueError("at least one Triton URL or service name is needed")
        self.endpoints = [TritonEndpoint(u) for u in urls]
        self.catalog = catalog
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.resolve_interval_s = resolve_interval_s
        self._picks = itertools.count(1)
        self._tasks: list[asyncio.Task] = []
        self._removed: set[TritonEndpoint] = set()   # gone from their name, streams still open
        self.known_pipelines: set[str] = set()   # every pipeline some endpoint has served
        self.resolve_errors: dict[str, str] = {}  # service -> why its last resolution failed
        self._resolve_lock = asyncio.Lock()       # one resolution at a time: an address joins once

    async def start(self) -> None:
        for ep in self.endpoints:
            await ep.reconnect()
        await self.resolve_all(probe=False)
        await self.probe_all()
        self._tasks = [asyncio.create_task(self._probe_forever())]
        if self.services:
            self._tasks.append(asyncio.create_task(self._resolve_forever()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for ep in [*self.endpoints, *self._removed]:
            await ep.close()

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(self.resolve_interval_s)
            try:
                await self.resolve_all()
            except Exception:  # noqa: BLE001 - discovery must survive anything
                log.exception("resolving the Triton services failed")

    async def resolve_all(self, probe: bool = True) -> None:
        """Resolve every service name once: new addresses join, addresses gone leave."""
        async with self._resolve_lock:
            for service in self.services:
                await self._resolve(service, probe)

    async def _resolve(self, service: TritonService, probe: bool) -> None:
        try:
            wanted = set(await service.addresses())
        except OSError as e:
            if self.resolve_errors.get(str(service)) != str(e):
                log.warning("%s does not resolve (%s); keeping its %d endpoint(s)", service, e,
                            sum(ep.service == service for ep in self.endpoints))
            self.resolve_errors[str(service)] = str(e)
            return
        self.resolve_errors.pop(str(service), None)
        have = {ep.url: ep for ep in self.endpoints if ep.service == service}
        for url in sorted(wanted - set(have)):
            ep = TritonEndpoint(url, service)
            await ep.reconnect()
            if probe:
                await self.probe(ep)   # joins routing once it has been seen serving
            self.endpoints.append(ep)
            log.info("%s: found triton %s", service, url)
        for url in sorted(set(have) - wanted):
            await self._remove(have[url])

    async def _remove(self, ep: TritonEndpoint) -> None:
        log.info("%s: triton %s left (%d stream(s) still on it run to their end)", ep.service, ep.url, ep.active)
        self.endpoints.remove(ep)
        ep.removed = True
        ep.healthy = False
        ep.last_error = f"no longer an address of {ep.service}"
        self._removed = {e for e in self._removed if e.active > 0}
        if ep.active == 0:
            await ep.close()
        else:
            self._removed.add(ep)   # closed by its last stream's release (or by close())

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self.probe_all()
            except Exception:  # noqa: BLE001 - the prober must survive anything
                log.exception("probe failed")

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(ep) for ep in list(self.endpoints)))
        self.catalog.served = {name for ep in self.endpoints for name in ep.pipelines}

    async def probe(self, ep: TritonEndpoint) -> None:
        # one probe per endpoint at a time: a probe that reconnects closes the channel another
        # probe would still be using (its call would end in CancelledError)
        async with ep.probe_lock:
            await self._probe(ep)

    async def _probe(self, ep: TritonEndpoint) -> None:
        if ep.removed:
            return
        timeout = self.probe_timeout_s
        was_healthy = ep.healthy
        try:
            if not ep.healthy:
                await ep.reconnect()
            # live, not ready: strict readiness is false while one pipeline reloads, and the
            # others are still served; readiness is judged per pipeline below
            if not await ep.client.is_server_live(client_timeout=timeout):
                raise RuntimeError("server is not live")
            index = await ep.client.get_model_repository_index(as_json=True, client_timeout=timeout)
            ready = {m.get("name", "") for m in index.get("models", []) if m.get("state") == "READY"}
            pipelines: dict[str, str | None] = {}
            for name in ready:
                if name not in ep.configs:
                    reply = await ep.client.get_model_config(name, as_json=True, client_timeout=timeout)
                    ep.configs[name] = reply.get("config", {})
                config = ep.configs[name]
                pipeline = entry_pipeline_name(name, config)
                params = config.get("parameters") or {}
                stages = [s for s in ((params.get("stages") or {}).get("string_value") or "").split(",") if s]
                if pipeline and all(stage in ready for stage in stages):
                    pipelines[pipeline] = (params.get("catalog") or {}).get("string_value")
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # we are being cancelled: let it through
                raise
            ep.mark_down("the channel was closed under the probe")   # a reconnect elsewhere
            ep.probed_at = time.monotonic()
            return
        except Exception as e:  # noqa: BLE001 - any failure means "not usable now"
            ep.probed_at = time.monotonic()
            if _timed_out(e) and ep.healthy and ep.probe_timeouts == 0:
                ep.probe_timeouts = 1   # busy, maybe: down if the next probe times out too
                return
            ep.probe_timeouts = 0
            ep.mark_down(f"{type(e).__name__}: {e}")
            return
        ep.probe_timeouts = 0
        ep.pipelines = pipelines
        ep.seen |= set(pipelines)
        ep.unready = ep.seen - set(pipelines)
        ep.healthy = True
        ep.probed_at = time.monotonic()
        for name, catalog in pipelines.items():
            self.catalog.learn(name, catalog)
            self.known_pipelines.add(name)
        if not was_healthy:
            log.info("triton %s is up, serving %s", ep.url, ", ".join(sorted(pipelines)) or "nothing")

    def any_healthy(self) -> bool:
        return any(ep.healthy for ep in self.endpoints)

    def unserved(self) -> list[str]:
        """Pipelines seen before that no endpoint serves now (a stage died, a server is down)."""
        served = {name for ep in self.endpoints if ep.healthy for name in ep.pipelines}
        return sorted(self.known_pipelines - served)

    def status(self) -> list[dict[str, Any]]:
        return [ep.status() for ep in self.endpoints]

    def choose(self, pipeline: str, skip: list[TritonEndpoint],
               prefer: TritonEndpoint | None = None) -> TritonEndpoint | None:
        now = time.monotonic()
        candidates = [ep for ep in self.endpoints
                      if ep.healthy and pipeline in ep.pipelines and ep not in skip
                      and ep.avoid.get(pipeline, 0.0) <= now]
        if not candidates:
            return None
        if prefer in candidates:
            return prefer
        return min(candidates, key=lambda ep: (ep.active, ep.last_pick))

    async def open_text_stream(self, pipeline: str, first_piece: str, params: dict[str, Any], request_id: str,
                               prefer: TritonEndpoint | None = None) -> PoolTextStream:
        """Start a stream that takes its text while it runs, with its first piece (`request_id`:
        the stream's own, which its appends name)."""
        ep = self.choose(pipeline, [], prefer)
        if ep is None:   # all looked down: maybe one just came back
            await self.probe_all()
            ep = self.choose(pipeline, [], prefer)
        if ep is None:
            raise no_backend(f"No Triton endpoint can serve '{pipeline}' now", 1.0)
        client = ep.acquire()
        ep.last_pick = next(self._picks)
        return PoolTextStream(ep, client, TextInputStream(client, pipeline, params, request_id), first_piece,
                              pipeline, min(0.5, self.probe_interval_s))

    async def open_stream(self, pipeline: str, text: str, params: dict[str, Any],
                          request_id: str, parts: bool = False,
                          prefer: TritonEndpoint | None = None) -> PoolStream:
        """Start a stream and wait for its first audio, moving on from endpoints that fail.
        ``parts``: the stream yields every response as a `StreamPart` (a chat's text deltas and
        its audio) and its first response, whatever it carries, is the one waited for.
        ``prefer``: the endpoint to use while it can serve the pipeline (a session's own)."""
        skip: list[TritonEndpoint] = []
        busy: ApiError | None = None
        reprobed = False
        while True:
            ep = self.choose(pipeline, skip, prefer)
            if ep is None and not reprobed and not any(e.healthy for e in self.endpoints if e not in skip):
                reprobed = True          # all looked down: maybe one just came back
                await self.resolve_all()
                await self.probe_all()
                ep = self.choose(pipeline, skip, prefer)
            if ep is None:
                if busy is not None:
                    raise busy
                raise no_backend(f"No Triton endpoint can serve '{pipeline}' now "
                                 f"({'; '.join(f'{e.url}: {e.last_error}' for e in self.endpoints if not e.healthy) or 'model not loaded'})")
            client = ep.acquire()
            ep.last_pick = next(self._picks)
            # the client's request id may repeat; the stream's own id must not (a client that
            # leaves ends its stream by naming it)
            source = (astream_parts if parts else astream)(client, pipeline, text, params or None,
                                                           f"{request_id}-{uuid.uuid4().hex[:12]}", unique_id=True,
                                                           watch_s=None)   # PoolStream watches readiness
            try:
                first = await source.__anext__()
            except StopAsyncIteration:
                first = None
            except grpc.RpcError as e:
                await source.aclose()
                await ep.release(client)
                if e.code() in _ENDPOINT_DOWN:
                    ep.mark_down(f"{e.code().name}: {e.details()}")
                    skip.append(ep)
                    continue
                raise internal(f"Triton at {ep.url}: {e.code().name}: {e.details()}") from None
            except TritonStreamError as e:
                await source.aclose()
                await ep.release(client)
                message = str(e)
                if any(s in message for s in _MODEL_MISSING):
                    ep.pipelines.pop(pipeline, None)
                    skip.append(ep)
                    continue
                error = from_triton(message)
                if error.status in (429, 503):  # at capacity, draining, restarting: try another
                    if error.status == 503:     # draining or restarting: not this one for a while
                        ep.avoid[pipeline] = time.monotonic() + max(2.0, 2 * self.probe_interval_s)
                    busy = error
                    skip.append(ep)
                    continue
                raise error from None
            except BaseException:
                try:
                    await source.aclose()
                finally:
                    await ep.release(client)
                raise
            return PoolStream(ep, client, source, first, pipeline, min(0.5, self.probe_interval_s))
