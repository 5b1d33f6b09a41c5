"""Greedy codes of our engine equal the reference ``generate()`` codes bit for bit.

The reference runs once per session in .venv-oracle (fixture ``qwen3_reference``), through the
public wrappers (``generate_custom_voice`` / ``generate_voice_design``) with their default text
modes unless a case sets ``non_streaming_mode``. Cases cover preset speakers (case-insensitive),
auto / explicit languages, the dialect rule (eric, dylan), instructions (voice design, and a
1.7B-style custom voice; the 0.6B-style one ignores them), both text modes, repetition penalties,
a stop by ``max_new_tokens`` (the reference yields max_new_tokens - 1 frames) and a stop by eos.
All cases of a checkpoint run together in one engine, admitted at different steps.
"""
from __future__ import annotations

import numpy as np
import pytest

from omni_backend.models.qwen3_tts.runner import create_engine
from tests.qwen3_fixtures import (QWEN3_EOS_AFTER, QWEN3_THREADS, qwen3_params_from_case, qwen3_parity_prompts,
                                  qwen3_prompt_from_case)

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("qwen3_threads")]

CHECKPOINTS = list(qwen3_parity_prompts())




def _engine_codes(checkpoint, cases) -> dict[str, np.ndarray]:
    engine = create_engine(checkpoint, max_num_seqs=4, max_model_len=256, num_threads=QWEN3_THREADS)
    builder = checkpoint.prompt_builder()
    pending = [(case["id"], qwen3_prompt_from_case(builder, case), qwen3_params_from_case(case)) for case in cases]
    frames: dict[str, list] = {case["id"]: [] for case in cases}
    step = 0
    while pending or engine.has_unfinished():
        if pending and step % 3 == 0:  # staggered admission; the 4th case waits for a free slot
            engine.add_request(*pending.pop(0))
        for event in engine.step():
            if event.codes is not None:
                frames[event.request_id].append(event.codes)
        step += 1
    return {rid: np.asarray(codes, dtype=np.int64).reshape(-1, 16) for rid, codes in frames.items()}


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_greedy_codes_equal_reference(name, qwen3_reference, qwen3_loaded, request):
    checkpoint = qwen3_loaded(request.getfixturevalue(name))
    cases = qwen3_parity_prompts()[name]
    ours = _engine_codes(checkpoint, cases)
    for case in cases:
        ref = qwen3_reference[f"codes/{case['id']}"]
        assert ref.shape[0] > 0, case["id"]
        assert ours[case["id"]].shape == ref.shape, (case["id"], ours[case["id"]].shape, ref.shape)
        assert np.array_equal(ours[case["id"]], ref), case["id"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_prompt_token_ids_equal_reference(name, qwen3_reference, qwen3_loaded, request):
    builder = qwen3_loaded(request.getfixturevalue(name)).prompt_builder()
    for case in qwen3_parity_prompts()[name]:
        prompt = qwen3_prompt_from_case(builder, case)
        assert list(prompt.input_ids) == qwen3_reference[f"input_ids/{case['id']}"].tolist()
        key = f"instruct_ids/{case['id']}"
        if key in qwen3_reference:
            assert list(prompt.instruct_ids) == qwen3_reference[key].tolist()
        else:
            assert prompt.instruct_ids is None


def test_stop_lengths(qwen3_reference):
    """max_new_tokens N gives N-1 frames without eos; the rigged checkpoint stops after K frames."""
    for case in qwen3_parity_prompts()["qwen3_tiny_cv"]:
        assert qwen3_reference[f"codes/{case['id']}"].shape[0] == case["max_new_tokens"] - 1
    for case in qwen3_parity_prompts()["qwen3_tiny_eos"]:
        assert qwen3_reference[f"codes/{case['id']}"].shape[0] == QWEN3_EOS_AFTER


def test_reference_loads_every_tiny_checkpoint_without_missing_weights(qwen3_reference):
    meta = qwen3_reference["meta"]
    for index, job in enumerate(qwen3_reference["jobs"]):
        assert meta[f"missing_keys/{index}"] == [], job["name"]
        assert meta[f"unexpected_keys/{index}"] == [], job["name"]
