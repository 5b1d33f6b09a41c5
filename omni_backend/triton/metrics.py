"""Custom Prometheus metrics, exported on Triton's /metrics next to its own.

Every metric object lives as long as the stub process (see `_kept`): the 2.51 stub crashes
(SIGSEGV in `Metric::SaveToSharedMemory`, its shared-memory pool already gone) when a Python
metric object is destroyed during interpreter teardown, and deleting one earlier is not safe
either: stubs that hold the same series (entry instances, a reloaded model beside the one
unloading) share one Prometheus object, which the first delete frees under the others. A series
therefore outlives its model; each model sets its gauges from the truth when it starts.
"""
from __future__ import annotations

import asyncio
import ctypes
from typing import Callable

import triton_python_backend_utils as pb_utils

from omni_backend.metric_families import ACTIVE_STREAMS, FAMILIES

TTFA_BUCKETS_MS = [10, 25, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800]

_cache: dict[str, "pb_utils.MetricFamily"] = {}


def _kept(obj):
    """One reference that is never given back: the object is never destroyed (see above)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


def family(name: str) -> "pb_utils.MetricFamily":
    if name not in _cache:
        desc, kind = FAMILIES[name]
        _cache[name] = _kept(pb_utils.MetricFamily(name=name, description=desc,
                                                   kind=getattr(pb_utils.MetricFamily, kind)))
    return _cache[name]


def metric(family_name: str, **kwargs) -> "pb_utils.Metric":
    return _kept(family(family_name).Metric(**kwargs))


class PipelineMetrics:
    """The metrics one entry model reports, labelled with its pipeline name."""

    def __init__(self, pipeline: str):
        labels = {"pipeline": pipeline}
        self.pipeline = pipeline
        self.ttfa_ms = metric("omni_ttfa_ms", labels=labels, buckets=TTFA_BUCKETS_MS)
        self.audio_seconds = metric("omni_audio_seconds_total", labels=labels)
        self.underrun_seconds = metric("omni_audio_underrun_seconds_total", labels=labels)
        self.streams_with_gap = metric("omni_streams_with_gap_total", labels=labels)
        self.active = metric(ACTIVE_STREAMS, labels=labels)
        self._outcomes: dict[str, "pb_utils.Metric"] = {}
        self._errors: dict[str, "pb_utils.Metric"] = {}

    def finished(self, outcome: str, error_code: str | None = None) -> None:
        """outcome: ok | error | cancelled."""
        if outcome not in self._outcomes:
            self._outcomes[outcome] = metric("omni_requests_total",
                                             labels={"pipeline": self.pipeline, "outcome": outcome})
        self._outcomes[outcome].increment(1)
        if error_code:
            if error_code not in self._errors:
                self._errors[error_code] = metric("omni_errors_total",
                                                  labels={"pipeline": self.pipeline, "code": error_code})
            self._errors[error_code].increment(1)


class StageMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.active = metric("omni_stage_active_requests", labels={"model": model_name})
        self._voice_encodings = None

    def engine_gauges(self) -> tuple["pb_utils.Metric", "pb_utils.Metric"]:
        """vLLM's own running and waiting counts for this stage (set from the truth at start)."""
        labels = {"model": self.model_name}
        running = metric("omni_vllm_running_requests", labels=labels)
        waiting = metric("omni_vllm_waiting_requests", labels=labels)
        running.set(0)
        waiting.set(0)
        return running, waiting

    def voice_encoded(self) -> None:
        if self._voice_encodings is None:
            self._voice_encodings = metric("omni_voice_encodings_total", labels={"model": self.model_name})
        self._voice_encodings.increment(1)


class LoopGauge:
    """A gauge that follows a count, set on the event loop's next turn after the count changed:
    one round trip to tritonserver for however many streams started or ended in between, and
    none on the way of the change itself (a stream's start: its stage begins its work first; a
    Python-backend metric call took ~0.16 ms of a busy stub's loop, py-spy). Call `changed` on
    the loop's thread."""

    def __init__(self, gauge: "pb_utils.Metric", count: Callable[[], int], loop: asyncio.AbstractEventLoop):
        self._gauge, self._count, self._loop = gauge, count, loop
        self._due = False
        gauge.set(count())   # a reloaded model starts from the truth, not the dead one's count

    def changed(self) -> None:
        if not self._due:
            self._due = True
            self._loop.call_soon(self._set)

    def _set(self) -> None:
        self._due = False
        self._gauge.set(self._count())
