"""CUDA graphs per batch-size bucket for a step function over static buffers (GPU only).

A runner that keeps every input and output of its step in preallocated buffers exposes
``step(batch)`` (rows ``0..batch-1``). :class:`GraphBuckets` captures it once per bucket size,
largest first, in one shared memory pool, after a few eager warm-up runs on a side stream, and
replays the smallest bucket that holds the rows in use; rows past the real batch are padding
that the step must keep harmless.

Nothing here runs or imports CUDA state until :meth:`GraphBuckets.capture` is called, and CPU
engines never create one. ``enabled=False`` (``enforce_eager``) runs the same step function
eagerly, which is what graph replays are checked against.
"""
from __future__ import annotations

import bisect
import logging
import time
import warnings
from typing import Callable, Hashable, Iterable, Optional

import torch

__all__ = ["GraphBuckets", "bucket_sizes", "capture_graph"]

logger = logging.getLogger(__name__)


def bucket_sizes(sizes: Iterable[int], max_rows: int) -> list[int]:
    """The capture sizes: ``sizes`` clipped to ``max_rows``, doubled on from the largest of them
    while below ``max_rows`` (so a big ``max_num_seqs`` does not pad 17 rows to 64), and
    ``max_rows`` itself."""
    out = {int(s) for s in sizes if 1 <= int(s) <= max_rows}
    if out:
        size = max(out) * 2
        while size < max_rows:
            out.add(size)
            size *= 2
    return sorted(out | {max_rows})


def capture_graph(fn: Callable[[], object], pool, stream: "torch.cuda.Stream",
                  warmup: int) -> tuple["torch.cuda.CUDAGraph", object]:
    """``fn`` run ``warmup`` times on the side ``stream``, then captured into a new CUDA graph
    that allocates from ``pool``. Returns the graph and ``fn``'s output (static: replays rewrite
    it). Call under ``torch.cuda.device(...)`` of the tensors ``fn`` uses: kernels on another
    device than the current one are not recorded, and the graph would replay as nothing.

    Raises if the capture fails or records nothing; the thread's current stream is then restored
    (when ending a failed capture raises, ``torch.cuda.graph`` leaves its capture stream current)."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    previous = torch.cuda.current_stream()
    graph = torch.cuda.CUDAGraph()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # on our stream, not torch's process-wide capture stream (made on the first capture's device)
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = fn()
    except BaseException as exc:
        torch.cuda.set_stream(previous)
        cause = exc.__context__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from exc  # a signal or exit inside fn, hidden by the failed end of capture
        raise
    for warning in caught:
        if "graph is empty" in str(warning.message).lower():
            raise RuntimeError(f"captured an empty CUDA graph ({warning.message}): the step ran on another "
                               "device than the current one")
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return graph, out


class GraphBuckets:
    """``step(batch, *variant)`` captured per (bucket, variant).

    ``variants`` are extra hashable arguments of the step that change its code path (e.g. greedy
    only vs sampling); each is captured for every bucket."""

    def __init__(self, step: Callable[..., None], sizes: Iterable[int], max_rows: int,
                 variants: Iterable[tuple] = ((),), enabled: bool = True, warmup: int = 2,
                 device: "torch.device | str | None" = None) -> None:
        self.step = step
        self.device = device  # the CUDA device the step runs on (None: the current one)
        self.sizes = bucket_sizes(sizes, max_rows)
        self.variants = [tuple(v) for v in variants]
        self.enabled = enabled
        self.warmup = warmup
        self.graphs: dict[tuple[int, Hashable], "torch.cuda.CUDAGraph"] = {}
        self.capture_seconds = 0.0
        self._pool = None

    def bucket(self, rows: int) -> int:
        """Smallest bucket size holding ``rows``."""
        i = bisect.bisect_left(self.sizes, rows)
        if i == len(self.sizes):
            raise ValueError(f"{rows} rows exceed the largest bucket {self.sizes[-1]}")
        return self.sizes[i]

    def capture(self, prepare: Optional[Callable[[int], None]] = None) -> None:
        """Capture every (bucket, variant), largest bucket first. ``prepare(size)`` puts the
        buffers into a state the step may run on (e.g. harmless padding rows) before each
        warm-up. A no-op when disabled."""
        if not self.enabled:
            return
        started = time.perf_counter()
        with torch.cuda.device(self.device):
            self._pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream()
            for size in reversed(self.sizes):
                for variant in self.variants:
                    if prepare is not None:
                        prepare(size)
                    self.graphs[(size, variant)], _ = capture_graph(lambda: self.step(size, *variant), self._pool,
                                                                    stream, self.warmup)
            torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - started
        logger.info("captured %d CUDA graphs (buckets %s, %d variants) in %.2f s", len(self.graphs), self.sizes,
                    len(self.variants), self.capture_seconds)

    def run(self, rows: int, *variant) -> int:
        """Run the step for at least ``rows`` rows (replay if captured, else eager). Returns the
        bucket size used: rows ``rows..size-1`` were padding."""
        size = self.bucket(rows)
        graph = self.graphs.get((size, tuple(variant)))
        if graph is None:
            self.step(size, *variant)
        else:
            with torch.cuda.device(self.device):  # the engine thread's current device may be another
                graph.replay()
        return size
