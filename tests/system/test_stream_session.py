"""A client that keeps its connection (client.triton_stream.StreamSession, what perf/bench.py's
clients use): requests one after another on one gRPC stream give what a connection per request
gives, a failed or abandoned request does not spoil the next one; and perf's Triton floor model
(perf/benchkit/triton_floor.py) answers as the timing tables assume."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from client.triton_stream import StreamSession, TritonStreamError, synthesize

pytestmark = pytest.mark.system

QWEN3 = "qwen3_tts_tiny_random"
GREEDY = {"do_sample": False, "subtalker_do_sample": False, "max_new_tokens": 8}
TEXTS = ["Hello there.", "A second sentence, a little longer than the first.", "Third."]


@pytest.fixture(scope="module")
def alone(triton) -> dict[str, np.ndarray]:
    """Each text's audio, each on a connection of its own."""
    return {text: synthesize(triton.grpc_url, QWEN3, text, GREEDY).audio for text in TEXTS}


def test_requests_in_turn_on_one_connection_equal_requests_alone(triton, alone) -> None:
    with StreamSession(triton.grpc_url) as session:
        results = [session.synthesize(QWEN3, text, GREEDY) for text in TEXTS]
        client = session._client
        again = session.synthesize(QWEN3, TEXTS[0], GREEDY)
        assert session._client is client, "the session opened a second connection"
    for text, result in zip(TEXTS, results):
        assert result.audio.size and np.array_equal(result.audio, alone[text]), text
        assert 0 < result.ttfa_s <= result.total_s
    assert np.array_equal(again.audio, alone[TEXTS[0]])


def test_a_failed_request_names_its_field_and_the_next_one_is_served(triton, alone) -> None:
    with StreamSession(triton.grpc_url) as session:
        with pytest.raises(TritonStreamError) as failed:
            session.synthesize(QWEN3, "Hello.", {"no_such_field": 1})
        assert failed.value.code == "invalid_request" and "no_such_field" in str(failed.value)
        assert np.array_equal(session.synthesize(QWEN3, TEXTS[1], GREEDY).audio, alone[TEXTS[1]])


def test_a_request_left_after_its_first_chunk_does_not_reach_the_next(triton, alone) -> None:
    with StreamSession(triton.grpc_url) as session:
        parts = session.parts(QWEN3, TEXTS[1], GREEDY)
        assert next(parts).audio.size
        parts.close()   # the caller stops reading: the stream is closed, its responses go with it
        for text in TEXTS:
            assert np.array_equal(session.synthesize(QWEN3, text, GREEDY).audio, alone[text]), text


def test_the_triton_floor_model_answers_at_once_with_the_first_chunk(tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "perf"))
    from benchkit.triton_floor import MODEL, floor_server

    with floor_server(tmp_path, samples=3840, sample_rate=24000) as server, StreamSession(server.grpc_url) as session:
        for _ in range(3):
            result = session.synthesize(MODEL, "Hello.", GREEDY)
            assert len(result.chunks) == 1 and result.chunks[0].size == 3840 and result.sample_rate == 24000
            assert not result.audio.any()
