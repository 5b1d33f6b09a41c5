"""Live Prometheus metrics of what a listener hears, per pipeline (omni_backend/playback.py):
`omni_audio_underrun_seconds_total` and `omni_streams_with_gap_total`, scraped from a real
tritonserver's /metrics while the tiny random Qwen3-TTS serves with fixed chunks (its deploy with
`continuity_rtf: 0`), so that one request's schedule starves its player and another's does not."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from client.triton_stream import synthesize
from tests.metrics_scrape import metric
from tests.served_pipeline import served

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "qwen3_tts_tiny_random"
GREEDY = {"do_sample": False, "subtalker_do_sample": False}


@pytest.fixture(scope="module")
def fixed_chunks_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("listener")
    deploy = yaml.safe_load((ROOT / "deploy" / f"{PIPELINE}.yaml").read_text())
    deploy["async_chunk"]["continuity_rtf"] = 0
    # eos held back: every request makes exactly max_new_tokens - 1 frames
    deploy["stages"][0].setdefault("default_sampling_params", {})["min_new_tokens"] = 4096
    path = work / "fixed_chunks.yaml"
    path.write_text(yaml.safe_dump(deploy))
    with served({PIPELINE: path}, work) as server:
        yield server


def listened(server) -> tuple[float, float]:
    return (metric(server.metrics_url, "omni_audio_underrun_seconds_total", pipeline=PIPELINE),
            metric(server.metrics_url, "omni_streams_with_gap_total", pipeline=PIPELINE))


def test_a_starved_player_is_counted_and_a_fed_one_is_not(fixed_chunks_server):
    url = fixed_chunks_server.grpc_url
    synthesize(url, PIPELINE, "Warm up.", {**GREEDY, "max_new_tokens": 4})
    underrun0, gaps0 = listened(fixed_chunks_server)
    # one frame (80 ms of audio), then 100 frames in one chunk: the player waits for all 100
    starved = synthesize(url, PIPELINE, "Hello there, a long wait.", {
        **GREEDY, "max_new_tokens": 102, "initial_chunk_frames": 1, "chunk_frames": 100})
    assert [len(c) // 1920 for c in starved.chunks] == [1, 100]
    heard = starved.playback
    assert heard.worst_gap_s >= 0.1 and not heard.continuous
    underrun1, gaps1 = listened(fixed_chunks_server)
    assert gaps1 == gaps0 + 1
    # the server's player starts when the first chunk leaves it, the client's when it arrives:
    # the same waits, give or take the transport's jitter (up to a tenth of a second when two
    # test workers share two cores; the wait itself is ~0.9 s)
    assert underrun1 - underrun0 == pytest.approx(heard.underrun_s, abs=0.15)
    # chunks of 20 frames (1.6 s) made far faster than they play: no gap
    fed = synthesize(url, PIPELINE, "Hello there, no wait.", {
        **GREEDY, "max_new_tokens": 41, "initial_chunk_frames": 20, "chunk_frames": 20})
    assert fed.playback.continuous
    underrun2, gaps2 = listened(fixed_chunks_server)
    assert gaps2 == gaps1 and underrun2 - underrun1 < 0.1
