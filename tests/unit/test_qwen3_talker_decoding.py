"""code2wav in the talker's process (talker_decoding.WindowCutter): fed engine events one frame at
a time, it cuts and decodes the windows the code2wav stage would, so its audio equals the
in-process decoder's stream of the same schedule, sample for sample, also with a voice prompt's
context frames and per-request chunk sizes; an ended request that was cancelled decodes no more."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_backend.deploy import load_deploy
from omni_backend.engine.sequence import FrameEvent
from omni_backend.families import get_pipeline
from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
from omni_backend.models.qwen3_tts.talker_decoding import TalkerWindows

PIPELINE = "qwen3_tts_tiny_random"


@pytest.fixture(scope="module")
def windows():
    torch.set_num_threads(1)
    deploy = load_deploy(f"deploy/{PIPELINE}.in_talker.yaml")
    return TalkerWindows(get_pipeline(PIPELINE), deploy, resolve_checkpoint(f"builtin:{PIPELINE}"))


def _feed(cutter, codes: np.ndarray, finish_reason: str = "length") -> list[np.ndarray]:
    out = []
    for i, frame in enumerate(codes):
        last = i == len(codes) - 1
        cutter(FrameEvent("r", frame.tolist(), finished=last, finish_reason=finish_reason if last else None, index=i))
        out.append([audio for _first, _end, audio in cutter.take()])
    return out


@pytest.mark.parametrize("request_params", [{}, {"initial_chunk_frames": 3, "chunk_frames": 5,
                                                 "left_context_frames": 10}])
def test_cut_windows_equal_the_in_process_stream(windows, request_params):
    codes = np.random.default_rng(0).integers(0, 2048, (41, 16))
    chunks = [c for step in _feed(windows.cutter(request_params, None), codes) for c in step]
    schedule = windows.schedule(request_params)
    want = list(windows.decoder.decode_stream(torch.from_numpy(codes.T[None].copy()), schedule))
    assert [c.size // 1920 for c in chunks] == [w.new_frames for w in schedule.plan(41)]
    np.testing.assert_array_equal(np.concatenate(chunks), torch.cat(want, dim=-1)[0].numpy())


def test_a_window_is_decoded_by_the_event_that_completes_it(windows):
    codes = np.random.default_rng(1).integers(0, 2048, (6, 16))
    per_event = [[c.size // 1920 for c in step] for step in _feed(windows.cutter({}, None), codes)]
    assert per_event == [[], [2], [], [2], [], [2]]   # the deploy's 2, 2, 3, ... cut at 2 and 4; the end flushes


def test_context_frames_are_context_only(windows):
    rng = np.random.default_rng(2)
    context, codes = rng.integers(0, 2048, (7, 16)), rng.integers(0, 2048, (9, 16))
    chunks = [c for step in _feed(windows.cutter({}, context), codes) for c in step]
    assert sum(c.size for c in chunks) == 9 * 1920
    # each window decoded with the context frames before it, as code2wav gets it from CodecWindows
    whole = windows.decode(list(np.concatenate([context, codes])), 7)
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=1e-5)


def test_a_cancelled_request_decodes_no_more(windows):
    codes = np.random.default_rng(3).integers(0, 2048, (3, 16))
    steps = _feed(windows.cutter({}, None), codes, finish_reason="cancelled")
    assert [[c.size // 1920 for c in s] for s in steps] == [[], [2], []]


def test_a_cutter_that_decides_decodes_only_the_windows_it_says_yes_to(windows):
    """`code2wav: adaptive`: every window is cut as before; those `decide` refuses are left to
    code2wav (their frames still count), the others carry the span of frames they are the audio of."""
    codes = np.random.default_rng(4).integers(0, 2048, (30, 16))
    schedule = windows.schedule({})
    plan = schedule.plan(30)
    refused = {1, 3, 4}   # windows in cut order
    seen: list[int] = []

    def decide(event, first: int) -> bool:
        seen.append(first)
        return len(seen) - 1 not in refused

    cutter = windows.cutter({}, None, decide)
    spans = []
    for i, frame in enumerate(codes):
        last = i == len(codes) - 1
        assert cutter(FrameEvent("r", frame.tolist(), finished=last, finish_reason="length" if last else None,
                                 index=i)) is True   # every frame goes out
        spans += cutter.take()
    assert seen == [w.end_frame - w.new_frames for w in plan]   # asked once per window, with its first frame
    kept = [w for k, w in enumerate(plan) if k not in refused]
    assert [(first, end) for first, end, _ in spans] == [(w.end_frame - w.new_frames, w.end_frame) for w in kept]
    whole = list(windows.decoder.decode_stream(torch.from_numpy(codes.T[None].copy()), schedule))
    for (_first, _end, audio), k in zip(spans, [k for k in range(len(plan)) if k not in refused]):
        np.testing.assert_array_equal(audio, whole[k][0].numpy())
