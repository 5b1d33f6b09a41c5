"""The compiled static frame step (talker stage option ``compile``, compiled_step.py) on CPU.

* Dynamo traces the whole step (``fullgraph``) and its greedy codes equal the eager static step's
  with 1, 2 and 3 prompts of different lengths (batch buckets 1, 2 and 4: 3 rows padded to 4, as
  requests join and finish), and with sampling rows beside a greedy one; checked with ``backend="aot_eager"`` (dynamo's graph and AOT autograd's decompositions,
  no codegen), which compiles a variant in seconds on a CPU.
* The inductor build (what the deploy option runs, C++ kernels here) on one bucket: the same
  greedy codes, and the talker's hidden state and codebook-0 logits after the last frame within a
  float32 tolerance of the eager step's (with a cold inductor cache a variant of the tiny model
  compiles in about 1.5 min on a busy 2-core CPU, so only one bucket runs here; inductor's
  on-disk cache makes reruns take seconds).
* The deploy option is validated by the builder (a bad value names the field) and ``compile``
  without the static step is refused.
"""
from __future__ import annotations

import pytest
import torch

from omni_backend.deploy import DeployError, check_options, parse_deploy
from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_tts.compiled_step import COMPILE_MODES, compile_static_step
from omni_backend.models.qwen3_tts.runner import create_engine

TEXTS = ["Hello world, this is a streaming test.", "你好，世界。", "Short.", "How are you?"]
SPEAKERS = ["ryan", "eric", "vivian", "aiden"]
# float32: inductor's fused kernels reorder sums, so not bit-exact; measured on the tiny model:
# hidden max |diff| 2.4e-7, codebook-0 logits 4.8e-7
ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("qwen3_threads")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _requests(checkpoint, params, n):
    builder = checkpoint.prompt_builder()
    return [(f"r{i}", builder.build(TEXTS[i], speaker=SPEAKERS[i]), params(i)) for i in range(n)]


def _engine(checkpoint, sizes, backend=None, **options):
    engine = create_engine(checkpoint, max_num_seqs=max(sizes), max_model_len=128, static_step=True,
                           cuda_graph_sizes=sizes, **options)
    if backend is not None:   # the runner compiles with inductor; a check may ask for another backend
        runner = engine.runner
        runner.graphs.step = compile_static_step(runner.static, "default", 64, backend=backend)
    return engine


@pytest.mark.parametrize("n", [1, 2, 3])
def test_aot_eager_compiled_step_greedy_codes_equal_eager(n, qwen3_tiny_cv, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    greedy = lambda i: SamplingParams.greedy(max_new_tokens=8 + 3 * i)  # noqa: E731
    want = _engine(checkpoint, [1, 2, 4]).generate(_requests(checkpoint, greedy, n))
    compiled = _engine(checkpoint, [1, 2, 4], backend="aot_eager")
    got = compiled.generate(_requests(checkpoint, greedy, n))
    assert got == want
    assert {k: len(v) for k, v in got.items()} == {f"r{i}": 7 + 3 * i for i in range(n)}


def test_aot_eager_compiled_step_sampling_equals_eager(qwen3_tiny_cv, qwen3_loaded):
    """Sampling rows (the counter RNG and the top-k / top-p warp inside the step) beside a greedy one."""
    checkpoint = qwen3_loaded(qwen3_tiny_cv)

    def params(i):
        return (SamplingParams.greedy(max_new_tokens=10) if i == 0
                else SamplingParams(max_new_tokens=10, seed=100 + i, top_k=20, top_p=0.9))

    want = _engine(checkpoint, [4]).generate(_requests(checkpoint, params, 3))
    got = _engine(checkpoint, [4], backend="aot_eager").generate(_requests(checkpoint, params, 3))
    assert got == want
    assert got["r1"] != got["r2"]


def test_inductor_compiled_step_matches_eager(qwen3_tiny_cv, qwen3_loaded):
    """What ``compile: default`` runs: greedy codes equal, float state within ATOL."""
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    greedy = lambda i: SamplingParams.greedy(max_new_tokens=12)  # noqa: E731
    eager = _engine(checkpoint, [2])
    want = eager.generate(_requests(checkpoint, greedy, 2))
    compiled = _engine(checkpoint, [2], compile_mode="default")
    assert hasattr(compiled.runner.graphs.step, "_torchdynamo_orig_callable")   # the compiled step runs
    got = compiled.generate(_requests(checkpoint, greedy, 2))
    assert got == want and all(len(v) == 11 for v in got.values())
    hidden_eager, hidden = eager.runner.static.hidden[:2], compiled.runner.static.hidden[:2]
    head = checkpoint.talker.codec_head.weight
    diff = (hidden - hidden_eager).abs().max().item()
    logits_diff = (hidden @ head.T - hidden_eager @ head.T).abs().max().item()
    print(f"inductor vs eager: hidden max |diff| {diff:.3g}, logits max |diff| {logits_diff:.3g}")
    assert diff <= ATOL and logits_diff <= ATOL
    assert hidden.abs().max().item() > 0   # a step ran


@pytest.mark.parametrize("value", ["reduce-overhead", "fast", True, 1])
def test_compile_option_is_checked(value):
    from omni_backend.families import get_pipeline

    stages = [{"stage_id": 0, "options": {"compile": value}}]
    cfg = parse_deploy({"pipeline": "qwen3_tts_tiny_random", "stages": stages}, "deploy/x.yaml")
    with pytest.raises(DeployError) as e:
        check_options(cfg, get_pipeline("qwen3_tts_tiny_random"))
    assert str(e.value).startswith("deploy/x.yaml: stages[0].options.compile:"), str(e.value)


def test_compile_option_values():
    from omni_backend.families import get_pipeline

    pipeline = get_pipeline("qwen3_tts_tiny_random")
    for mode in COMPILE_MODES:
        cfg = parse_deploy({"pipeline": pipeline.name, "stages": [{"stage_id": 0, "options": {"compile": mode}}]})
        assert check_options(cfg, pipeline).stage(0).options["compile"] == mode
    cfg = check_options(parse_deploy({"pipeline": pipeline.name, "stages": [{"stage_id": 0}]}), pipeline)
    assert cfg.stage(0).options["compile"] == "none"


def test_compile_needs_the_static_step(qwen3_tiny_cv, qwen3_loaded):
    checkpoint = qwen3_loaded(qwen3_tiny_cv)
    with pytest.raises(ValueError, match="static_step"):
        create_engine(checkpoint, max_num_seqs=1, max_model_len=64, static_step=False, compile_mode="default")
    with pytest.raises(ValueError, match="compile mode"):
        compile_static_step(create_engine(checkpoint, max_num_seqs=1, max_model_len=64,
                                          static_step=True).runner.static, "reduce-overhead", 1)
    # compile without an explicit static_step turns the static step on (CPU default: the exact step)
    assert create_engine(checkpoint, max_num_seqs=1, max_model_len=64).runner.static is None
    compiled = create_engine(checkpoint, max_num_seqs=1, max_model_len=64, compile_mode="default").runner
    assert compiled.static is not None and hasattr(compiled.graphs.step, "_torchdynamo_orig_callable")


def test_compile_switches_an_ascii_locale_to_utf8():
    """Triton's Python stub runs under the C locale without Python's UTF-8 mode: open()'s default
    encoding is ASCII there, and inductor's first compile failed reading its templates."""
    import os
    import subprocess
    import sys

    code = ("import locale; print(locale.getpreferredencoding(False)); "
            "from omni_backend.models.qwen3_tts.compiled_step import ensure_utf8_locale; ensure_utf8_locale(); "
            "print(locale.getpreferredencoding(False)); import torch._inductor.kernel.mm_grouped")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_") and k != "LANG"}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "LC_ALL": "C", "PYTHONUTF8": "0"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.split()
    assert before.lower() in ("ansi_x3.4-1968", "ascii") and after.lower().replace("-", "") == "utf8"
