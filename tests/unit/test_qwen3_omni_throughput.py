"""Qwen3-Omni's throughput mode (``batch_mode: throughput``): its distance from solo, measured.

Per checkpoint shape, every job runs alone in an exact engine (bit-exact with the reference, see
test_qwen3_omni_engine.py) and all together in one throughput engine, joining one per step (rows
at different positions and prompt lengths share each decode forward). The talker of both runs
reads the same thinker answer (the solo one), so its inputs are teacher-forced. Per decode step
the logits a row's token is chosen from are compared with solo's:

* before any token differs, every step's logits are within ``LOGITS_TOLERANCE`` of solo's
  (absolute, float32; the observed distance is printed);
* greedy tokens and codec frames equal solo's, or the first token that differs is a near tie:
  solo's margin between its choice and the batched choice is within twice the tolerance.
"""
from __future__ import annotations

import pytest
import torch

from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_omni import moe
from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint, load_thinker_embedding
from omni_backend.models.qwen3_omni.prompt import TalkerInput
from omni_backend.models.qwen3_omni.engines import create_talker_engine, create_thinker_engine
from omni_backend.models.qwen3_omni.talker_runner import ThinkerAnswer
from tests.oracle.qwen3_omni_reference import job_messages
from tests.qwen3_omni_fixtures import QWEN3_OMNI_JOBS, QWEN3_OMNI_SHAPES

# batched runs of every shape against solo ones: not the edit-test loop (tests/tiers.py)
pytestmark = pytest.mark.slow
SHAPES = tuple(QWEN3_OMNI_SHAPES)
LOGITS_TOLERANCE = 5e-4   # absolute, float32; observed at most 1.3e-4 (tiny3 thinker) on these prompts
JOBS = [job for job in QWEN3_OMNI_JOBS if job.get("return_audio", True)]


def _recording(engine, method: str, log: dict[str, list[torch.Tensor]]):
    """Record the logits each token of ``engine``'s runner is chosen from, per request."""
    runner = engine.runner
    choose = getattr(runner, method)

    def recorded(seq, logits):
        log.setdefault(seq.request_id, []).append(logits[:, -1].reshape(-1).to(torch.float32).clone())
        return choose(seq, logits)
    setattr(runner, method, recorded)
    return engine


def _thinker(checkpoint, jobs: list[dict], mode: str) -> tuple[dict, dict]:
    engine = create_thinker_engine(checkpoint, max_num_seqs=len(jobs), batch_mode=mode)
    logits: dict[str, list[torch.Tensor]] = {}
    _recording(engine, "_choose", logits)
    builder = checkpoint.prompt_builder()
    tokens: dict[str, list[int]] = {}
    for job in jobs:
        engine.add_request(job["id"], builder.build(messages=job_messages(job)), SamplingParams.greedy(
            max_new_tokens=int(job.get("thinker_max_new_tokens", 40)), repetition_penalty=1.0, min_new_tokens=0))
        tokens[job["id"]] = []
    while engine.has_unfinished():
        for event in engine.step():
            tokens[event.request_id] += list(event.codes or [])
            if event.finish_reason == "stop":
                tokens[event.request_id].append(checkpoint.config.im_end_token_id)
    return tokens, logits


def _talker(checkpoint, embedding, jobs: list[dict], answers: dict[str, list[int]], mode: str) -> tuple[dict, dict]:
    engine = create_talker_engine(checkpoint.talker, max_num_seqs=len(jobs), batch_mode=mode)
    logits: dict[str, list[torch.Tensor]] = {}
    _recording(engine, "_choose_first", logits)
    builder = checkpoint.prompt_builder()
    frames: dict[str, list[list[int]]] = {}
    for job in jobs:
        answer = ThinkerAnswer(TalkerInput(checkpoint.config, embedding, checkpoint.talker,
                                           builder.build(messages=job_messages(job)), job["speaker"]))
        answer.push(answers[job["id"]])
        answer.end()
        engine.add_request(job["id"], answer, SamplingParams.greedy(
            max_new_tokens=int(job.get("talker_max_new_tokens", 30)), repetition_penalty=1.05, min_new_tokens=0))
        frames[job["id"]] = []
    while engine.has_unfinished():
        for event in engine.step():
            if event.codes is not None:
                frames[event.request_id].append(list(event.codes))
    return frames, logits


@pytest.fixture(scope="module")
def runs(qwen3_omni_checkpoints, qwen3_omni_threads):
    """Per shape: the exact solo runs and the throughput run of all jobs together."""
    out = {}
    for shape in SHAPES:
        path = str(qwen3_omni_checkpoints[shape])
        checkpoint = load_checkpoint(path, parts=("thinker", "talker"))
        embedding = load_thinker_embedding(path)
        solo_tokens, solo_logits, solo_frames, solo_codec = {}, {}, {}, {}
        for job in JOBS:
            tokens, logits = _thinker(checkpoint, [job], "exact")
            solo_tokens.update(tokens)
            solo_logits.update(logits)
            frames, codec = _talker(checkpoint, embedding, [job], tokens, "exact")
            solo_frames.update(frames)
            solo_codec.update(codec)
        tokens, logits = _thinker(checkpoint, JOBS, "throughput")
        frames, codec = _talker(checkpoint, embedding, JOBS, solo_tokens, "throughput")
        out[shape] = {"solo": (solo_tokens, solo_logits, solo_frames, solo_codec),
                      "batched": (tokens, logits, frames, codec)}
    return out


def _compare(solo_ids: list[int], solo_logits: list[torch.Tensor], ids: list[int],
             logits: list[torch.Tensor]) -> tuple[float, int | None]:
    """The largest logits distance before the first differing choice, and that choice's index
    (None: all equal). Asserts the tolerance and, at a difference, the near tie."""
    distance = 0.0
    assert len(logits) >= 1 and len(solo_logits) >= 1
    for step, (a, b) in enumerate(zip(solo_logits, logits)):
        gap = float((a - b).abs().max())
        assert gap <= LOGITS_TOLERANCE, f"step {step}: logits {gap:.3g} from solo"
        distance = max(distance, gap)
        chosen_solo, chosen = int(a.argmax()), int(b.argmax())
        if chosen_solo != chosen:
            margin = float(a[chosen_solo] - a[chosen])
            assert margin <= 2 * LOGITS_TOLERANCE, f"step {step}: differs with solo's margin {margin:.3g}"
            return distance, step
    assert ids == solo_ids
    return distance, None


@pytest.mark.parametrize("shape", SHAPES)
def test_batched_thinker_rows_stay_within_tolerance_of_solo(runs, shape):
    solo_tokens, solo_logits, _, _ = runs[shape]["solo"]
    tokens, logits, _, _ = runs[shape]["batched"]
    steps = 0
    for job in JOBS:
        distance, diverged = _compare(solo_tokens[job["id"]], solo_logits[job["id"]], tokens[job["id"]],
                                      logits[job["id"]])
        print(f"{shape} thinker {job['id']}: {len(logits[job['id']])} steps, max |logits - solo| {distance:.3g}, "
              f"first difference {diverged}")
        steps += len(logits[job["id"]]) if diverged is None else diverged
    assert steps >= 10 * len(JOBS)


@pytest.mark.parametrize("shape", SHAPES)
def test_batched_talker_rows_stay_within_tolerance_of_solo(runs, shape):
    _, _, solo_frames, solo_codec = runs[shape]["solo"]
    _, _, frames, codec = runs[shape]["batched"]
    steps = 0
    for job in JOBS:
        rid = job["id"]
        codebook0 = [frame[0] for frame in frames[rid]]
        distance, diverged = _compare([frame[0] for frame in solo_frames[rid]], solo_codec[rid], codebook0,
                                      codec[rid])
        print(f"{shape} talker {rid}: {len(codec[rid])} steps, max |logits - solo| {distance:.3g}, "
              f"first difference {diverged}")
        # the code predictor's codebooks 1..15 equal solo's in every frame before a difference
        until = len(solo_frames[rid]) if diverged is None else diverged
        assert frames[rid][:until] == solo_frames[rid][:until]
        steps += until
    assert steps >= 10 * len(JOBS)


def test_throughput_rows_share_each_expert_pass(qwen3_omni_checkpoints, qwen3_omni_threads, monkeypatch):
    """In throughput mode one decode step routes every row's token through one experts pass per
    layer (the exact mode runs one pass per row)."""
    checkpoint = load_checkpoint(str(qwen3_omni_checkpoints["tiny"]), parts=("thinker",))
    passes: list[int] = []
    experts_forward = moe.SparseMoeBlock.experts_forward

    def counted(self, x, weights, experts):
        passes.append(x.shape[0])
        return experts_forward(self, x, weights, experts)
    monkeypatch.setattr(moe.SparseMoeBlock, "experts_forward", counted)
    for mode, expected in (("exact", 1), ("throughput", 3)):
        engine = create_thinker_engine(checkpoint, max_num_seqs=3, max_prefills_per_step=3, batch_mode=mode)
        builder = checkpoint.prompt_builder()
        for i, job in enumerate(JOBS[:3]):
            engine.add_request(str(i), builder.build(messages=job_messages(job)),
                               SamplingParams.greedy(max_new_tokens=4, repetition_penalty=1.0, min_new_tokens=0))
        engine.step()            # the three prefills
        passes.clear()
        engine.step()            # one decode step of three rows
        sparse = sum(isinstance(layer.mlp, moe.SparseMoeBlock) for layer in checkpoint.thinker.model.layers)
        assert passes == [expected] * (sparse * 3 // expected), mode
        engine.close() if hasattr(engine, "close") else None


def test_media_prompts_decode_at_their_rotary_positions(qwen3_omni_checkpoints, qwen3_omni_threads):
    """A prompt with an image decodes at cache length + its delta (3-D positions): in a throughput
    step beside a text prompt and a recording, its tokens equal its exact solo run."""
    from tests.qwen3_omni_fixtures import QWEN3_OMNI_AUDIO_JOBS, QWEN3_OMNI_IMAGE_JOBS, audio_job_messages

    checkpoint = load_checkpoint(str(qwen3_omni_checkpoints["tiny"]))
    jobs = {"image": QWEN3_OMNI_IMAGE_JOBS[1], "audio": QWEN3_OMNI_AUDIO_JOBS[0]}

    def prompt(name: str):
        builder = checkpoint.prompt_builder()
        if name == "text":
            return builder.build_prompt(prompt="Tell me about the sea.")
        return builder.build_prompt(messages=audio_job_messages(jobs[name], "openai"))

    def run(mode: str, names: list[str]) -> dict[str, list[int]]:
        engine = create_thinker_engine(checkpoint, max_num_seqs=len(names), batch_mode=mode)
        tokens = {name: [] for name in names}
        for name in names:
            engine.add_request(name, prompt(name), SamplingParams.greedy(max_new_tokens=20, repetition_penalty=1.0,
                                                                          min_new_tokens=0))
        while engine.has_unfinished():
            for event in engine.step():
                tokens[event.request_id] += list(event.codes or [])
        return tokens

    assert prompt("image").images and checkpoint.visual is not None
    solo = {name: run("exact", [name])[name] for name in ("image", "text", "audio")}
    assert run("throughput", ["image", "text", "audio"]) == solo
