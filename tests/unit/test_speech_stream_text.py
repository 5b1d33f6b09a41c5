"""The WebSocket session's text handling without a server: the sentence / clause splitter and the
session.config checks (client/speech_api/text_splitter.py, stream_config.py)."""
from __future__ import annotations

import time

import pytest

from client.speech_api.catalog import Catalog
from client.speech_api.errors import ApiError, model_not_found
from client.speech_api.stream_config import error_message, parse_session_config
from client.speech_api.text_splitter import TextSplitter


def _feed(granularity: str, pieces: list[str]) -> list[str]:
    splitter = TextSplitter(granularity)
    units = [u for p in pieces for u in splitter.feed(p)]
    return units + splitter.flush()


def test_sentences_end_at_marks_followed_by_space_or_cjk_marks():
    text = "Hello there. It costs 3.14 dollars! Is it? 你好。世界！ trailing"
    expected = ["Hello there.", "It costs 3.14 dollars!", "Is it?", "你好。", "世界！", "trailing"]
    assert _feed("sentence", [text]) == expected
    assert _feed("sentence", list(text)) == expected           # one character at a time
    splitter = TextSplitter("sentence")
    assert splitter.feed("Wait.") == []                           # "." at the end may be "Wait.js"
    assert splitter.feed(" Next") == ["Wait."]


def test_clauses_and_none():
    assert _feed("clause", ["One, two; three. 四，五"]) == ["One,", "two;", "three.", "四，", "五"]
    assert _feed("none", ["One. ", "Two."]) == ["One. Two."]
    assert _feed("sentence", ["   "]) == []


def test_no_unit_is_longer_than_a_request_may_be():
    words = "word " * 2000                       # 10,000 characters, no unit end
    for granularity in ("sentence", "clause", "none"):
        units = _feed(granularity, [words[i:i + 7] for i in range(0, len(words), 7)])
        assert max(len(u) for u in units) <= 4096 and len(units) == 3, granularity
        assert " ".join(units).split() == words.split()                  # cut at whitespace, nothing lost
    # a `none` utterance over the limit is cut at its last sentence end within it
    sentences = "This is one sentence of the utterance. " * 200     # 7,800 characters
    units = _feed("none", [sentences])
    assert [len(u) for u in units] == [len(sentences[:4095].rsplit(". ", 1)[0]) + 1, len(units[1])]
    assert all(u.endswith(".") for u in units) and " ".join(units) == sentences.strip()
    # a run without whitespace is cut at the limit
    assert [len(u) for u in _feed("sentence", ["x" * 9000])] == [4096, 4096, 808]
    # a sentence that ends past the limit
    assert [len(u) for u in _feed("sentence", ["y" * 5000 + ". Next."])] == [4096, 905, 5]
    assert [len(u) for u in TextSplitter("clause", max_chars=10).feed("abc def ghi jkl, x")] == [7, 8]


def test_splitting_costs_time_linear_in_the_text():
    # 65,536 characters without a unit end, 4 at a time (an LLM's pace): each piece used to rescan
    # all pending text, 25 s of the event loop in all
    text = "hello wor" * 7282
    for granularity in ("sentence", "clause"):
        splitter = TextSplitter(granularity)
        started = time.monotonic()
        units = [u for i in range(0, len(text), 4) for u in splitter.feed(text[i:i + 4])] + splitter.flush()
        assert time.monotonic() - started < 2.0
        assert "".join(units).replace(" ", "") == text.replace(" ", "")


def _catalog() -> Catalog:
    catalog = Catalog("hibari")
    catalog.learn("hibari", '{"params": [{"name": "voice", "type": "str", "choices": ["heart"]}], "voices": ["heart"]}')
    catalog.learn("q", '{"params": [{"name": "voice", "type": "str"}, {"name": "streaming_input", "type": "bool"}, '
                       '{"name": "do_sample", "type": "bool"}], "voices": ["ryan"]}')
    return catalog


def _resolve(catalog: Catalog):
    def resolve(model: str) -> str:
        if catalog.get(model) is None:
            raise model_not_found(model, ["hibari", "q"])
        return model
    return resolve


def test_session_config_checks_name_the_field():
    catalog = _catalog()
    config = parse_session_config({"type": "session.config", "model": "q", "voice": "ryan", "split_granularity": "append",
                                   "sampling": {"do_sample": False}, "response_format": "pcm", "sample_rate": 16000},
                                  _resolve(catalog), catalog, None)
    assert (config.split, config.sample_rate, config.request.params["do_sample"]) == ("append", 16000, False)
    bad = [({"model": "hibari", "split_granularity": "append"}, "split_granularity"),
           ({"model": "q", "split_granularity": "word"}, "split_granularity"),
           ({"model": "hibari", "temperature": 0.5}, "temperature"),
           ({"model": "q", "word_timestamps": True}, "word_timestamps"),
           ({"model": "q", "sample_rate": 5}, "sample_rate"),
           ({"model": "missing"}, "model")]
    for msg, field in bad:
        with pytest.raises(ApiError) as e:
            parse_session_config(msg, _resolve(catalog), catalog, None)
        assert e.value.param == field, (msg, e.value.message)
        error = error_message(e.value)
        assert error["type"] == "error" and error["message"].startswith(f"{error['code']}: ")
