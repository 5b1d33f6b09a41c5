"""A clone whose prompt leaves the engine no room names its recording (`ref_audio`), not the
text: most of such a prompt is the recording's frames. Without a recording the engine's own
error (naming `input`) stands."""
from __future__ import annotations

import pytest

from omni_backend.engine.sequence import PromptTooLongError
from omni_backend.errors import InvalidRequest
from omni_backend.reference_audio import recording_named_if_too_long


def _too_long():
    raise PromptTooLongError("input", "the prompt takes 3000 positions; this engine holds 2048 per request")


def test_a_clone_names_its_recording():
    with pytest.raises(InvalidRequest) as e:
        with recording_named_if_too_long({"ref_audio": "data:audio/wav;base64,AAAA"}):
            _too_long()
    assert e.value.field == "ref_audio" and "3000 positions" in e.value.reason and "shorter" in e.value.reason


def test_without_a_recording_the_text_is_named():
    with pytest.raises(PromptTooLongError) as e:
        with recording_named_if_too_long({"text": "long"}):
            _too_long()
    assert e.value.field == "input"


def test_other_errors_pass_through():
    with pytest.raises(ValueError, match="other"):
        with recording_named_if_too_long({"ref_audio": "x"}):
            raise ValueError("other")
