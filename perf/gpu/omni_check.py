"""GPU check of Qwen3-Omni's throughput mode (run by perf/gpu/check.sh after the Orpheus check).

    python perf/gpu/omni_check.py [--dry-run] [--results FILE] [--no-results] [--no-served]

On one NVIDIA GPU, with a random-weight model of the released 30B-A3B shape made in GPU memory
(thinker and talker bf16, code2wav Float32; no checkpoint on disk; the audio and vision encoders
are not built: text turns only), as ``deploy/qwen3_omni.gpu.yaml`` runs it (``batch_mode:
throughput``, static slot caches, CUDA graphs per batch bucket and attention length):

1. **graphs vs eager**: greedy thinker tokens and talker frames of the engines with CUDA graphs
   equal those of the same engines with ``enforce_eager`` (the same static steps, no graphs), at
   c = 1, 3 (a padded bucket) and 4;
2. **memory**: ``torch.cuda.max_memory_allocated`` with 16 conversations in both AR stages at
   ``max_model_len`` 4096 (2048 when the GPU has under 100 GB), and the static caches' share;
3. **in-process pipeline** at c = 1, 4, 16 (all requests at once; thinker and talker stepped in
   turn in one thread, the talker fed the thinker's tokens as they come, code2wav windows on the
   deploy's 2 / 25 / 325 schedule decoded in the same loop): TTFT (first text token), TTFA (first
   audio window), RTF p50, audio seconds per wall second;
4. **served** (unless ``--no-served``, and when ``tritonserver`` is on ``PATH``): perf/bench.py on the
   tiny random pipeline with the GPU deploy's stage settings (a served 30B-A3B needs its files).

``--dry-run`` runs every step on CPU with the tiny shape in float32, the static steps eagerly (the
script's logic, not GPU figures), without the served part.
"""
from __future__ import annotations

import argparse
import datetime
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from check_report import Stopped, finish, stop_on_sigterm  # noqa: E402

from omni_backend.engine import AREngine, SamplingParams  # noqa: E402

PROMPTS = ["Hello! Can you tell me a short story about a robot?", "What is the capital of France?",
           "Give me three tips for sleeping well.", "你好，请用一句话介绍一下你自己。"]
SCHEDULE = (2, 25, 325)   # the deploy's initial chunk, chunk and left context (frames)


def log(message: str) -> None:
    print(f"[omni-check] {message}", flush=True)


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0):
    """Config, thinker, talker and code2wav of ``shape`` with random weights, made on ``device``
    (weights ``randn / sqrt(fan_in)``, 1-D weights 1, biases 0.01 randn; no file)."""
    from omni_backend.models.qwen3_omni.code2wav import Code2Wav
    from omni_backend.models.qwen3_omni.config import Qwen3OmniConfig
    from omni_backend.models.qwen3_omni.moe import SparseMoeBlock
    from omni_backend.models.qwen3_omni.talker import Talker
    from omni_backend.models.qwen3_omni.thinker import Thinker
    from omni_backend.models.qwen3_omni.random_checkpoint import checkpoint_config

    config = Qwen3OmniConfig.from_dict(checkpoint_config(shape))
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        modules = [(Thinker(config.thinker), dtype), (Talker(config.talker), dtype), (Code2Wav(config.code2wav),
                                                                                     torch.float32)]
    out = []
    for module, module_dtype in modules:
        module = module.to(module_dtype).to_empty(device=device)   # allocated in its dtype, once
        with torch.no_grad():
            for name, p in module.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()), generator=generator)
                elif name.endswith("bias"):
                    p.normal_(0.0, 0.01, generator=generator)
                else:
                    p.fill_(1.0)
        module.eval().requires_grad_(False)
        for sub in module.modules():
            if isinstance(sub, SparseMoeBlock):
                sub.fuse_experts()
        out.append(module)
    thinker, talker, code2wav = out
    c = config.code2wav
    code2wav.code_offset = torch.arange(c.num_quantizers, device=device).view(1, -1, 1) * c.codebook_size
    return config, thinker, talker, code2wav


def prompt_builder(config):
    """The chat template and tokenizer of the built-in tiny checkpoint (the released token ids)
    over ``config``."""
    from omni_backend.models.qwen3_omni.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint
    from omni_backend.models.qwen3_omni.prompt import PromptBuilder

    base = load_checkpoint(resolve_checkpoint("builtin:qwen3_omni_tiny_random"), parts=())
    return PromptBuilder(config, base.tokenizer, base.chat_template, base.features)


def engines(config, thinker, talker, rows: int, max_len: int, eager: bool, static: bool | None):
    from omni_backend.models.qwen3_omni.throughput_runner import ThroughputTalkerRunner, ThroughputThinkerRunner

    sizes = [1, 2, 4, 8, 16]
    thinker_runner = ThroughputThinkerRunner(thinker, frozenset({config.im_end_token_id}), rows, max_len, config, None,
                                             graph_sizes=sizes, enforce_eager=eager, static_step=static)
    talker_runner = ThroughputTalkerRunner(talker, rows, max_len, graph_sizes=sizes, enforce_eager=eager,
                                           static_step=static)
    return (AREngine(thinker_runner, max_prefills_per_step=rows),
            AREngine(talker_runner, max_prefills_per_step=rows, max_input_wait_s=600.0))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def pipeline(config, thinker_engine, talker_engine, talker, builder, code2wav, count: int, tokens: int,
             frames: int, decode: bool = True) -> dict[str, dict]:
    """``count`` turns at once through thinker -> talker -> code2wav windows (``decode``), in one loop."""
    from omni_backend.models.qwen3_omni.prompt import TalkerInput
    from omni_backend.models.qwen3_omni.talker_runner import ThinkerAnswer
    from omni_backend.models.qwen3_omni.window_plan import plan_window

    greedy = dict(repetition_penalty=1.0, min_new_tokens=0)
    state: dict[str, dict] = {}
    t0 = time.perf_counter()
    for i in range(count):
        rid = f"r{i}"
        prompt = builder.build(messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        thinker_engine.add_request(rid, prompt, SamplingParams.greedy(max_new_tokens=tokens, **greedy))
        state[rid] = {"answer": ThinkerAnswer(TalkerInput(config, thinker_engine.runner.thinker, talker, prompt,
                                                          "ethan")),
                      "pending": [], "in_talker": False, "frames": [], "ended": False, "emitted": 0, "samples": 0,
                      "ttft": None, "ttfa": None, "total": None}
    first_chunk, chunk, context = SCHEDULE
    while thinker_engine.has_unfinished() or talker_engine.has_unfinished():
        for event in thinker_engine.step():
            s = state[event.request_id]
            s["ttft"] = s["ttft"] if s["ttft"] is not None else time.perf_counter() - t0
            s["pending"] += list(event.codes or [])
            if len(s["pending"]) < 4 and not event.finished:
                continue
            ids, s["pending"] = s["pending"], []
            if s["in_talker"]:
                talker_engine.append_input(event.request_id, ids, end=event.finished)
                continue
            s["answer"].push(ids)
            if event.finished:
                s["answer"].end()
            if s["answer"].ready:
                talker_engine.add_request(event.request_id, s["answer"], SamplingParams.greedy(
                    max_new_tokens=frames + 1, repetition_penalty=1.05, min_new_tokens=0),
                    input_open=not event.finished)
                s["in_talker"] = True
        for event in talker_engine.step():
            s = state[event.request_id]
            if event.codes is not None:
                s["frames"].append(event.codes)
            s["ended"] = s["ended"] or event.finished
        for s in state.values() if decode else ():   # the windows that can be cut now
            while s["frames"] and (window := plan_window(s["emitted"], len(s["frames"]), s["ended"], first_chunk,
                                                         chunk, context)) is not None:
                start, end, lookahead = window
                codes = torch.tensor(s["frames"][start:end + lookahead], device=code2wav.code_offset.device).T
                with torch.inference_mode():
                    audio = code2wav.decode_lookahead_window(codes.unsqueeze(0), s["emitted"] - start, lookahead)
                sync()
                s["samples"] += audio.shape[-1]
                s["emitted"] = end
                s["ttfa"] = s["ttfa"] if s["ttfa"] is not None else time.perf_counter() - t0
            if s["ended"] and s["total"] is None and plan_window(s["emitted"], len(s["frames"]), True, first_chunk,
                                                                 chunk, context) is None:
                s["total"] = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    for s in state.values():
        s["total"] = s["total"] or wall
    return {"wall": wall, **state}


def percentile(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v is not None)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def parity(config, thinker, talker, builder, code2wav, static, tokens: int, frames: int, levels=(1, 3, 4)) -> str:
    graphs = engines(config, thinker, talker, 4, 512, eager=False, static=static)
    eager = engines(config, thinker, talker, 4, 512, eager=True, static=static)
    captured = sum(len(e.runner.static.buckets.graphs) for e in graphs if e.runner.static is not None)
    parts = []
    for c in levels:
        # the codes are compared; code2wav is the same fp32 module either way
        a = pipeline(config, *graphs, talker, builder, code2wav, c, tokens, frames, decode=False)
        b = pipeline(config, *eager, talker, builder, code2wav, c, tokens, frames, decode=False)
        same = all(a[f"r{i}"]["frames"] == b[f"r{i}"]["frames"] for i in range(c))
        parts.append(f"c={c} {'equal' if same else 'DIFFERENT'}")
    return f"{', '.join(parts)} ({captured} graphs captured)"


def memory(config, thinker, talker, builder, code2wav, static, max_len: int) -> str:
    if not torch.cuda.is_available():
        return "no CUDA device (dry run): not measured"
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    thinker_engine, talker_engine = engines(config, thinker, talker, 16, max_len, eager=False, static=static)
    caches = sum(t.numel() * t.element_size() for e in (thinker_engine, talker_engine)
                 for t in e.runner.slots.keys + e.runner.slots.values)
    pipeline(config, thinker_engine, talker_engine, talker, builder, code2wav, 16, tokens=32, frames=25)
    peak = torch.cuda.max_memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    return (f"weights {before / 1e9:.1f} GB; peak {peak / 1e9:.1f} GB of {total / 1e9:.1f} GB with 16 conversations "
            f"at max_model_len {max_len} (static caches {caches / 1e9:.2f} GB)")


def benchmark(config, thinker, talker, builder, code2wav, static, levels, tokens: int, frames: int) -> list[str]:
    thinker_engine, talker_engine = engines(config, thinker, talker, max(levels), 1024, eager=False, static=static)
    pipeline(config, thinker_engine, talker_engine, talker, builder, code2wav, 1, tokens=8, frames=4)   # warm-up
    rows = ["| c | TTFT p50 ms | TTFT p95 ms | TTFA p50 ms | TTFA p95 ms | RTF p50 | audio s/s |", "|---|---|---|---|---|---|---|"]
    for c in levels:
        run = pipeline(config, thinker_engine, talker_engine, talker, builder, code2wav, c, tokens, frames)
        turns = [run[f"r{i}"] for i in range(c)]
        audio = [t["samples"] / 24000 for t in turns]
        rtf = [t["total"] / a for t, a in zip(turns, audio) if a]
        rows.append(f"| {c} | {percentile([t['ttft'] * 1000 for t in turns], 50):.0f} | "
                    f"{percentile([t['ttft'] * 1000 for t in turns], 95):.0f} | "
                    f"{percentile([t['ttfa'] * 1000 for t in turns if t['ttfa']], 50):.0f} | "
                    f"{percentile([t['ttfa'] * 1000 for t in turns if t['ttfa']], 95):.0f} | "
                    f"{percentile(rtf, 50):.3f} | {sum(audio) / run['wall']:.2f} |")
        log(rows[-1])
    return rows


def served(work: Path, levels, results: str) -> str:
    if shutil.which("tritonserver") is None:
        return "skipped: tritonserver not on PATH"
    deploy = (ROOT / "deploy" / "qwen3_omni.gpu.yaml").read_text().replace("pipeline: qwen3_omni\n",
                                                                           "pipeline: qwen3_omni_tiny_random\n")
    path = work / "qwen3_omni_tiny_random.gpu.yaml"
    path.write_text("# generated by perf/gpu/omni_check.py from deploy/qwen3_omni.gpu.yaml\n" + deploy)
    cmd = [sys.executable, str(ROOT / "perf" / "bench.py"), "--pipeline", "qwen3_omni_tiny_random", "--deploy",
           str(path), "--concurrency", ",".join(map(str, levels)), "--requests", "2", "--results", results]
    log("served: " + " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    print(done.stdout[-3000:])
    return "ok (table appended by perf/bench.py)" if done.returncode == 0 else f"failed (exit {done.returncode})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--results", default=str(ROOT / "perf" / "JOURNAL.md"))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--no-served", action="store_true")
    ap.add_argument("--tokens", type=int, default=None, help="answer tokens per turn (default 64; dry run 10)")
    ap.add_argument("--frames", type=int, default=None, help="talker frames per turn (default 100; dry run 12)")
    args = ap.parse_args(argv)
    stop_on_sigterm()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cuda = torch.cuda.is_available() and not args.dry_run
    shape, device, dtype = ("30b-a3b", "cuda", torch.bfloat16) if cuda else ("tiny", "cpu", torch.float32)
    static = None if cuda else True   # CPU: the static steps, eagerly
    tokens, frames = args.tokens or (64 if cuda else 10), args.frames or (100 if cuda else 12)
    head = f"## Qwen3-Omni GPU check{'' if cuda else ' (DRY RUN, CPU, tiny shape)'}, {stamp}\n\n"
    if cuda:
        head += (f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}; random "
                 "weights of the released 30B-A3B shape made in GPU memory (thinker, talker bf16; code2wav fp32).\n\n")
    lines, problems = [], []
    try:
        started = time.perf_counter()
        config, thinker, talker, code2wav = random_model(shape, device, dtype)
        builder = prompt_builder(config)
        log(f"model made in {time.perf_counter() - started:.1f} s")
        for name, step in (
                ("Graphs vs eager (greedy thinker tokens and talker frames)",
                 lambda: parity(config, thinker, talker, builder, code2wav, static, *((24, 20) if cuda else (8, 6)))),
                ("Memory", lambda: memory(config, thinker, talker, builder, code2wav, static,
                                          4096 if cuda and torch.cuda.get_device_properties(0).total_memory > 100e9
                                          else 2048))):
            try:
                result = step()
            except Stopped:
                raise
            except Exception as exc:  # noqa: BLE001 - reported, the check goes on
                result = f"failed: {type(exc).__name__}: {exc}"
                problems.append(name)
            if "DIFFERENT" in result:
                problems.append(name)
            lines.append(f"{name}: {result}")
            log(lines[-1])
        levels = [1, 4, 16]
        lines.append(f"\nIn-process pipeline ({tokens} answer tokens, {frames} frames per turn, all turns at once):\n")
        lines += benchmark(config, thinker, talker, builder, code2wav, static, levels, tokens, frames)
        del thinker, talker, code2wav
        if cuda and not args.no_served:
            torch.cuda.empty_cache()
            with tempfile.TemporaryDirectory() as work:
                lines.append("\nServed (tiny random pipeline, the GPU deploy's stage settings): "
                             + served(Path(work), levels, args.results))
    except Exception as exc:  # noqa: BLE001
        problems.append(f"{type(exc).__name__}: {exc}")
    return finish(head, lines, problems, args.results, args.no_results)


if __name__ == "__main__":
    sys.exit(main())
