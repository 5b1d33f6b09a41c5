"""What the supervisor asks of a running tritonserver, over its gRPC port: which pipelines it
serves, whether each pipeline answers (an entry's `CONTROL=ping` asks every stage), draining
entries before a shutdown, reloading a pipeline's models, and the streams still open."""
from __future__ import annotations

import asyncio
import re
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as grpcaio

from omni_backend.errors import with_code
from omni_backend.grpc_streams import end_stream
from omni_backend.metric_families import ACTIVE_STREAMS


@dataclass
class Pipeline:
    name: str                                   # = its entry model
    stages: list[str] = field(default_factory=list)
    entry_instances: int = 1

    @property
    def models(self) -> list[str]:
        return [self.name, *self.stages]


class PingFailed(Exception):
    """A pipeline did not answer its ping (or one of its stubs is gone)."""

    def __init__(self, message: str, model: str | None = None):
        super().__init__(message)
        self.model = model   # the model that failed, when known (the entry names its stages)


def _control_inputs(command: str, text: str = "") -> list:
    inputs = []
    for name, value in (("TEXT", text), ("CONTROL", command)):
        t = grpcaio.InferInput(name, [1], "BYTES")
        t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
        inputs.append(t)
    return inputs


class TritonControl:
    def __init__(self, grpc_url: str, metrics_url: str | None):
        self.grpc_url = grpc_url
        self.metrics_url = metrics_url
        # reconnect within 0.1-0.5 s (gRPC's default back-off reaches seconds while the server starts)
        self.client = grpcaio.InferenceServerClient(grpc_url, channel_args=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500)])

    async def close(self) -> None:
        try:
            await self.client.close()
        except Exception:  # noqa: BLE001 - a dead channel may fail to close
            pass

    async def ready(self, timeout_s: float = 2.0) -> bool:
        try:
            return await self.client.is_server_ready(client_timeout=timeout_s)
        except Exception:  # noqa: BLE001 - not up (yet)
            return False

    async def pipelines(self, timeout_s: float = 5.0) -> dict[str, Pipeline]:
        """Pipelines of the repository: an entry model is the one whose `pipeline` parameter is
        its own name; the other models naming that pipeline are its stages."""
        index = await self.client.get_model_repository_index(as_json=True, client_timeout=timeout_s)
        found: dict[str, Pipeline] = {}
        members: list[tuple[str, str]] = []
        for model in index.get("models", []):
            name = model.get("name", "")
            try:
                reply = await self.client.get_model_config(name, as_json=True, client_timeout=timeout_s)
            except Exception:  # noqa: BLE001 - an unloaded model has no config to read
                continue
            params = reply.get("config", {}).get("parameters") or {}
            pipeline = (params.get("pipeline") or {}).get("string_value")
            if not pipeline:
                continue
            if pipeline == name:
                groups = reply.get("config", {}).get("instance_group") or [{}]
                found.setdefault(name, Pipeline(name, entry_instances=sum(int(g.get("count", 1)) for g in groups)))
            else:
                members.append((pipeline, name))
        for pipeline, name in members:
            if pipeline in found:
                found[pipeline].stages.append(name)
        return found

    async def model_states(self, timeout_s: float = 2.0) -> dict[str, str]:
        index = await self.client.get_model_repository_index(as_json=True, client_timeout=timeout_s)
        return {m.get("name", ""): m.get("state", "") for m in index.get("models", [])}

    async def _control(self, entry: str, command: str, timeout_s: float, text: str = "") -> None:
        async def requests():
            # the aio client only sends the empty FINAL response when asked by this parameter
            yield {"model_name": entry, "inputs": _control_inputs(command, text),
                   "parameters": {"triton_enable_empty_final_response": True}}

        responses = self.client.stream_infer(inputs_iterator=requests(), stream_timeout=timeout_s)
        complete = False
        try:
            async for result, error in responses:
                if error is not None:
                    raise PingFailed(with_code(str(error.message() if hasattr(error, "message") else error)))
                if result.get_response().parameters["triton_final_response"].bool_param:
                    complete = True
                    return
        except PingFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a timeout, a reset stream: no answer
            raise PingFailed(f"unavailable: {entry}: no answer ({type(e).__name__}: {e})") from None
        finally:
            await end_stream(responses, complete)
        raise PingFailed(f"unavailable: {entry}: the stream ended without an answer")

    async def ping(self, pipeline: Pipeline, timeout_s: float) -> None:
        """Raises PingFailed naming the model that did not answer."""
        try:
            await asyncio.wait_for(self._control(pipeline.name, "ping", timeout_s), timeout_s + 0.5)
        except asyncio.TimeoutError:
            raise PingFailed(f"unavailable: {pipeline.name}: no answer in {timeout_s:.1f} s", pipeline.name) from None
        except PingFailed as failure:
            failure.model = next((m for m in pipeline.stages if m in str(failure)), pipeline.name)
            raise

    async def drain(self, pipeline: Pipeline, timeout_s: float = 2.0) -> None:
        await asyncio.wait_for(self._control(pipeline.name, "drain", timeout_s), timeout_s + 0.5)

    async def abort(self, pipeline: Pipeline, why: str, timeout_s: float = 5.0) -> None:
        """End every open stream of the pipeline with `unavailable: <pipeline>: <why>`."""
        await asyncio.wait_for(self._control(pipeline.name, "abort", timeout_s, why), timeout_s + 0.5)

    async def hold(self, pipeline: Pipeline, why: str, timeout_s: float = 5.0) -> None:
        """As `abort`, and the entry turns new streams away with the same answer until `resume`."""
        await asyncio.wait_for(self._control(pipeline.name, "hold", timeout_s, why), timeout_s + 0.5)

    async def resume(self, pipeline: Pipeline, timeout_s: float = 5.0) -> None:
        await asyncio.wait_for(self._control(pipeline.name, "resume", timeout_s), timeout_s + 0.5)

    async def unload(self, model: str, timeout_s: float = 10.0) -> None:
        await self.client.unload_model(model, client_timeout=timeout_s)

    async def load(self, model: str, timeout_s: float = 600.0) -> None:
        await self.client.load_model(model, client_timeout=timeout_s)

    def _metrics(self) -> str | None:
        if not self.metrics_url:
            return None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2.0) as r:
                return r.read().decode(errors="replace")
        except OSError:
            return None

    def active_streams(self, pipeline: str | None = None) -> float | None:
        """The `omni_active_streams` gauges summed, of one pipeline or all, or None without a
        metrics endpoint (blocking)."""
        text = self._metrics()
        if text is None:
            return None
        label = r'[^}]*pipeline="' + re.escape(pipeline) + r'"[^}]*' if pipeline else r"[^}]*"
        return sum(float(v) for v in re.findall(r"^" + ACTIVE_STREAMS + r"\{" + label + r"\} ([0-9.eE+-]+)$", text, re.M))

    def progress(self) -> dict[str, float] | None:
        """Per pipeline, requests finished plus seconds of audio sent: it grows while the
        pipeline does any work at all (blocking; None without a metrics endpoint)."""
        text = self._metrics()
        if text is None:
            return None
        out: dict[str, float] = {}
        pattern = r'^(?:omni_requests_total|omni_audio_seconds_total)\{[^}]*pipeline="([^"]+)"[^}]*\} ([0-9.eE+-]+)$'
        for pipeline, value in re.findall(pattern, text, re.M):
            out[pipeline] = out.get(pipeline, 0.0) + float(value)
        return out
