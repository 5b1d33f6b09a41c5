"""The shim's settings (the command line fills them)."""
from __future__ import annotations

from dataclasses import dataclass, field

from client.speech_api.media_fetch import FetchPolicy


@dataclass
class StreamLimits:
    """Limits of a `WS /v1/audio/speech/stream` session (client/speech_api/speech_stream.py)."""
    config_timeout_s: float = 10.0      # the first message (session.config) must come within this
    idle_timeout_s: float = 30.0        # no client message while nothing is being spoken: closed
    max_session_s: float = 600.0        # a connection's whole life
    max_text_chars: int = 65536         # text of one utterance (all its input.text together)
    max_message_bytes: int = 16 * 1024 * 1024   # session.config may carry ref_audio
    max_text_message_bytes: int = 128 * 1024
    send_timeout_s: float = 10.0        # a client that reads no audio this long is cut off


@dataclass
class ShimConfig:
    tritons: list[str] = field(default_factory=lambda: ["localhost:8001"])
    triton_services: list[str] = field(default_factory=list)   # NAME:PORT, one Triton per address
    resolve_interval_s: float = 5.0         # how often those names are resolved again
    api_keys: tuple[str, ...] = ()
    max_streams_per_pipeline: int = 0       # 0: no limit in the shim (Triton still has its own)
    default_pipeline: str | None = None     # what tts-1, tts-1-hd and gpt-4o-mini-tts mean (None: the declared one)
    model_names: dict[str, str] = field(default_factory=dict)   # --served-model-name: name -> pipeline
    probe_interval_s: float = 1.0
    retry_after_s: float = 1.0
    stream_limits: StreamLimits = field(default_factory=StreamLimits)
    fetch: FetchPolicy = field(default_factory=FetchPolicy)   # image URLs in chats: off unless hosts are allowed
    voices_dir: str | None = None           # uploaded voices; None: $OMNI_VOICES_DIR or $OMNI_CACHE_DIR/voices, ~/.cache/omni-triton/voices
