"""Per-pipeline stream limit of the shim (`--max-streams-per-pipeline`): the request over the
limit gets 429 with Retry-After before any work starts. 0 means no limit here (Triton's own
`max_streams` still answers `unavailable`, which is also a 429)."""
from __future__ import annotations

from collections import defaultdict

from client.speech_api.errors import too_many_streams


class StreamLimiter:
    def __init__(self, max_per_pipeline: int = 0, retry_after_s: float = 1.0):
        self.max_per_pipeline = max_per_pipeline
        self.retry_after_s = retry_after_s
        self.active: dict[str, int] = defaultdict(int)

    def acquire(self, pipeline: str) -> None:
        if self.max_per_pipeline and self.active[pipeline] >= self.max_per_pipeline:
            raise too_many_streams(f"model '{pipeline}' is at its limit of {self.max_per_pipeline} "
                                   f"concurrent streams; retry shortly", self.retry_after_s)
        self.active[pipeline] += 1

    def release(self, pipeline: str) -> None:
        self.active[pipeline] = max(0, self.active[pipeline] - 1)
