"""What a listener hears (omni_backend/playback.py): a player that starts at the first audio."""
from __future__ import annotations

import pytest

from omni_backend.playback import GAP_S, playback_of


def test_chunks_in_time_play_without_a_gap():
    # 0.16 s of audio at 0.05 s, then 2 s that arrive while the first still plays, then more in time
    p = playback_of([(0.05, 0.16), (0.20, 2.0), (2.0, 2.0)])
    assert p.first_s == 0.05 and p.underrun_s == 0.0 and p.worst_gap_s == 0.0 and p.continuous
    assert p.audio_s == pytest.approx(4.16) and p.ends_s == pytest.approx(4.21)


def test_a_late_chunk_is_a_gap_and_the_player_restarts_from_its_arrival():
    # the first 0.16 s ends at 0.21; the next chunk comes at 0.61: a 0.4 s wait; the third, due
    # at 0.61 + 2.0, comes 0.05 s late: a short wait that is no audible gap
    p = playback_of([(0.05, 0.16), (0.61, 2.0), (2.66, 1.0)])
    assert p.gaps == pytest.approx([0.40, 0.05])
    assert p.underrun_s == pytest.approx(0.45) and p.worst_gap_s == pytest.approx(0.40)
    assert not p.continuous
    assert playback_of([(0.0, 0.1), (0.1 + GAP_S * 0.99, 0.1)]).continuous
    assert not playback_of([(0.0, 0.1), (0.1 + GAP_S, 0.1)]).continuous


def test_empty_chunks_do_not_start_or_stop_the_player():
    p = playback_of([(0.0, 0.0), (0.3, 0.1), (0.35, 0.0), (0.5, 0.1)])
    assert p.first_s == 0.3 and p.gaps == pytest.approx([0.1])
