"""Text that arrives in pieces while a Qwen3-TTS request runs (an LLM still writing).

* :class:`StreamedText` hands out exactly the ids the whole text gets (both split regexes the
  reference loader may use), for pieces of 1 character up to whole sentences cut anywhere, in
  English, Chinese, Japanese, with combining marks, spaces, newlines and added-token texts.
* Through the engine: greedy codes for text delivered in pieces, at any pace (before the prefill,
  at once, one piece every few steps, slower than the talker reads so the request waits often),
  equal the codes of the same text given whole in the first piece; a waiting request emits
  nothing and holds its slot while other requests in the batch keep stepping (and stay equal to
  their solo run); the first audio frame comes before the text is complete; a request that waits
  longer than ``max_input_wait_s`` ends with ``input_timeout``; both decode strategies (the CPU
  exact step and the static step of the CUDA graphs, run eagerly).
"""
from __future__ import annotations

import random
import time

import pytest

from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_tts.runner import create_engine
from omni_backend.models.qwen3_tts.streamed_text import StreamedText
from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer, assistant_text
from tests.qwen3_fixtures import QWEN3_TOKENIZER_TEXTS

pytestmark = pytest.mark.usefixtures("qwen3_threads")

EXTRA_TEXTS = ["e\u0301te\u0301 x\u0301 y", "a<|im", "x<|im_end|>y<|im_start", "hello\n\n\n  world  \n",
               "Hello...!!! ??? ok", "don't won't it'S", "The year 2025: 3.14 and 1,000.", "一二三四五六七八九十。"]
ENGLISH = "Hello world, this is a streaming test. It speaks while the text is still being written."
CHINESE = "你好，世界。今天天气很好，我们去公园散步吧！"


def _cuts(text: str, rng: random.Random, sizes: tuple[int, ...]) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.choice(sizes)
        pieces.append(text[i:i + n])
        i += n
    return pieces


def _sentences(text: str) -> list[str]:
    out, start = [], 0
    for i, ch in enumerate(text):
        if ch in ".!?。！？，,":
            out.append(text[start:i + 1])
            start = i + 1
    return out + ([text[start:]] if text[start:] else [])


@pytest.mark.parametrize("patched", [True, False])
def test_streamed_ids_equal_whole_text(patched, qwen3_tiny_cv):
    config = None if patched else {"transformers_version": "4.50.0", "model_type": "qwen3_tts"}
    tokenizer = QwenTextTokenizer(str(qwen3_tiny_cv), config)
    assert tokenizer.patched_split is patched
    rng = random.Random(7)
    for text in QWEN3_TOKENIZER_TEXTS + EXTRA_TEXTS + [ENGLISH, CHINESE]:
        whole = tokenizer.encode(assistant_text(text))[1:-5]
        cuttings = [list(text), _sentences(text), [text]] + [_cuts(text, rng, (1, 2, 3, 5, 8, 13)) for _ in range(40)]
        for pieces in cuttings:
            streamed = StreamedText(tokenizer)
            got = [i for piece in pieces for i in streamed.push(piece)] + streamed.finish()
            assert got == whole, (text, pieces)
            assert streamed.ids == whole


def test_streamed_text_holds_back_only_the_tail(qwen3_tiny_cv):
    tokenizer = QwenTextTokenizer(str(qwen3_tiny_cv))
    streamed = StreamedText(tokenizer)
    streamed.push("Hel")
    assert streamed.text_ids == []                  # "Hel" may still grow
    assert streamed.push("lo wor") != []            # "Hello" is final once " wor" began
    assert streamed.text_ids == tokenizer.encode("Hello")
    streamed.push("ld <|im_")                       # may become <|im_end|>: held back
    assert streamed.text_ids == tokenizer.encode("Hello world")
    streamed.finish()
    with pytest.raises(Exception, match="ended"):
        streamed.push("more")
    small = StreamedText(tokenizer, max_chars=5)
    small.push("12345")
    with pytest.raises(Exception, match="limit is 5"):
        small.push("6")


# ---------------------------------------------------------------- through the engine

GREEDY = SamplingParams.greedy(max_new_tokens=40)


def _prompt(builder, text: str, speaker: str, language: str, streamed: StreamedText | None = None):
    return builder.build(text, speaker=speaker, language=language, non_streaming_mode=False,
                         streamed_ids=None if streamed is None else tuple(streamed.ids))


def _run_streamed(engine, builder, tokenizer, rid: str, pieces: list[str], every: int, speaker: str = "ryan",
                  language: str = "english", others: tuple = ()) -> dict:
    """Deliver ``pieces`` to one request, one piece every ``every`` steps (0: all at once, before
    the first step); ``others``: plain requests running beside it. Returns frames per request id,
    and for ``rid`` the step of each frame and the step the text was complete."""
    streamed = StreamedText(tokenizer)
    queue = list(pieces)
    added = False
    while not added or len(streamed.text_ids) == 0:   # the prompt needs its first text id
        if queue:
            streamed.push(queue.pop(0))
        else:
            streamed.finish()
        added = True
    engine.add_request(rid, _prompt(builder, "".join(pieces), speaker, language, streamed), GREEDY,
                       input_open=True)
    given = len(streamed.ids)
    for other_id, prompt in others:
        engine.add_request(other_id, prompt, GREEDY)
    frames: dict[str, list] = {}
    frame_steps: list[int] = []
    complete_at = None
    step = 0

    def deliver(pieces_now: list[str]) -> None:
        nonlocal given, complete_at
        for piece in pieces_now:
            streamed.push(piece)
        end = not queue
        if end:
            streamed.finish()
            complete_at = step
        engine.append_input(rid, streamed.ids[given:], end=end)
        given = len(streamed.ids)

    if every == 0 and not streamed.ended:
        deliver([queue.pop(0) for _ in range(len(queue))])
    while engine.has_unfinished():
        if every and not streamed.ended and step % every == 0:
            deliver([queue.pop(0)] if queue else [])
        for event in engine.step():
            if event.codes is not None:
                frames.setdefault(event.request_id, []).append(event.codes)
                if event.request_id == rid:
                    frame_steps.append(step)
        step += 1
    return {"frames": frames, "frame_steps": frame_steps, "complete_at": complete_at}


@pytest.mark.parametrize("static_step", [False, True])
def test_pieces_at_any_pace_equal_whole_text(static_step, qwen3_tiny_cv, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    engine = create_engine(checkpoint, max_num_seqs=4, max_model_len=256, static_step=static_step)
    builder = checkpoint.prompt_builder()
    tokenizer = builder.tokenizer
    rng = random.Random(3)
    for text, speaker, language in ((ENGLISH, "ryan", "english"), (CHINESE, "eric", "chinese")):
        whole = _run_streamed(engine, builder, tokenizer, "whole", [text], 0, speaker, language)["frames"]["whole"]
        assert len(whole) == GREEDY.max_new_tokens - 1
        cases = [(list(text), 1), (list(text), 3), (_sentences(text), 2), (_sentences(text), 9),
                 (_cuts(text, rng, (1, 2, 4, 7)), 1), (_cuts(text, rng, (2, 3, 5)), 5), (_cuts(text, rng, (1, 3)), 0)]
        for pieces, every in cases:
            run = _run_streamed(engine, builder, tokenizer, "pieces", pieces, every, speaker, language)
            assert run["frames"]["pieces"] == whole, (text, pieces, every)
            if every >= 2 and len(pieces) > 3:   # slower than one text id a frame: audio before the end of the text
                assert run["frame_steps"][0] < run["complete_at"], (pieces, every)


def test_waiting_request_holds_its_slot_while_others_step(qwen3_tiny_cv, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    engine = create_engine(checkpoint, max_num_seqs=3, max_model_len=256)
    builder = checkpoint.prompt_builder()
    other = builder.build("A plain request beside it.", speaker="vivian", non_streaming_mode=False)
    solo = engine.generate([("solo", other, GREEDY)])["solo"]
    # the streamed request gets a word every 6 steps: it waits most steps
    words = [w + " " for w in ENGLISH.split(" ")]
    run = _run_streamed(engine, builder, builder.tokenizer, "slow", words, 6, others=(("beside", other),))
    assert run["frames"]["beside"] == solo
    steps = run["frame_steps"]
    assert max(b - a for a, b in zip(steps, steps[1:])) > 1, "the slow request never waited"
    whole = _run_streamed(engine, builder, builder.tokenizer, "whole", ["".join(words)], 0)["frames"]["whole"]
    assert run["frames"]["slow"] == whole
    assert engine.scheduler.num_free_slots == 3


def test_waiting_request_keeps_its_slot_and_times_out(qwen3_tiny_cv, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    engine = create_engine(checkpoint, max_num_seqs=2, max_model_len=256)
    engine.max_input_wait_s = 0.3
    builder = checkpoint.prompt_builder()
    streamed = StreamedText(builder.tokenizer)
    streamed.push("Hello there, and ")
    engine.add_request("open", _prompt(builder, "Hello there", "ryan", "english", streamed), GREEDY, input_open=True)
    events = []
    for _ in range(10):
        events += engine.step()
    frames = [e for e in events if e.codes is not None]
    assert 0 < len(frames) < 6        # it read the ids it had, then waited
    assert engine.idle and engine.scheduler.num_free_slots == 1 and not any(e.finished for e in events)
    time.sleep(0.4)
    ended = engine.step() + engine.step()
    assert [(e.finished, e.finish_reason) for e in ended] == [(True, "input_timeout")]
    assert "max_input_wait_s" in ended[0].error
    assert engine.scheduler.num_free_slots == 2 and not engine.has_unfinished()
