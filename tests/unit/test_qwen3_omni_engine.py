"""Qwen3-Omni on the AR engine, as the served stages run it, against the reference (greedy).

Per checkpoint shape, every parity job runs at once in one thinker engine and one talker engine
(continuous batching, requests joining and leaving), the talker fed the thinker's tokens in chunks
while the thinker writes (the stages' hand-off, :class:`ThinkerAnswer`). The thinker's tokens and
text, and the talker's codes, equal the reference's bit for bit; the streamed code2wav windows
(``codec_windows.plan_windows`` + ``Code2Wav.decode_lookahead_window``) join to the reference's
waveform within 1e-4.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint, load_thinker_embedding
from omni_backend.models.qwen3_omni.window_plan import plan_window, plan_windows
from omni_backend.models.qwen3_omni.prompt import TalkerInput
from omni_backend.models.qwen3_omni.engines import create_talker_engine, create_thinker_engine
from omni_backend.models.qwen3_omni.talker_runner import ThinkerAnswer
from omni_backend.models.qwen3_omni.text_deltas import TextDeltas
from tests.oracle.qwen3_omni_reference import job_messages
from tests.qwen3_omni_fixtures import QWEN3_OMNI_JOBS, QWEN3_OMNI_SHAPES

SHAPES = tuple(QWEN3_OMNI_SHAPES)
JOB_IDS = tuple(job["id"] for job in QWEN3_OMNI_JOBS)
WAVEFORM_TOLERANCE = 1e-4
CHUNK_TOKENS = 3   # thinker tokens per hand-off (an odd size: chunks straddle the prefill's 12 rows)


def _serve_all(path: str, jobs: list[dict]) -> dict[str, dict]:
    """Every job in one thinker and one talker engine, stepped in turn, the talker fed chunks."""
    checkpoint = load_checkpoint(path, parts=("thinker", "talker"))
    embedding = load_thinker_embedding(path)
    config = checkpoint.config
    builder = checkpoint.prompt_builder()
    thinker = create_thinker_engine(checkpoint, max_num_seqs=len(jobs))
    talker = create_talker_engine(checkpoint.talker, max_num_seqs=len(jobs))
    state: dict[str, dict] = {}
    for job in jobs:
        prompt = builder.build(messages=job_messages(job))
        thinker.add_request(job["id"], prompt, SamplingParams.greedy(
            max_new_tokens=int(job["thinker_max_new_tokens"]), repetition_penalty=1.0, min_new_tokens=0))
        answer = None
        if job["return_audio"]:
            answer = ThinkerAnswer(TalkerInput(config, embedding, checkpoint.talker, prompt, job["speaker"]))
        state[job["id"]] = {"job": job, "answer": answer, "tokens": [], "pending": [], "text": TextDeltas(
            checkpoint.tokenizer), "deltas": [], "frames": [], "in_talker": False, "finish": None}
    while thinker.has_unfinished() or talker.has_unfinished():
        for event in thinker.step():
            s = state[event.request_id]
            ids = list(event.codes or [])
            if event.finish_reason == "stop":
                ids.append(config.im_end_token_id)
            s["tokens"] += ids
            s["deltas"].append(s["text"].add(ids, last=event.finished))
            if event.finished:
                s["finish"] = event.finish_reason
            if s["answer"] is None:
                continue
            s["pending"] += ids
            if len(s["pending"]) < CHUNK_TOKENS and not event.finished:
                continue
            chunk, s["pending"] = s["pending"], []
            if s["in_talker"]:
                talker.append_input(event.request_id, chunk, end=event.finished)
                continue
            s["answer"].push(chunk)
            if event.finished:
                s["answer"].end()
            if s["answer"].ready:
                params = SamplingParams.greedy(max_new_tokens=int(s["job"]["talker_max_new_tokens"]),
                                               repetition_penalty=float(s["job"]["talker_repetition_penalty"]),
                                               min_new_tokens=0)
                talker.add_request(event.request_id, s["answer"], params, input_open=not event.finished)
                s["in_talker"] = True
        for event in talker.step():
            if event.codes is not None:
                state[event.request_id]["frames"].append(event.codes)
    return state


@pytest.fixture(scope="module")
def served(qwen3_omni_reference, qwen3_omni_threads):
    results = {}
    for shape, dump in qwen3_omni_reference.items():
        jobs = [ref["job"] for ref in dump["jobs"].values()]
        results[shape] = _serve_all(str(dump["checkpoint"]), jobs)
    return results


@pytest.mark.parametrize("job_id", JOB_IDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_batched_thinker_and_talker_equal_reference(served, qwen3_omni_reference, shape, job_id):
    ref = qwen3_omni_reference[shape]["jobs"][job_id]
    ours = served[shape][job_id]
    generated = ref["sequences"].tolist()[len(ref["input_ids"]):]
    assert ours["tokens"] == generated
    assert ours["finish"] == ("stop" if ref["ended_with_im_end"] else "length")
    tokenizer = ours["text"].tokenizer
    assert "".join(ours["deltas"]) == tokenizer.decode(generated)
    if not ref["job"]["return_audio"]:
        assert not ours["frames"]
        return
    codes = np.asarray(ours["frames"], dtype=np.int64).T
    np.testing.assert_array_equal(codes, ref["codes"])


def _streamed_audio(code2wav, codes: torch.Tensor, first_chunk: int, chunk: int, max_context: int) -> np.ndarray:
    """The audio the code2wav stage returns for a finished answer's windows, joined."""
    pieces, emitted = [], 0
    with torch.inference_mode():
        for start, end, lookahead in plan_windows(codes.shape[-1], first_chunk, chunk, max_context):
            pieces.append(code2wav.decode_lookahead_window(codes[..., start:end + lookahead], emitted - start,
                                                           lookahead)[0])
            emitted = end
    return torch.cat(pieces).numpy()


@pytest.mark.parametrize("shape", SHAPES)
def test_streamed_windows_join_to_the_reference_waveform(qwen3_omni_reference, qwen3_omni_threads, shape):
    dump = qwen3_omni_reference[shape]
    code2wav = load_checkpoint(str(dump["checkpoint"]), parts=("code2wav",)).code2wav
    checked = 0
    for ref in dump["jobs"].values():
        if not ref["job"]["return_audio"]:
            continue
        codes = torch.from_numpy(ref["codes"]).unsqueeze(0)
        for first_chunk, chunk in ((2, 5), (1, 25), (300, 300)):
            audio = _streamed_audio(code2wav, codes, first_chunk, chunk, max_context=325)
            assert audio.shape == ref["waveform"].shape
            assert float(np.abs(audio - ref["waveform"]).max()) <= WAVEFORM_TOLERANCE, (first_chunk, chunk)
        checked += 1
    assert checked >= 6


def test_long_answers_keep_the_reference_segments():
    """Past 300 frames the reference decodes a new segment with 25 frames of context and loses the
    decoder's trim at each segment's end: the windows never cross a segment and close it the same way."""
    windows = plan_windows(700, 2, 25, 325)
    ends = [end for _, end, _ in windows]
    assert 300 in ends and 600 in ends and ends[-1] == 700
    assert all(lookahead == (0 if end in (300, 600, 700) else 1) for _, end, lookahead in windows)
    after = [start for start, end, _ in windows if end > 300 and start >= 275]
    assert min(start for start, end, _ in windows if end > 300) == 275   # 25 frames of context back
    assert after and all(start >= 275 for start in after)
    for start, end, _ in windows:   # a window's context never reaches back past max_context
        assert start >= 0
    assert plan_window(0, 2, False, 2, 25, 325) is None      # the lookahead frame is not there yet
    assert plan_window(0, 3, False, 2, 25, 325) == (0, 2, 1)
    assert plan_window(0, 2, True, 2, 25, 325) == (0, 2, 0)  # the answer ended: no lookahead
    assert plan_window(2, 2, True, 2, 25, 325) is None
