"""The shim's settings (the command line fills them)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ShimConfig:
    tritons: list[str] = field(default_factory=lambda: ["localhost:8001"])
    api_keys: tuple[str, ...] = ()
    max_streams_per_pipeline: int = 0       # 0: no limit in the shim (Triton still has its own)
    default_pipeline: str = "hibari"        # what tts-1, tts-1-hd and gpt-4o-mini-tts mean
    probe_interval_s: float = 1.0
    retry_after_s: float = 1.0
    voices_dir: str | None = None           # uploaded voices; None: $OMNI_VOICES_DIR or $OMNI_CACHE_DIR/voices, ~/.cache/omni-triton/voices
