"""Qwen3-TTS AR engine benchmark on CPU: linear-layer floor vs our engine vs the reference.

    .venv/bin/python perf/engine_bench.py --size tiny [--threads 1] [--frames 40] [--no-reference]

For a random checkpoint of ``--size`` (or ``--checkpoint DIR``) it prints:

* the linear-layer floor of one frame step: every matmul of one talker decode plus the code
  predictor's 15 steps (2-token prefill, 14 single tokens), at batch 1 and 8, timed alone
  (``F.linear``; and as the batch-invariant ``bmm`` the engine uses);
* our engine: ms per frame with one request (c=1) and ms per step with 8 concurrent requests
  (c=8, each step makes 8 frames), greedy, prefill excluded;
* the reference ``generate()`` ms per frame (prefill included, through the public wrapper, in
  ``.venv-oracle``) on the same checkpoint.

Timings are medians; on a shared machine use ``--threads 1`` (OpenMP threads that wait on a busy
core slow everything down by an order of magnitude).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F


from benchkit.paths import ROOT, venv_python
from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_tts.checkpoint import load_checkpoint
from omni_backend.models.qwen3_tts.exact_step import BatchInvariantOps
from omni_backend.models.qwen3_tts.random_checkpoint import write_random_checkpoint
from omni_backend.models.qwen3_tts.runner import create_engine

TEXTS = ["Hello world, this is a benchmark of the streaming engine.", "你好，世界。今天天气很好。",
         "The quick brown fox jumps over the lazy dog.", "How are you doing today?",
         "Numbers 1 2 3 and symbols.", "Bonjour tout le monde.", "A much longer sentence with many more tokens.",
         "Short one."]
SPEAKERS = ["ryan", "eric", "vivian", "aiden", "sohee", "serena", "dylan", "uncle_fu"]


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def linear_floor_ms(talker, batch: int, repeats: int, batch_invariant: bool) -> float:
    """All matmuls of one frame step for ``batch`` rows."""
    ops = BatchInvariantOps(enabled=True)
    linear = ops.linear if batch_invariant else F.linear
    cp = talker.code_predictor
    t_hidden = talker.config.hidden_size
    c_hidden = cp.config.hidden_size
    dtype = talker.codec_head.weight.dtype
    x_t = torch.randn(batch, 1, t_hidden, dtype=dtype)
    x_c1 = torch.randn(batch, 1, c_hidden, dtype=dtype)
    x_c2 = torch.randn(batch, 2, c_hidden, dtype=dtype)
    x_p2 = torch.randn(batch, 2, t_hidden, dtype=dtype)
    x_p1 = torch.randn(batch, 1, t_hidden, dtype=dtype)

    def layer_mats(layer, x):
        a, m = layer.self_attn, layer.mlp
        linear(x, a.q_proj.weight)
        linear(x, a.k_proj.weight)
        linear(x, a.v_proj.weight)
        attn = torch.empty(x.shape[0], x.shape[1], a.o_proj.weight.shape[1], dtype=dtype)
        linear(attn, a.o_proj.weight)
        linear(x, m.gate_proj.weight)
        linear(x, m.up_proj.weight)
        inter = torch.empty(x.shape[0], x.shape[1], m.down_proj.weight.shape[1], dtype=dtype)
        linear(inter, m.down_proj.weight)

    def step():
        with torch.inference_mode():
            for layer in talker.model.layers:
                layer_mats(layer, x_t)
            linear(x_t, talker.codec_head.weight)
            proj = cp.small_to_mtp_projection
            for i in range(cp.num_steps):
                x = x_c2 if i == 0 else x_c1
                if proj is not None:
                    linear(x_p2 if i == 0 else x_p1, proj.weight, proj.bias)
                for layer in cp.model.layers:
                    layer_mats(layer, x)
                linear(x, cp.lm_head[i].weight)

    return _median_ms(step, repeats)


def engine_ms(checkpoint, concurrency: int, frames: int, threads: int, batch_invariant: bool) -> float:
    """Median ms per decode step with ``concurrency`` requests running (prefill steps excluded)."""
    engine = create_engine(checkpoint, max_num_seqs=max(concurrency, 1), max_model_len=frames + 128,
                           num_threads=threads, max_prefills_per_step=concurrency, batch_invariant=batch_invariant)
    builder = checkpoint.prompt_builder()
    speakers = SPEAKERS if checkpoint.config.tts_model_type == "custom_voice" else [None] * len(SPEAKERS)
    instruct = None if checkpoint.config.tts_model_type == "custom_voice" else "A calm voice."

    def run(n_frames: int) -> list[float]:
        for i in range(concurrency):
            prompt = builder.build(TEXTS[i % len(TEXTS)], speaker=speakers[i % len(speakers)], instruct=instruct)
            engine.add_request(f"r{i}-{n_frames}", prompt, SamplingParams.greedy(max_new_tokens=n_frames + 1,
                                                                                  repetition_penalty=1.05))
        engine.step()  # prefills (+ first frames)
        times = []
        while engine.has_unfinished():
            started = time.perf_counter()
            events = engine.step()
            elapsed = time.perf_counter() - started
            if len(events) == concurrency and not any(e.finished for e in events):
                times.append(elapsed)
        return times

    run(4)  # warm-up: rotary tables, batch-invariance probes
    times = run(frames)
    return statistics.median(times) * 1000 if times else float("nan")


def reference_ms_per_frame(checkpoint_dir: str, frames: int, threads: int) -> float:
    oracle = venv_python(".venv-oracle")
    if not oracle.exists():
        return float("nan")
    config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    custom = config["tts_model_type"] == "custom_voice"
    prompts = []
    for i in range(3):
        prompt = {"id": f"p{i}", "text": TEXTS[i], "max_new_tokens": frames + 1, "greedy": True}
        prompt.update({"speaker": SPEAKERS[i]} if custom else {"instruct": "A calm voice."})
        prompts.append(prompt)
    with tempfile.TemporaryDirectory() as work:
        prompts_path = Path(work) / "prompts.json"
        prompts_path.write_text(json.dumps(prompts, ensure_ascii=False))
        out = Path(work) / "out.npz"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        subprocess.run([str(oracle), str(ROOT / "tests" / "oracle" / "qwen3_tts_reference.py"), "--checkpoint",
                        checkpoint_dir, "--prompts", str(prompts_path), "--out", str(out), "--threads", str(threads)],
                       check=True, capture_output=True, env=env)
        import numpy as np

        with np.load(out) as data:
            meta = json.loads(str(data["meta"]))
            per_frame = [meta[f"seconds/p{i}"] / data[f"codes/p{i}"].shape[0] for i in range(1, 3)]
    return statistics.median(per_frame) * 1000  # p0 warms up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", help="random checkpoint size (tiny, tiny2, small, 0.6b, 1.7b)")
    parser.add_argument("--checkpoint", help="use this checkpoint folder instead of a random one")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as work:
        checkpoint_dir = args.checkpoint or write_random_checkpoint(os.path.join(work, args.size), args.size,
                                                                    "custom_voice", seed=0)
        checkpoint = load_checkpoint(checkpoint_dir)
        talker = checkpoint.talker
        params = sum(p.numel() for p in talker.parameters())
        rows = []
        for batch in (1, 8):
            rows.append((f"linear floor, batch {batch} (F.linear)", linear_floor_ms(talker, batch, args.repeats, False)))
            rows.append((f"linear floor, batch {batch} (batch-invariant bmm)",
                         linear_floor_ms(talker, batch, args.repeats, True)))
        rows.append(("engine c=1, ms/frame", engine_ms(checkpoint, 1, args.frames, args.threads, True)))
        rows.append(("engine c=8, ms/step (8 frames)", engine_ms(checkpoint, 8, args.frames, args.threads, True)))
        rows.append(("engine c=8, ms/step, batch_invariant=False",
                     engine_ms(checkpoint, 8, args.frames, args.threads, False)))
        if not args.no_reference:
            rows.append(("reference generate(), ms/frame", reference_ms_per_frame(checkpoint_dir, args.frames,
                                                                                   args.threads)))
    c = checkpoint.config.talker
    print(f"\nQwen3-TTS {args.size}: talker {c.hidden_size}x{c.num_hidden_layers}, code predictor "
          f"{c.code_predictor.hidden_size}x{c.code_predictor.num_hidden_layers}, {params / 1e6:.1f}M params, "
          f"threads={args.threads}, frames={args.frames}")
    width = max(len(name) for name, _ in rows)
    print(f"{'measure'.ljust(width)} | ms")
    print(f"{'-' * width}-+--------")
    for name, value in rows:
        print(f"{name.ljust(width)} | {value:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
