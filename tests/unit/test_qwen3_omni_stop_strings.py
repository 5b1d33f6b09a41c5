"""OpenAI's `stop` for Qwen3-Omni text answers (omni_backend/models/qwen3_omni/stop_strings.py,
adapter.py): the answer ends where a stop string first appears, without it, whatever deltas it
straddles; the parameter is checked by name, and refused for spoken answers."""
from __future__ import annotations

import random

import pytest

from omni_backend.errors import InvalidRequest
from omni_backend.models.qwen3_omni.adapter import Qwen3OmniAdapter
from omni_backend.models.qwen3_omni.stop_strings import StopStrings


def _run(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    s = StopStrings(stops)
    out = [s.feed(d, last=i == len(deltas) - 1) for i, d in enumerate(deltas)]
    return "".join(out), s.stopped


def _cut(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice((0, 1, 2, 3, 7))
        pieces.append(text[i:i + n])
        i += n
    return pieces or [""]


@pytest.mark.parametrize("seed", range(20))
def test_any_cut_of_the_answer_gives_the_text_before_the_first_stop(seed):
    rng = random.Random(seed)
    text = "Hello there. 你好，世界！ The END is near; end. \n\nBye ENDING"
    stops = rng.sample(["END", "\n\n", "世界", "near;", "zzz", "Bye", "e"], rng.randint(1, 4))
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[:min(hits)] if hits else text
    assert _run(stops, _cut(text, rng)) == (expected, bool(hits))


def test_text_that_only_begins_a_stop_string_goes_out_at_the_end():
    assert _run(["xyz"], ["abc x", "y"]) == ("abc xy", False)
    s = StopStrings(["xyz"])
    assert s.feed("abc x") == "abc " and s.feed("yq") == "xyq"   # held back, then let go


@pytest.fixture(scope="module")
def adapter() -> Qwen3OmniAdapter:
    return Qwen3OmniAdapter.from_model("builtin:qwen3_omni_tiny_random")


def test_the_adapter_takes_stop_for_text_answers_and_names_bad_values(adapter):
    assert adapter.validate("Hi", {"stop": "END", "return_audio": False})["stop"] == ["END"]
    assert adapter.validate("Hi", {"stop": ["a", "b"], "return_audio": False})["stop"] == ["a", "b"]
    assert "stop" not in adapter.validate("Hi", {"return_audio": False})
    assert any(p["name"] == "stop" for p in adapter.describe()["params"])
    for stop, field in ((3, "stop"), (["a"] * 5, "stop"), (["a", ""], "stop[1]"), (["x" * 257], "stop[0]")):
        with pytest.raises(InvalidRequest) as e:
            adapter.validate("Hi", {"return_audio": False, "stop": stop})
        assert e.value.field == field, (stop, e.value)
    with pytest.raises(InvalidRequest) as e:   # a spoken answer (return_audio defaults to true)
        adapter.validate("Hi", {"stop": "END"})
    assert e.value.field == "stop" and "text answers only" in str(e.value)
