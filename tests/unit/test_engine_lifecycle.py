"""Engine lifecycle: admission up to max_num_seqs, cancellation frees the slot, the end of every
request (eos, max_new_tokens, model length, cancel) is one final event and releases its state,
request ids are unique, bad parameters are refused when added."""
from __future__ import annotations

import pytest

from omni_backend.engine import DuplicateRequestError, PromptTooLongError, SamplingParams, SamplingParamsError
from omni_backend.models.qwen3_tts.runner import create_engine
from omni_backend.models.qwen3_tts.sampling_params import Qwen3SamplingParams
from tests.qwen3_fixtures import QWEN3_EOS_AFTER


pytestmark = pytest.mark.usefixtures("qwen3_threads")


@pytest.fixture(scope="module")
def cv(qwen3_loaded, qwen3_tiny_cv):
    return qwen3_loaded(qwen3_tiny_cv)


def _prompt(checkpoint, text="Hello world, this is a test.", speaker="ryan"):
    return checkpoint.prompt_builder().build(text, speaker=speaker, language="english")


def _collect(engine, max_steps=500):
    events = []
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        events.extend(engine.step())
    return events


def test_admission_and_cancel_free_the_slot(cv):
    engine = create_engine(cv, max_num_seqs=2, max_model_len=128, num_threads=1)
    params = SamplingParams.greedy(max_new_tokens=50)
    for rid in ("a", "b", "c"):
        engine.add_request(rid, _prompt(cv), params)
    seqs = {}
    first = engine.step()   # admits a (one prefill per step)
    second = engine.step()  # admits b
    assert {e.request_id for e in first} == {"a"} and {e.request_id for e in second} == {"a", "b"}
    assert engine.num_running == 2 and engine.scheduler.num_free_slots == 0
    seqs = {s.request_id: s for s in engine.scheduler.running.values()}
    assert [s.request_id for s in engine.scheduler.waiting] == ["c"]
    slot_a = seqs["a"].slot
    assert engine.cancel("a") is True
    events = engine.step()
    cancelled = [e for e in events if e.request_id == "a"]
    assert len(cancelled) == 1 and cancelled[0].finished and cancelled[0].finish_reason == "cancelled"
    assert cancelled[0].codes is None and cancelled[0].index == 2
    assert seqs["a"].state is None and seqs["a"].slot is None       # state released, slot freed
    running = {s.request_id: s for s in engine.scheduler.running.values()}
    assert set(running) == {"b", "c"} and running["c"].slot == slot_a  # c took a's slot in the same step
    assert engine.cancel("a") is False                                 # already ended
    assert engine.cancel("nope") is False
    # cancel a waiting request before it ever runs
    engine.add_request("d", _prompt(cv), params)
    engine.cancel("d")
    events = engine.step()
    assert [e.finish_reason for e in events if e.request_id == "d"] == ["cancelled"]
    engine.cancel("b")
    engine.cancel("c")
    _collect(engine)
    assert not engine.has_unfinished() and engine.scheduler.num_free_slots == 2


def test_max_new_tokens_semantics(cv):
    engine = create_engine(cv, max_num_seqs=4, max_model_len=128, num_threads=1)
    seqs = [engine.add_request(f"n{n}", _prompt(cv), SamplingParams.greedy(max_new_tokens=n)) for n in (1, 2, 3, 7)]
    events = _collect(engine)
    assert all(s.state is None and s.slot is None for s in seqs)  # released on finish
    assert engine.scheduler.num_free_slots == 4 and not engine.scheduler.running
    for n in (1, 2, 3, 7):
        mine = [e for e in events if e.request_id == f"n{n}"]
        frames = [e for e in mine if e.codes is not None]
        assert len(frames) == n - 1                       # as the reference generate()
        assert [e.index for e in frames] == list(range(n - 1))
        assert mine[-1].finished and mine[-1].finish_reason == "length"
        assert sum(e.finished for e in mine) == 1
        assert all(len(e.codes) == 16 and all(0 <= c < 2048 for c in e.codes) for e in frames)
    assert [e for e in events if e.request_id == "n1"][0].codes is None


def test_eos_stop(qwen3_loaded, qwen3_tiny_eos):
    ck = qwen3_loaded(qwen3_tiny_eos)
    engine = create_engine(ck, max_num_seqs=4, max_model_len=128, num_threads=1)
    engine.add_request("e", _prompt(ck), SamplingParams.greedy(max_new_tokens=30))
    engine.add_request("s", _prompt(ck, "Another one, sampled."), SamplingParams(seed=5, max_new_tokens=30))
    events = _collect(engine)
    for rid in ("e", "s"):
        mine = [e for e in events if e.request_id == rid]
        assert len(mine) == QWEN3_EOS_AFTER and mine[-1].finished and mine[-1].finish_reason == "stop"
        assert all(e.codes is not None for e in mine)


def test_model_length_limit(cv):
    prompt = _prompt(cv)
    engine = create_engine(cv, max_num_seqs=1, max_model_len=prompt.prefill_length + 4, num_threads=1)
    engine.add_request("x", prompt, SamplingParams.greedy(max_new_tokens=100))
    events = _collect(engine)
    assert len(events) == 5 and events[-1].finish_reason == "length"
    with pytest.raises(PromptTooLongError, match="input: .*max_model_len"):
        create_engine(cv, max_num_seqs=1, max_model_len=prompt.prefill_length, num_threads=1).add_request(
            "y", prompt, SamplingParams.greedy())


def test_request_errors(cv):
    engine = create_engine(cv, max_num_seqs=1, max_model_len=64, num_threads=1)
    engine.add_request("dup", _prompt(cv), SamplingParams.greedy(max_new_tokens=3))
    with pytest.raises(DuplicateRequestError):
        engine.add_request("dup", _prompt(cv), SamplingParams.greedy())
    for field, params in (("max_new_tokens", SamplingParams(max_new_tokens=0)),
                          ("temperature", SamplingParams(temperature=0.0)),
                          ("subtalker_top_p", SamplingParams(extra=Qwen3SamplingParams(subtalker_top_p=1.5))),
                          ("subtalker_temperature", SamplingParams.greedy(
                              extra=Qwen3SamplingParams(subtalker_do_sample=True, subtalker_temperature=0.0))),
                          ("extra", SamplingParams(extra={"subtalker_top_p": 0.5})),
                          ("top_k", SamplingParams(top_k=-1)),
                          ("repetition_penalty", SamplingParams(repetition_penalty=0.0)),
                          ("seed", SamplingParams(seed=-1)),
                          ("seed", SamplingParams(seed=2 ** 63))):  # the static step keeps seeds as int64
        with pytest.raises(SamplingParamsError) as info:
            engine.add_request("bad", _prompt(cv), params)
        assert info.value.field == field and isinstance(info.value, ValueError)
    with pytest.raises(TypeError):
        engine.add_request("raw", "just a string", SamplingParams.greedy())
    _collect(engine)
    engine.add_request("dup", _prompt(cv), SamplingParams.greedy(max_new_tokens=2))  # ended ids can be reused


def test_runner_error_ends_only_the_batch(cv, monkeypatch):
    engine = create_engine(cv, max_num_seqs=2, max_model_len=64, num_threads=1)
    engine.add_request("boom", _prompt(cv), SamplingParams.greedy(max_new_tokens=5))

    def broken(seq):
        raise RuntimeError("broken prefill")

    monkeypatch.setattr(engine.runner, "prefill", broken)
    events = engine.step()
    assert events[0].finish_reason == "error" and "broken prefill" in events[0].error
    assert engine.scheduler.find("boom") is None
    assert not engine.has_unfinished() and engine.scheduler.num_free_slots == 2


def test_bfloat16_engine(qwen3_tiny_cv):
    engine = create_engine(str(qwen3_tiny_cv), dtype="bfloat16", max_num_seqs=2, max_model_len=64, num_threads=1)
    builder = engine.runner.checkpoint.prompt_builder()
    out = engine.generate([("a", builder.build("Hello there.", speaker="ryan"), SamplingParams.greedy(max_new_tokens=5)),
                           ("b", builder.build("Hi.", speaker="eric"), SamplingParams(seed=1, max_new_tokens=5))])
    assert {k: len(v) for k, v in out.items()} == {"a": 4, "b": 4}


def test_default_params_come_from_generation_config(cv):
    engine = create_engine(cv, max_num_seqs=1, max_model_len=64, num_threads=1)
    assert engine.default_params.max_new_tokens == 8192 and engine.default_params.do_sample is True


def test_a_failing_joint_prefill_falls_back_to_one_by_one(cv, monkeypatch):
    """Requests admitted together are prefilled together where the runner can; if that raises,
    each is prefilled alone, so only the bad request ends with an error."""
    engine = create_engine(cv, max_num_seqs=3, max_model_len=64, num_threads=1, max_prefills_per_step=3,
                           static_step=True, cuda_graph_sizes=[1, 2, 4])
    for name in ("a", "boom", "c"):
        engine.add_request(name, _prompt(cv), SamplingParams.greedy(max_new_tokens=4))
    single = engine.runner.prefill
    calls = []

    def together(seqs):
        calls.append(len(seqs))
        raise RuntimeError("broken joint prefill")

    def alone(seq):
        if seq.request_id == "boom":
            raise RuntimeError("broken prefill")
        return single(seq)

    monkeypatch.setattr(engine.runner, "prefill_many", together)
    monkeypatch.setattr(engine.runner, "prefill", alone)
    events = _collect(engine)
    assert calls == [3]
    errors = [e for e in events if e.finish_reason == "error"]
    assert [e.request_id for e in errors] == ["boom"] and "broken prefill" in errors[0].error
    frames = {}
    for e in events:
        if e.codes is not None:
            frames.setdefault(e.request_id, []).append(e.codes)
    assert {k: len(v) for k, v in frames.items()} == {"a": 3, "c": 3}
    assert engine.scheduler.num_free_slots == 3


def test_request_fields_map_to_sampling_params(cv):
    """The talker stage's mapping: engine fields and the code predictor's subtalker_* (in
    ``extra``) over the defaults; unset or None keeps a default; min_new_tokens is deploy-only."""
    from omni_backend.models.qwen3_tts.sampling_params import code_predictor_params, sampling_params_from_request

    defaults = create_engine(cv, max_num_seqs=1, max_model_len=64, num_threads=1).default_params
    assert defaults.extra == Qwen3SamplingParams(subtalker_do_sample=True, subtalker_temperature=0.9,
                                                 subtalker_top_k=50, subtalker_top_p=1.0)
    got = sampling_params_from_request(defaults, {"do_sample": False, "top_k": 7, "subtalker_top_p": 0.5,
                                                  "subtalker_temperature": None, "min_new_tokens": 9, "seed": 3,
                                                  "voice": "ryan"})
    assert (got.do_sample, got.top_k, got.temperature, got.seed) == (False, 7, defaults.temperature, 3)
    assert got.min_new_tokens == defaults.min_new_tokens
    assert got.extra == Qwen3SamplingParams(subtalker_do_sample=True, subtalker_temperature=0.9, subtalker_top_k=50,
                                            subtalker_top_p=0.5)
    # without extra, the code predictor follows do_sample: greedy() is greedy for every codebook
    assert code_predictor_params(SamplingParams.greedy()).subtalker_do_sample is False
    assert code_predictor_params(SamplingParams()).subtalker_do_sample is True


def test_ignore_eos_generates_to_max_new_tokens(qwen3_loaded, qwen3_tiny_eos):
    """A request's `ignore_eos` (vLLM-Omni's benchmark sends it) holds eos back for every token
    `max_new_tokens` allows: the checkpoint that emits eos after a few frames runs to the limit."""
    from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request

    ck = qwen3_loaded(qwen3_tiny_eos)
    defaults = SamplingParams.greedy(max_new_tokens=2048)
    engine = create_engine(ck, max_num_seqs=2, max_model_len=128, num_threads=1)
    engine.add_request("ignored", _prompt(ck), sampling_params_from_request(
        defaults, {"ignore_eos": True, "max_new_tokens": 30}))
    engine.add_request("honoured", _prompt(ck), sampling_params_from_request(
        defaults, {"ignore_eos": False, "max_new_tokens": 30}))
    events = _collect(engine)
    ignored = [e for e in events if e.request_id == "ignored"]
    honoured = [e for e in events if e.request_id == "honoured"]
    assert len(ignored) == 29 and ignored[-1].finish_reason == "length"   # max_new_tokens - 1 frames
    assert len(honoured) == QWEN3_EOS_AFTER and honoured[-1].finish_reason == "stop"
    assert [e.codes for e in ignored[:QWEN3_EOS_AFTER - 1]] == [e.codes for e in honoured[:QWEN3_EOS_AFTER - 1]]
