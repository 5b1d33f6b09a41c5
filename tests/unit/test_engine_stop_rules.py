"""The engine owns stopping: eos ids, max_new_tokens (less the runner's offset), max_model_len and
min_new_tokens are decided by the engine from the runner's data, with a scripted runner that
only computes steps (no model)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from omni_backend.engine import AREngine, ModelRunner, PromptTooLongError, SamplingParams, Sequence, StepOutput

EOS = 99


@dataclass(frozen=True)
class Script:
    """A prompt of ``length`` positions whose model would emit ``tokens`` in order."""

    length: int
    tokens: tuple[int, ...]


class ScriptedRunner(ModelRunner):
    """A plain LM: each frame is its token. A banned eos becomes ``1000 + index``. Records the
    engine's per-step inputs."""

    def __init__(self, max_model_len: int = 64, offset: int = 0) -> None:
        self.max_num_seqs = 4
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset({EOS})
        self.max_new_tokens_offset = offset
        self.inputs: list[tuple[bool, bool]] = []   # (sample_next, ban_eos) per call and sequence

    def prompt_length(self, prompt: Script) -> int:
        return prompt.length

    def _next(self, seq: Sequence) -> int:
        self.inputs.append((seq.sample_next, seq.ban_eos))
        index = len(seq.state)
        token = seq.prompt.tokens[index]
        token = 1000 + index if seq.ban_eos and token == EOS else token
        seq.state.append(token)
        return token

    def prefill(self, seq: Sequence) -> int:
        seq.state = []
        return self._next(seq)

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        out = []
        for seq in seqs:
            frame = [seq.state[-1]]
            if seq.sample_next:
                out.append(StepOutput(seq, frame, self._next(seq)))
            else:
                self.inputs.append((False, seq.ban_eos))
                out.append(StepOutput(seq, frame, None))
        return out


def _run(runner: ModelRunner, script: Script, **params) -> tuple[list[list[int]], str]:
    engine = AREngine(runner)
    engine.add_request("r", script, SamplingParams.greedy(**{"min_new_tokens": 0, **params}))
    events = engine.run_until_done()
    assert sum(e.finished for e in events) == 1 and events[-1].finished
    return [e.codes for e in events if e.codes is not None], events[-1].finish_reason


COUNT = Script(4, tuple(range(1, 40)))


@pytest.mark.parametrize("n", [1, 2, 5])
def test_max_new_tokens_counts_frames_less_the_runners_offset(n):
    runner = ScriptedRunner()
    frames, reason = _run(runner, COUNT, max_new_tokens=n)
    assert frames == [[t] for t in range(1, n + 1)] and reason == "length"
    assert runner.inputs[-1][0] is False   # the last step draws no token that no frame would use
    assert sum(sample for sample, _ in runner.inputs) == n
    frames, reason = _run(ScriptedRunner(offset=1), COUNT, max_new_tokens=n)
    assert len(frames) == n - 1 and reason == "length"


def test_eos_stops_and_is_not_a_frame():
    frames, reason = _run(ScriptedRunner(), Script(4, (5, 6, EOS, 7)), max_new_tokens=10)
    assert frames == [[5], [6]] and reason == "stop"
    frames, reason = _run(ScriptedRunner(), Script(4, (EOS, 7)), max_new_tokens=10)
    assert frames == [] and reason == "stop"


def test_min_new_tokens_bans_eos_through_the_step_inputs():
    runner = ScriptedRunner()
    frames, reason = _run(runner, Script(4, (5, EOS, EOS, EOS, 6, EOS)), max_new_tokens=10, min_new_tokens=3)
    assert [ban for _, ban in runner.inputs] == [True, True, True, False]
    assert frames == [[5], [1001], [1002]] and reason == "stop"


def test_max_model_len_counts_prompt_and_frames():
    runner = ScriptedRunner(max_model_len=8)
    frames, reason = _run(runner, Script(5, tuple(range(1, 40))), max_new_tokens=100)
    # frame j is fed back at position 5 + j: positions 5, 6, 7 exist, so 3 more tokens after the first
    assert frames == [[1], [2], [3], [4]] and reason == "length"
    with pytest.raises(PromptTooLongError, match="input: the prompt takes 8 positions"):
        AREngine(runner).add_request("x", Script(8, (1,)), SamplingParams.greedy())
