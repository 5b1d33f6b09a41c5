"""The throughput mode's CUDA-graph steps (:mod:`omni_backend.models.qwen3_omni.graph_step`) without a GPU.

* On the **meta** device, at the released 30B-A3B shape in bf16, the thinker's decode step and the
  talker's frame step (code predictor + talker, with the MoE blocks) run through: a host read of a
  device value, a data-dependent shape or a stray CPU tensor raises there (see
  test_graph_capture_safety.py), which is what would break a capture.
* On CPU, the runners' static-buffer path (what a graph replays, run eagerly) gives the same greedy
  tokens and frames as the eager throughput path, its logits within float rounding of it, with
  requests joining one per step and leaving at different lengths (padding rows at free slots).
"""
from __future__ import annotations

import pytest
import torch

from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_omni.batched_decode import slot_cache_for
from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint, load_thinker_embedding
from omni_backend.models.qwen3_omni.config import Qwen3OmniConfig
from omni_backend.models.qwen3_omni.graph_step import TalkerFrameStep, ThinkerDecodeStep, attention_length
from omni_backend.models.qwen3_omni.prompt import TalkerInput
from omni_backend.models.qwen3_omni.talker import Talker
from omni_backend.models.qwen3_omni.engines import create_talker_engine, create_thinker_engine
from omni_backend.models.qwen3_omni.talker_runner import ThinkerAnswer
from omni_backend.models.qwen3_omni.thinker import Thinker
from omni_backend.models.qwen3_omni.engines import create_thinker_engine
from omni_backend.models.qwen3_omni.random_checkpoint import checkpoint_config
from tests.oracle.qwen3_omni_reference import job_messages
from tests.qwen3_omni_fixtures import QWEN3_OMNI_JOBS

META = torch.device("meta")
JOBS = [job for job in QWEN3_OMNI_JOBS if job.get("return_audio", True)]
EAGER_TOLERANCE = 1e-4   # the same arithmetic in other batch shapes (padding rows): observed <= 1.6e-5


@pytest.fixture(scope="module")
def released():
    return Qwen3OmniConfig.from_dict(checkpoint_config("30b-a3b"))


def test_thinker_decode_step_has_no_host_reads(released):
    with META:
        thinker = Thinker(released.thinker).to(torch.bfloat16)
    step = ThinkerDecodeStep(thinker, slot_cache_for(thinker.model.layers, 4, 4096), rows=4)
    for batch, length in ((3, 256), (4, 4096)):   # a padded bucket over a short length, a full one over all
        step.run(batch, length)
    assert step.logits.device == META and step.logits.shape == (4, released.thinker.vocab_size)


def test_talker_frame_step_has_no_host_reads(released):
    with META:
        talker = Talker(released.talker).to(torch.bfloat16)
    step = TalkerFrameStep(talker, slot_cache_for(talker.model.layers, 4, 4096), rows=4)
    for batch, length, sample in ((1, 256, False), (4, 2048, True), (3, 256, True)):
        step.run(batch, length, sample)
    assert step.codes.device == META and step.codes.shape == (4, 16)
    assert step.next_hidden.shape == (4, 1, released.talker.text.hidden_size)


def test_attention_length_picks_the_bucket_that_holds_the_position():
    buckets = [256, 512, 4096]
    assert [attention_length(buckets, p) for p in (0, 255, 256, 4095)] == [256, 256, 512, 4096]
    with pytest.raises(ValueError, match="4096"):
        attention_length(buckets, 4096)


def _recorded(engine, method: str, log: dict):
    runner = engine.runner
    choose = getattr(runner, method)

    def recorded(seq, logits):
        log.setdefault(seq.request_id, []).append(logits[:, -1].reshape(-1).float().clone())
        return choose(seq, logits)
    setattr(runner, method, recorded)


def _serve(checkpoint, embedding, static: bool) -> tuple[dict, dict, dict, dict]:
    thinker = create_thinker_engine(checkpoint, max_num_seqs=len(JOBS), batch_mode="throughput", static_step=static)
    talker = create_talker_engine(checkpoint.talker, max_num_seqs=len(JOBS), batch_mode="throughput",
                                  static_step=static)
    assert (thinker.runner.step is not None) == static and (talker.runner.step is not None) == static
    thinker_logits, talker_logits = {}, {}
    _recorded(thinker, "_choose", thinker_logits)
    _recorded(talker, "_choose_first", talker_logits)
    builder = checkpoint.prompt_builder()
    tokens = {job["id"]: [] for job in JOBS}
    for job in JOBS:
        thinker.add_request(job["id"], builder.build(messages=job_messages(job)), SamplingParams.greedy(
            max_new_tokens=int(job.get("thinker_max_new_tokens", 30)), repetition_penalty=1.0, min_new_tokens=0))
    while thinker.has_unfinished():
        for event in thinker.step():
            tokens[event.request_id] += list(event.codes or [])
    frames = {job["id"]: [] for job in JOBS}
    for job in JOBS:
        answer = ThinkerAnswer(TalkerInput(checkpoint.config, embedding, checkpoint.talker,
                                           builder.build(messages=job_messages(job)), job["speaker"]))
        answer.push(tokens[job["id"]] + [checkpoint.config.im_end_token_id])
        answer.end()
        talker.add_request(job["id"], answer, SamplingParams.greedy(
            max_new_tokens=int(job.get("talker_max_new_tokens", 25)), repetition_penalty=1.05, min_new_tokens=0))
    while talker.has_unfinished():
        for event in talker.step():
            if event.codes is not None:
                frames[event.request_id].append(list(event.codes))
    return tokens, frames, thinker_logits, talker_logits


@pytest.mark.parametrize("shape", ["tiny", "tiny3"])
def test_static_steps_equal_the_eager_throughput_path(qwen3_omni_checkpoints, qwen3_omni_threads, shape):
    path = str(qwen3_omni_checkpoints[shape])
    checkpoint = load_checkpoint(path, parts=("thinker", "talker"))
    embedding = load_thinker_embedding(path)
    eager = _serve(checkpoint, embedding, static=False)
    static = _serve(checkpoint, embedding, static=True)
    assert static[0] == eager[0]          # thinker tokens
    assert static[1] == eager[1]          # talker frames (all 16 codebooks)
    assert sum(len(f) for f in eager[1].values()) >= 10 * len(JOBS)
    for logs_eager, logs_static in ((eager[2], static[2]), (eager[3], static[3])):
        for rid, steps in logs_eager.items():
            assert len(logs_static[rid]) == len(steps)
            gap = max(float((a - b).abs().max()) for a, b in zip(steps, logs_static[rid]))
            assert gap <= EAGER_TOLERANCE, (rid, gap)


def _talker_frames(checkpoint, embedding, jobs: list[dict], answers: dict, sample: bool = True) -> dict:
    """Each job's frames through the static frame step; sampled (seeded: job ``i`` seed 1000 + i;
    the code predictor's top-k 50 / top-p 0.8) or greedy."""
    talker = create_talker_engine(checkpoint.talker, max_num_seqs=len(jobs), batch_mode="throughput",
                                  static_step=True)
    builder = checkpoint.prompt_builder()
    frames = {job["id"]: [] for job in jobs}
    for i, job in enumerate(jobs):
        answer = ThinkerAnswer(TalkerInput(checkpoint.config, embedding, checkpoint.talker,
                                           builder.build(messages=job_messages(job)), job["speaker"]))
        answer.push(answers[job["id"]])
        answer.end()
        talker.add_request(job["id"], answer, SamplingParams(
            do_sample=sample, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05, max_new_tokens=16,
            min_new_tokens=0, seed=1000 + i))
    while talker.has_unfinished():
        for event in talker.step():
            if event.codes is not None:
                frames[event.request_id].append(list(event.codes))
    return frames


def test_sampled_static_frame_steps_are_reproducible_per_request(qwen3_omni_checkpoints, qwen3_omni_threads):
    """The static step draws the code predictor's codes inside the step from the request's seed and
    frame counter: a seeded request's frames are the same alone and in a batch, run after run, and
    they are not the greedy ones."""
    path = str(qwen3_omni_checkpoints["tiny"])
    checkpoint = load_checkpoint(path, parts=("thinker", "talker"))
    embedding = load_thinker_embedding(path)
    answers = {job["id"]: list(range(1000, 1020)) + [checkpoint.config.im_end_token_id] for job in JOBS}
    together = _talker_frames(checkpoint, embedding, JOBS, answers)
    assert together == _talker_frames(checkpoint, embedding, JOBS, answers)
    first = JOBS[0]["id"]   # seed 1000 alone and in the batch
    assert _talker_frames(checkpoint, embedding, JOBS[:1], answers)[first] == together[first]
    assert len(together[first]) >= 10
    greedy = _talker_frames(checkpoint, embedding, JOBS[:1], answers, sample=False)[first]
    residual = lambda frames: [frame[1:] for frame in frames]  # noqa: E731 - the code predictor's codes
    assert residual(greedy) != residual(together[first])
