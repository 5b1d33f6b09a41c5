"""The codec chunk schedule (omni_backend/chunking.py): chunks that grow with the audio already
cut keep a listener from waiting after the first chunk wherever the engine runs at up to the
deploy's `continuity_rtf`, while the first audio stays as small as before and the audio from the
point where chunks reach `chunk_frames` on is the fixed schedule's, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_backend.chunking import CodecChunkSchedule
from omni_backend.deploy import DeployError, parse_deploy
from omni_backend.playback import playback_of

FRAME_S = 0.08   # 12.5 frames per second
FIXED, GROWING = CodecChunkSchedule(2, 25, 72), CodecChunkSchedule(2, 25, 72, continuity_rtf=0.75)


def test_chunks_grow_then_join_the_fixed_schedule():
    sizes = [w.new_frames for w in GROWING.plan(160)]
    assert sizes == [2, 2, 3, 4, 5, 7, 4, 11, 14, 19, 6, 25, 25, 25, 8]
    # each chunk at most first + e/3 frames (r = 0.75), never crossing a fixed cut (2 + 25k)
    emitted = 0
    for w in GROWING.plan(160):
        assert w.new_frames <= 2 + emitted // 3 or emitted == 0
        assert not any(w.first_new_frame < cut < w.end_frame for cut in range(2, 160, 25))
        emitted = w.end_frame
    # once chunks reach 25 frames (frame 77), the fixed schedule's windows
    assert [w for w in GROWING.plan(160) if w.first_new_frame >= 77] == \
        [w for w in FIXED.plan(160) if w.first_new_frame >= 77]
    assert GROWING.plan(160)[0] == FIXED.plan(160)[0]   # the same first chunk: the same first audio
    assert [w.new_frames for w in CodecChunkSchedule(2, 25, 72, 0.5).plan(60)] == [2, 4, 8, 13, 25, 8]
    # a remainder shorter than the first chunk joins the chunk before it
    assert [w.new_frames for w in CodecChunkSchedule(3, 10, 72, 0.75).plan(40)] == [3, 4, 6, 7, 3, 10, 7]
    assert [w.new_frames for w in CodecChunkSchedule(2, 25, 72, 1.0).plan(12)] == [2] * 6   # r = 1: never grows
    for total in range(1, 100):   # streams cut short still end with their last frame
        assert sum(w.new_frames for w in GROWING.plan(total)) == total
    assert GROWING.full_window_shapes()[-1] == (97, 72)
    with pytest.raises(ValueError, match="continuity_rtf"):
        CodecChunkSchedule(2, 25, 72, 1.5)


def arrivals(schedule: CodecChunkSchedule, frames: int, step_s: float, decode_s: float) -> list[tuple[float, float]]:
    """(arrival, duration) of each chunk when the engine makes a frame every `step_s` and a window
    is decoded `decode_s` after its last frame, plus 1 ms per frame (windows in order, one decoder)."""
    out, ready = [], 0.0
    for w in schedule.plan(frames):
        ready = max(ready, w.end_frame * step_s) + decode_s + 0.001 * w.total_frames
        out.append((ready, w.new_frames * FRAME_S))
    return out


@pytest.mark.parametrize("rtf", [0.25, 0.5, 0.6, 0.7, 0.75])
def test_growing_chunks_play_without_a_gap_up_to_continuity_rtf(rtf):
    """The fixed `2, then 25` starves the player after the first chunk whenever 25 frames take
    longer to make than 160 ms lasts; grown chunks never do at up to `continuity_rtf`, and the
    first audio comes as early."""
    step = rtf * FRAME_S
    before, after = (playback_of(arrivals(s, 150, step, 0.02)) for s in (FIXED, GROWING))
    assert before.worst_gap_s > 0.3 and not before.continuous
    assert after.continuous and after.first_s == before.first_s
    if rtf < 0.75:   # at the limit itself, larger windows' longer decodes leave waits of a few ms
        assert after.underrun_s == 0.0


def test_the_deploy_sets_the_schedule_and_requests_keep_it():
    a = parse_deploy({"pipeline": "p"}).async_chunk
    assert a.chunk_schedule() == CodecChunkSchedule(2, 25, 72, 0.75)
    assert a.chunk_schedule(3, 10, None) == CodecChunkSchedule(3, 10, 72, 0.75)
    # vLLM-Omni's initial_codec_chunk_frames 0: no small first chunk, the first is a regular one
    assert a.chunk_schedule(0, None, None) == CodecChunkSchedule(25, 25, 72, 0.75)
    assert a.chunk_schedule(0, 10, None) == CodecChunkSchedule(10, 10, 72, 0.75)
    off = parse_deploy({"pipeline": "p", "async_chunk": {"continuity_rtf": 0}}).async_chunk
    assert off.chunk_schedule() == FIXED
    for bad in (1.2, -0.1, True, "0.5"):
        with pytest.raises(DeployError, match="async_chunk.continuity_rtf"):
            parse_deploy({"pipeline": "p", "async_chunk": {"continuity_rtf": bad}})


def test_audio_from_where_chunks_reach_chunk_frames_is_the_fixed_schedules():
    """Windows change, the samples from frame 77 on (and of the first chunk) do not: those windows
    are the fixed schedule's, with the same context; the ones between differ by float rounding
    (the random tiny decoder, CPU)."""
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav

    torch.set_num_threads(1)
    decoder = Code2Wav.from_checkpoint(f"{resolve_checkpoint('builtin:qwen3_tts_tiny_random')}/speech_tokenizer")
    decoder.batch_invariant = True
    codes = torch.randint(0, 2048, (1, 16, 130), generator=torch.Generator().manual_seed(0))

    def audio(schedule):
        return torch.cat(list(decoder.decode_stream(codes, schedule)), dim=-1)[0].numpy()

    fixed, growing = audio(FIXED), audio(GROWING)
    hop = decoder.hop_length
    assert fixed.shape == growing.shape == (130 * hop,)
    np.testing.assert_array_equal(growing[77 * hop:], fixed[77 * hop:])
    np.testing.assert_array_equal(growing[:2 * hop], fixed[:2 * hop])
    # in between, windows that see every frame before them: the same samples up to float rounding
    np.testing.assert_allclose(growing, fixed, rtol=0, atol=1e-5)
