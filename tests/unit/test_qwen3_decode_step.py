"""The decode strategies (:mod:`omni_backend.models.qwen3_tts.decode`, written once).

* The decode's fused projections (q | k | v, gate | up) give the same bits as the separate ones
  that prefill and the reference use, at 1 and 2 positions per row and batches 1 and 3.
* :class:`BatchInvariantExactStep` (the CPU engine's step): every row of a batch equals that row
  decoded alone (talker decode, every code-predictor step, the cache contents); its traced greedy
  frame gives the codes of a step that never traces, at batch 1 and row by row at batch 2, and a
  replay that differs is dropped.
* :class:`GraphSafeStaticStep` (the CUDA-graph step), run eagerly on CPU through the engine:
  greedy runs, stops at eos, sampling is reproducible per seed and independent of the batch, and
  padding rows up to a bucket do not change the real rows.
* :class:`GraphBuckets` bucket arithmetic and its eager (``enforce_eager``) mode, without CUDA.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from omni_backend.engine import SamplingParams
from omni_backend.engine.cuda_graphs import GraphBuckets, bucket_sizes
from omni_backend.models.qwen3_tts.decode import Qwen3Decode, signed_sin
from omni_backend.models.qwen3_tts.exact_step import BatchInvariantExact, BatchInvariantExactStep, BatchInvariantOps
from omni_backend.models.qwen3_tts.runner import create_engine
from omni_backend.models.qwen3_tts.sampling_params import Qwen3SamplingParams

from tests.qwen3_fixtures import QWEN3_EOS_AFTER

TEXTS = ["Hello world, this is a streaming test.", "你好，世界。", "Short.", "How are you?"]
SPEAKERS = ["ryan", "eric", "vivian", "aiden"]


pytestmark = pytest.mark.usefixtures("qwen3_threads")


def _fill(cache, generator):
    for t in cache.keys + cache.values:
        t.normal_(generator=generator)


def _decode(checkpoint) -> Qwen3Decode:
    cp = checkpoint.talker.code_predictor
    return Qwen3Decode(checkpoint.talker, cp.new_rotary(torch.float32, "cpu"))


@pytest.mark.parametrize("fixture", ["qwen3_tiny_cv", "qwen3_tiny2_cv"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("positions", [1, 2])
def test_fused_projections_equal_separate(fixture, batch, positions, qwen3_loaded, request):
    checkpoint = qwen3_loaded(request.getfixturevalue(fixture))
    decode = _decode(checkpoint)
    num = BatchInvariantExact(BatchInvariantOps())
    g = torch.Generator().manual_seed(5)

    def attend(index, q, k, v, scale):
        return num.attention(q, k, v, positions > 1, scale)

    with torch.inference_mode():
        rotary = checkpoint.talker.new_rotary(torch.float32, "cpu")
        cos, sin = rotary.prefill(positions)
        stacks = [(decode.talker_layers, cos, signed_sin(sin), checkpoint.talker.config.hidden_size)]
        cos, sin = decode.cp_tables[0]
        stacks.append((decode.cp_layers, cos[..., :positions, :], sin[..., :positions, :],
                       checkpoint.talker.code_predictor.config.hidden_size))
        for layers, cos, sin, hidden in stacks:
            for index, w in enumerate(layers):
                assert w.wqkv is not None
                x = torch.randn(batch, positions, hidden, generator=g)
                fused = decode.layer(num, index, w, x, cos, sin, attend, fused=True)
                assert torch.equal(fused, decode.layer(num, index, w, x, cos, sin, attend, fused=False)), index


@pytest.mark.parametrize("fixture", ["qwen3_tiny_cv", "qwen3_tiny2_cv"])
def test_exact_step_rows_equal_rows_alone(fixture, qwen3_loaded, request):
    checkpoint = qwen3_loaded(request.getfixturevalue(fixture))
    talker = checkpoint.talker
    cp = talker.code_predictor
    step = BatchInvariantExactStep(_decode(checkpoint), BatchInvariantOps(), trace=False)
    g = torch.Generator().manual_seed(7)
    hidden = talker.config.hidden_size
    slots, positions = [3, 0, 2], [17, 40, 5]
    with torch.inference_mode():
        rotary = talker.new_rotary(torch.float32, "cpu")
        caches = [talker.new_cache(4, 64, torch.float32, "cpu") for _ in range(2)]
        _fill(caches[0], g)
        for a, b in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
            b.copy_(a)
        embeds = torch.randn(3, 1, hidden, generator=g)
        logits, states = step.talker_decode(embeds, caches[0], slots, positions, rotary)
        for b in range(3):
            alone = step.talker_decode(embeds[b:b + 1], caches[1], slots[b:b + 1], positions[b:b + 1], rotary)
            assert torch.equal(logits[b:b + 1], alone[0]) and torch.equal(states[b:b + 1], alone[1]), b
        assert all(torch.equal(a, b) for a, b in zip(caches[0].keys + caches[0].values,
                                                    caches[1].keys + caches[1].values))

        past, cb0 = torch.randn(3, 1, hidden, generator=g), torch.randn(3, 1, hidden, generator=g)
        batch_cache = cp.new_cache(3, torch.float32, "cpu")
        row_caches = [cp.new_cache(1, torch.float32, "cpu") for _ in range(3)]
        embeds = torch.cat((past, cb0), dim=1)   # step 0: the 2-token prefill
        for s in range(cp.num_steps):
            logits = step.decode.code_predictor_logits(step.numerics, s, embeds, batch_cache)
            for b in range(3):
                alone = step.decode.code_predictor_logits(step.numerics, s, embeds[b:b + 1], row_caches[b])
                assert torch.equal(logits[b:b + 1], alone), (s, b)
            if s + 1 < cp.num_steps:   # the next step embeds the codebook this one predicted
                embeds = F.embedding(torch.argmax(logits, dim=-1).view(-1, 1), step.decode.cp_embeddings[s])


@pytest.mark.parametrize("batch", [1, 2])
def test_traced_greedy_frame_equals_eager(batch, qwen3_tiny2_cv, qwen3_loaded):
    """Codes of the traced greedy frame (recorded at batch 1) against a step that never traces:
    at batch 1 frame by frame; at batch 2, which runs eagerly, each row against the traced frame
    of that row alone. A replay that differs from its own eager check warns and is dropped:
    warnings are errors here, and the recording must still be in use at the end."""
    checkpoint = qwen3_loaded(qwen3_tiny2_cv)
    cp = checkpoint.talker.code_predictor
    decode = _decode(checkpoint)
    traced = BatchInvariantExactStep(decode, BatchInvariantOps(), trace=True)
    eager = BatchInvariantExactStep(decode, BatchInvariantOps(), trace=False)
    hidden = checkpoint.talker.config.hidden_size
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")
        traced_cache, eager_cache = cp.new_cache(1, torch.float32, "cpu"), cp.new_cache(2, torch.float32, "cpu")
        for frame in range(6):  # recording, 3 replays checked against eager inside the step, plain replays
            past = torch.randn(batch, 1, hidden, generator=g)
            cb0 = torch.randn(batch, 1, hidden, generator=g)
            want = eager.greedy_codes(past, cb0, eager_cache)
            got = torch.cat([traced.greedy_codes(past[b:b + 1], cb0[b:b + 1], traced_cache) for b in range(batch)])
            assert torch.equal(got, want), frame
    assert traced.traced_frames() == [(1, torch.get_num_threads(), id(traced_cache))]
    assert eager.traced_frames() == []


def test_a_traced_frame_that_differs_is_dropped(qwen3_tiny_cv, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    cp = checkpoint.talker.code_predictor
    step = BatchInvariantExactStep(_decode(checkpoint), BatchInvariantOps(), trace=True)
    hidden = checkpoint.talker.config.hidden_size
    g = torch.Generator().manual_seed(4)
    past, cb0 = torch.randn(1, 1, hidden, generator=g), torch.randn(1, 1, hidden, generator=g)
    with torch.inference_mode():
        cache = cp.new_cache(1, torch.float32, "cpu")
        want = step.greedy_codes(past, cb0, cache)  # eager, and recorded
        [key] = step.traced_frames()
        step._traced[key] = lambda h, e: torch.zeros_like(want)
        with pytest.warns(UserWarning, match="differs from eager"):
            assert torch.equal(step.greedy_codes(past, cb0, cache), want)
    assert step.traced_frames() == [] and not torch.equal(want, torch.zeros_like(want))


def _requests(checkpoint, params, n=4):
    builder = checkpoint.prompt_builder()
    return [(f"r{i}", builder.build(TEXTS[i], speaker=SPEAKERS[i]), params(i)) for i in range(n)]


def test_static_step_greedy_on_cpu(qwen3_tiny_cv, qwen3_loaded):
    """Not the reference-exact path (masked attention over a length bucket), but on the tiny
    model its greedy codes agree with it; the frame counts follow max_new_tokens."""
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    greedy = lambda i: SamplingParams.greedy(max_new_tokens=8 + i)  # noqa: E731
    exact = create_engine(checkpoint, max_num_seqs=4, max_model_len=128).generate(_requests(checkpoint, greedy))
    static = create_engine(checkpoint, max_num_seqs=4, max_model_len=128, static_step=True,
                           cuda_graph_sizes=[1, 2, 4])
    assert static.runner.graphs is not None and not static.runner.graphs.enabled  # CPU: never graphs
    got = static.generate(_requests(checkpoint, greedy))
    assert {k: len(v) for k, v in got.items()} == {f"r{i}": 7 + i for i in range(4)}
    assert got == exact


def test_static_step_attends_over_length_buckets(qwen3_tiny_cv, qwen3_loaded, monkeypatch):
    """The step attends over the shortest captured length holding the batch's furthest position:
    as requests grow they move through the buckets, and the codes stay those of the exact path."""
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    greedy = lambda i: SamplingParams.greedy(max_new_tokens=40 + 7 * i)  # noqa: E731
    exact = create_engine(checkpoint, max_num_seqs=4, max_model_len=128).generate(_requests(checkpoint, greedy))
    static = create_engine(checkpoint, max_num_seqs=4, max_model_len=128, static_step=True, cuda_graph_sizes=[1, 4],
                           shortest_attention=16)
    assert static.runner.lengths == [16, 32, 64, 128]
    used, run = [], static.runner.graphs.run

    def checked_run(rows, sample, length):
        assert int(static.runner.static.position[:rows].max()) < length  # the new key is attended
        used.append(length)
        return run(rows, sample, length)

    monkeypatch.setattr(static.runner.graphs, "run", checked_run)
    got = static.generate(_requests(checkpoint, greedy))
    assert got == exact
    assert used == sorted(used) and {32, 64, 128} <= set(used)  # never shorter than a row's position


@pytest.mark.parametrize("fixture", ["qwen3_tiny_cv", "qwen3_tiny2_cv"])
def test_joint_prefill_on_cpu(fixture, qwen3_loaded, request, monkeypatch):
    """Requests admitted in one step are prefilled as one right-padded forward on the static path
    and in the CPU throughput mode (prompts of different lengths); on the tiny models greedy codes
    still agree with the exact one-by-one path, which never prefills jointly."""
    checkpoint = qwen3_loaded(request.getfixturevalue(fixture))
    greedy = lambda i: SamplingParams.greedy(max_new_tokens=10)  # noqa: E731
    requests = _requests(checkpoint, greedy)
    assert len({p.prefill_length for _, p, _ in requests}) > 1
    calls = []
    joint = BatchInvariantExactStep.prefill_rows
    monkeypatch.setattr(BatchInvariantExactStep, "prefill_rows", lambda self, prompts, *a: calls.append(len(prompts))
                        or joint(self, prompts, *a))
    want = create_engine(checkpoint, max_num_seqs=4, max_model_len=128, max_prefills_per_step=4).generate(requests)
    assert calls == []
    for options in (dict(static_step=True, cuda_graph_sizes=[1, 2, 4]), dict(batch_invariant=False)):
        engine = create_engine(checkpoint, max_num_seqs=4, max_model_len=128, max_prefills_per_step=4, **options)
        assert engine.generate(requests) == want, options
    assert calls == [4, 4]


def test_static_step_stops_at_eos(qwen3_tiny_eos, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_eos)
    engine = create_engine(checkpoint, max_num_seqs=2, max_model_len=128, static_step=True)
    frames = engine.generate(_requests(checkpoint, lambda i: SamplingParams.greedy(max_new_tokens=50), n=2))
    assert [len(v) for v in frames.values()] == [QWEN3_EOS_AFTER, QWEN3_EOS_AFTER]


def test_static_step_sampling_per_request(qwen3_tiny_cv, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    sampled = lambda i: SamplingParams(max_new_tokens=12, seed=100 + i, top_k=20, top_p=0.9)  # noqa: E731

    def run(n):
        engine = create_engine(checkpoint, max_num_seqs=4, max_model_len=128, static_step=True,
                               cuda_graph_sizes=[1, 2, 4])
        return engine.generate(_requests(checkpoint, sampled, n=n))

    batched = run(3)   # 3 rows run in the bucket of 4 (one padding row)
    assert batched == run(3)
    solo = run(1)
    assert solo["r0"] == batched["r0"]
    assert batched["r0"] != batched["r1"]
    assert all(0 <= c < 2048 for frames in batched.values() for frame in frames for c in frame[1:])


def test_graph_buckets_without_cuda():
    assert bucket_sizes([1, 2, 4, 8, 16, 32], 12) == [1, 2, 4, 8, 12]
    assert bucket_sizes([], 3) == [3]
    assert bucket_sizes([1, 2, 4, 8, 16], 64) == [1, 2, 4, 8, 16, 32, 64]
    assert bucket_sizes([1, 4], 20) == [1, 4, 8, 16, 20]
    calls = []
    buckets = GraphBuckets(lambda size, flag: calls.append((size, flag)), [1, 4, 8], 8, variants=((False,), (True,)),
                           enabled=False)
    buckets.capture()  # disabled: nothing captured, no CUDA touched
    assert buckets.graphs == {} and calls == []
    assert buckets.run(3, True) == 4 and buckets.run(1, False) == 1 and buckets.run(8, False) == 8
    assert calls == [(4, True), (1, False), (8, False)]
    with pytest.raises(ValueError):
        buckets.run(9, False)


def test_code2wav_graphs_fall_back_to_eager_on_cpu(qwen3_tiny_cv):
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav, Code2WavGraphs

    decoder = Code2Wav.from_checkpoint(qwen3_tiny_cv / "speech_tokenizer")
    graphs = Code2WavGraphs(decoder, windows=((2, 0), (6, 4)), batch_sizes=(1, 4))
    assert not graphs.enabled
    graphs.capture()  # CPU: nothing captured, no CUDA touched
    assert graphs.graphs == {}
    codes = torch.randint(0, 2048, (3, 16, 6), generator=torch.Generator().manual_seed(0))
    assert torch.equal(graphs.decode_window(codes, 4), decoder.decode_window(codes, 4))


def test_captured_window_decoder_is_the_eager_one_where_nothing_is_captured(qwen3_tiny_cv, monkeypatch):
    """What the code2wav stage and a talker that decodes use: on CPU it decodes as the eager decoder;
    a capture that fails leaves the eager decoder itself (served eagerly, not refused)."""
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav, Code2WavGraphs, captured_window_decoder

    decoder = Code2Wav.from_checkpoint(qwen3_tiny_cv / "speech_tokenizer")
    codes = torch.randint(0, 2048, (1, 16, 6), generator=torch.Generator().manual_seed(1))
    decode = captured_window_decoder(decoder, ((2, 0), (6, 4)), (1,))
    assert torch.equal(decode(codes, 4), decoder.decode_window(codes, 4))

    def fails(self):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(Code2WavGraphs, "capture", fails)
    assert captured_window_decoder(decoder, ((2, 0),), (1,)) == decoder.decode_window


@pytest.mark.parametrize("warp", [dict(top_k=1), dict(top_k=0, top_p=1e-6), dict(top_k=1, temperature=0.5)])
def test_static_step_sampling_that_keeps_one_token_is_greedy(warp, qwen3_tiny_cv, qwen3_loaded):
    """The in-step sampler's warps: top-k 1, or a top-p below the largest probability, leave only the argmax."""
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    sub = Qwen3SamplingParams(**{f"subtalker_{k}": v for k, v in warp.items()})
    sampled = lambda i: SamplingParams(max_new_tokens=8, seed=i, repetition_penalty=1.05, extra=sub, **warp)  # noqa: E731
    greedy = lambda i: SamplingParams.greedy(max_new_tokens=8, repetition_penalty=1.05)  # noqa: E731
    engine = create_engine(checkpoint, max_num_seqs=2, max_model_len=64, static_step=True)
    want = engine.generate(_requests(checkpoint, greedy, n=2))
    assert engine.generate(_requests(checkpoint, sampled, n=2)) == want


def test_cpu_engines_never_touch_cuda(qwen3_tiny_cv, qwen3_loaded, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("CUDA touched on a CPU engine")

    for name in ("CUDAGraph", "graph", "graph_pool_handle", "Stream", "synchronize", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    greedy = lambda i: SamplingParams.greedy(max_new_tokens=4)  # noqa: E731
    for static in (None, True):
        engine = create_engine(checkpoint, max_num_seqs=2, max_model_len=64, static_step=static,
                               cuda_graph_sizes=[1, 2])
        assert len(engine.generate(_requests(checkpoint, greedy, n=2))) == 2
