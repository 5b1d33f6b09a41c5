"""The custom metric families the server exports on Triton's /metrics: name -> (help, kind).

Families are process-wide and shared by every model that names them, so the descriptions must be
identical everywhere: they live here only. Readers of the names (the supervisor's drain, the
cluster autoscaler's rule in deploy/k8s) take them from here too."""
from __future__ import annotations

ACTIVE_STREAMS = "omni_active_streams"   # per entry model: the load the autoscaler scales on

FAMILIES = {
    "omni_ttfa_ms": ("Time from request arrival to the first audio chunk (ms)", "HISTOGRAM"),
    "omni_audio_seconds_total": ("Seconds of audio streamed to clients", "COUNTER"),
    "omni_audio_underrun_seconds_total": ("Seconds a player starting at a stream's first audio waited for "
                                          "the next chunk", "COUNTER"),
    "omni_streams_with_gap_total": ("Streams in which a player waited 100 ms or more for a chunk", "COUNTER"),
    ACTIVE_STREAMS: ("Streams in flight in the entry model", "GAUGE"),
    "omni_requests_total": ("Requests finished, by outcome", "COUNTER"),
    "omni_errors_total": ("Requests that ended in an error, by error code", "COUNTER"),
    "omni_stage_active_requests": ("Requests in flight inside a stage model", "GAUGE"),
    "omni_stage_batched_requests_total": ("Requests a batched stage computed (liveness pings not counted)", "COUNTER"),
    "omni_voice_encodings_total": ("Reference recordings encoded for voice cloning (cache misses)", "COUNTER"),
    "omni_vllm_running_requests": ("Requests vLLM's scheduler is running (the engine's own count)", "GAUGE"),
    "omni_vllm_waiting_requests": ("Requests waiting in vLLM's scheduler (the engine's own count)", "GAUGE"),
}
