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


@pytest.mark.parametrize("alone", [True, False])
def test_a_first_window_cutter_decodes_at_most_the_first_window(windows, alone):
    """`code2wav: adaptive`: the first window is decoded here if `first_window_if` says yes when
    it is cut (asked once), with the span of frames it is the audio of; every later window is
    code2wav's, and past the first window the cutter holds no frame. Every frame is streamed, in
    order, those before the first window with the event that completes it."""
    codes = np.random.default_rng(4).integers(0, 2048, (30, 16))
    schedule = windows.schedule({})
    first = schedule.plan(30)[0]
    asked: list[int] = []

    def first_window_if(event) -> bool:
        asked.append(event.index)
        return alone

    cutter = windows.cutter({}, None, first_window_if)
    spans, streamed, delivered = [], [], []
    for i, frame in enumerate(codes):
        last = i == len(codes) - 1
        event = FrameEvent("r", frame.tolist(), finished=last, finish_reason="length" if last else None, index=i)
        delivered.append(cutter(event))
        if delivered[-1]:   # what the talker streams for a delivered event: the frames withheld, then its own
            streamed += [*cutter.withheld_before(i), frame]
        spans += cutter.take()
        if i >= first.end_frame - 1:
            assert cutter.done and cutter.held == []
    assert asked == [first.end_frame - 1]   # asked once, by the event that completes the first window
    # the frames before the first window wake nobody: they go out with the event that completes it
    assert delivered == [i >= first.end_frame - 1 for i in range(len(codes))]
    np.testing.assert_array_equal(np.asarray(streamed), codes)
    if not alone:
        assert spans == []
        return
    assert [(start, end) for start, end, _ in spans] == [(0, first.end_frame)]
    whole = list(windows.decoder.decode_stream(torch.from_numpy(codes.T[None].copy()), schedule))
    np.testing.assert_array_equal(spans[0][2], whole[0][0].numpy())


def test_a_first_window_cutter_of_a_stream_shorter_than_its_first_window(windows):
    """One frame, then the end: the end flushes the first window, which is asked for and decoded."""
    codes = np.random.default_rng(5).integers(0, 2048, (1, 16))
    cutter = windows.cutter({}, None, lambda event: True)
    assert cutter(FrameEvent("r", codes[0].tolist(), finished=True, finish_reason="stop", index=0)) is True
    assert cutter.withheld_before(0) == []
    [(start, end, audio)] = cutter.take()
    assert (start, end, audio.size) == (0, 1, 1920)


def test_a_first_window_cutter_hands_its_withheld_frames_to_the_end(windows):
    """Frames withheld before the first window go out with the request's end, also an end without
    a frame (eos right after them: the end event's index is the number of frames)."""
    codes = np.random.default_rng(6).integers(0, 2048, (1, 16))
    cutter = windows.cutter({"initial_chunk_frames": 3}, None, lambda event: True)
    assert cutter(FrameEvent("r", codes[0].tolist(), index=0)) is False
    assert cutter(FrameEvent("r", None, finished=True, finish_reason="stop", index=1)) is True
    np.testing.assert_array_equal(np.asarray(cutter.withheld_before(1)), codes)
    [(start, end, audio)] = cutter.take()
    assert (start, end, audio.size) == (0, 1, 1920)
