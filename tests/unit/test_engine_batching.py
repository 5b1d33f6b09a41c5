"""Batched decode equals solo decode bit for bit: 8 different requests (speakers, languages,
text modes, penalties, lengths) admitted at different steps produce exactly the codes each
produces alone, on two shapes (tiny2 has an FFN width whose SiLU is not batch-invariant on CPU,
which exercises the per-row fallback)."""
from __future__ import annotations

import pytest

from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_tts.runner import create_engine

TEXTS = ["Hello world, this is a streaming test.", "你好，世界。", "Short.",
         "A much longer sentence that has quite a few more tokens in it than the others.",
         "Numbers 1 2 3 and symbols #$%.", "Bonjour tout le monde.", "How are you?",
         "The quick brown fox jumps over the lazy dog."]
SPEAKERS = ["ryan", "eric", "vivian", "aiden", "sohee", "serena", "dylan", "uncle_fu"]
LANGUAGES = ["english", "chinese", "auto"]


pytestmark = pytest.mark.usefixtures("qwen3_threads")


def _requests(checkpoint):
    builder = checkpoint.prompt_builder()
    out = []
    for i, (text, speaker) in enumerate(zip(TEXTS, SPEAKERS)):
        prompt = builder.build(text, speaker=speaker, language=LANGUAGES[i % 3], non_streaming_mode=bool(i % 2))
        params = SamplingParams.greedy(max_new_tokens=10 + 2 * i, repetition_penalty=1.05 + 0.1 * (i % 3))
        out.append((f"r{i}", prompt, params))
    return out


@pytest.mark.parametrize("fixture", ["qwen3_tiny_cv", "qwen3_tiny2_cv"])
def test_batched_equals_solo(fixture, qwen3_loaded, request):
    checkpoint = qwen3_loaded(request.getfixturevalue(fixture))
    requests = _requests(checkpoint)
    solo_engine = create_engine(checkpoint, max_num_seqs=1, max_model_len=128, num_threads=1)
    solo = {}
    for req in requests:
        solo.update(solo_engine.generate([req]))

    engine = create_engine(checkpoint, max_num_seqs=8, max_model_len=128, num_threads=1, max_prefills_per_step=2)
    batched: dict[str, list] = {}
    pending, step, widest = list(requests), 0, 0
    while pending or engine.has_unfinished():
        if pending and step % 2 == 0:
            engine.add_request(*pending.pop(0))
        for event in engine.step():
            if event.codes is not None:
                batched.setdefault(event.request_id, []).append(event.codes)
        widest = max(widest, engine.num_running)
        step += 1
    assert widest >= 5  # the requests really overlapped
    for rid, codes in solo.items():
        assert 2 <= len(codes) <= 9 + 2 * int(rid[1:])  # max_new_tokens - 1 frames, or an earlier eos
        assert batched[rid] == codes, rid
