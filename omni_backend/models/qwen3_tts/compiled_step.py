"""``torch.compile`` of the graph-safe static frame step (the talker stage's deploy option ``compile``).

The whole frame, :meth:`~.static_step.GraphSafeStaticStep.run` (the code predictor's prefill and
14 steps with in-step token selection, the talker's decode, the codebook-0 processors), is one
function over static buffers with no host sync, so dynamo traces it whole (``fullgraph``: a graph
break would be a host round trip, and is an error instead) and inductor fuses it: norms, rotary,
activations and the selection math become a few kernels instead of hundreds of small ones.

Modes (:data:`COMPILE_MODES`): ``none``; ``default`` (inductor's default); ``max-autotune-no-cudagraphs``
(autotuned matmuls / kernels, longer compile). inductor's ``reduce-overhead`` is not offered: on a
GPU the engine already captures the step in its own CUDA graphs per (batch bucket, variant)
(:class:`~omni_backend.engine.cuda_graphs.GraphBuckets`), and the compiled step is what those graphs
capture: the warm-up runs before each capture compile it, replays then skip dynamo's guards and
Python entirely. Without graphs (CPU, ``enforce_eager``) every step calls the compiled function.

Each (batch bucket, sample, attention length) the engine runs is a separate specialisation
(``dynamic=False``: static shapes, as the graphs have), so the recompile limit is raised to the
number of variants the engine declares. The compiled step is not bit-identical to the eager one
(fusion reorders float sums); greedy codes agree on the test checkpoints and the hidden state stays
within a float32 tolerance (tests/unit/test_qwen3_compiled_step.py).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .family import COMPILE_MODES
from .static_step import GraphSafeStaticStep

__all__ = ["COMPILE_MODES", "compile_static_step", "ensure_utf8_locale"]

_UTF8_LOCALES = ("C.UTF-8", "C.utf8", "en_US.UTF-8")

StepFunction = Callable[[int, bool, Optional[int]], None]


def compile_static_step(step: GraphSafeStaticStep, mode: str, variants: int,
                        backend: str = "inductor") -> StepFunction:
    """``step.run`` compiled with ``mode`` (one of :data:`COMPILE_MODES` but ``none``), allowed
    ``variants`` specialisations (the engine's buckets x variants) before dynamo gives up
    recompiling. ``backend`` other than inductor is for checks only (``aot_eager``: dynamo's
    trace without inductor's codegen)."""
    if mode not in COMPILE_MODES or mode == "none":
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES[1:])}, got {mode!r}")
    ensure_utf8_locale()
    import torch._dynamo.config as dynamo_config

    # a process-wide limit: raise it, never lower what another compiled model needs
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, int(variants))
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 4 * int(variants))
    options = {} if mode == "default" else {"mode": mode}
    if backend != "inductor":
        options = {}
    return torch.compile(step.run, backend=backend, fullgraph=True, dynamic=False, **options)


def ensure_utf8_locale() -> None:
    """Make ``open()``'s default encoding UTF-8 in this process. inductor reads its kernel
    templates with it; Triton's Python stub runs embedded, without Python's C-locale coercion or
    UTF-8 mode, so under a C / POSIX locale that encoding is ASCII and the first compile fails with
    a UnicodeDecodeError. Switches LC_CTYPE (the process's character set only) when needed."""
    import locale

    if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
        return
    for name in _UTF8_LOCALES:
        try:
            locale.setlocale(locale.LC_CTYPE, name)
            return
        except locale.Error:
            continue
    raise RuntimeError(f"torch.compile needs a UTF-8 locale and none of {', '.join(_UTF8_LOCALES)} exists "
                       "(set LANG to a UTF-8 locale for the server)")
