"""Where a Qwen3-TTS frame step's time goes: torch.profiler over the engine's step at c = 1.

A random-weight checkpoint of the released 1.7B shape (bf16 on the GPU), one greedy request, a
few warm-up frames, then `--frames` steps under the profiler (each step: the talker's decode and
the code predictor's 15 inner steps; with CUDA graphs unless `--eager`). Prints the step time, the
kernels per frame and the top kernels by time (calls per frame, microseconds per call and per
frame), as a markdown table, appended to perf/JOURNAL.md unless `--no-results`. On the CPU
(`--dry-run`: tiny shape, float32) the "kernels" are the profiler's CPU operators: the script's
logic is checked anywhere; the figures that matter come from a GPU.

    python perf/gpu/frame_profile.py                 # GPU, 1.7B shape, CUDA graphs
    python perf/gpu/frame_profile.py --eager         # the same without graphs (kernel launch cost)
    python perf/gpu/frame_profile.py --dry-run --no-results
    python perf/gpu/frame_profile.py --compile default   # + the torch.compile'd step's time beside it

`--compile MODE` (the talker stage's deploy option `compile`) then builds a second engine whose
static step is compiled with that inductor mode (compiled inside the CUDA graphs at capture: every
variant compiles at load, minutes for the 1.7B shape) and adds one line: compiled vs uncompiled
step p50 over the same frames, and the compile + capture time.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from omni_backend.engine import SamplingParams  # noqa: E402
from omni_backend.models.qwen3_tts.compiled_step import compile_static_step  # noqa: E402
from omni_backend.models.qwen3_tts.family import COMPILE_MODES  # noqa: E402
from omni_backend.models.qwen3_tts.runner import create_engine  # noqa: E402
from omni_backend.models.qwen3_tts.random_checkpoint import write_random_checkpoint  # noqa: E402

TEXT = "Hello world, this is a profile of one frame step."


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _steps(engine, device: str, frames: int, warmup: int, watch=None) -> list[float]:
    """Step times (s) of `frames` steps of one running greedy request, after its prefill and
    `warmup` steps; `watch`: a context manager around the timed steps (the profiler)."""
    builder = engine.runner.checkpoint.prompt_builder()
    speaker = (list(builder.speakers) or [None])[0]
    total = warmup + frames + 2
    engine.add_request("timed", builder.build(TEXT, speaker=speaker),
                       SamplingParams.greedy(max_new_tokens=total, min_new_tokens=total))
    engine.step()   # the prefill
    for _ in range(warmup):
        engine.step()
    times = []
    with watch if watch is not None else contextlib.nullcontext():
        for _ in range(frames):
            sync(device)
            t = time.perf_counter()
            engine.step()
            sync(device)
            times.append(time.perf_counter() - t)
    engine.cancel("timed")
    while engine.has_unfinished():
        engine.step()
    return times


def profile_steps(engine, device: str, frames: int, warmup: int) -> tuple[list[float], "torch.profiler.profile"]:
    """Step times (s) of `frames` steps of one running request, and the profiler that watched them."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    prof = profile(activities=activities)
    return _steps(engine, device, frames, warmup, prof), prof


def time_steps(engine, device: str, frames: int, warmup: int) -> list[float]:
    """Step times (s) of `frames` steps of one running request, without the profiler."""
    return _steps(engine, device, frames, warmup)


def compiled_line(model: Path, mode: str, device: str, dtype: str, eager: bool, frames: int, warmup: int,
                  uncompiled_ms: list[float], backend: str = "inductor") -> str:
    """The compiled step's p50 beside the uncompiled one's, on the same shape and settings.
    ``backend`` other than inductor (CPU dry run only: inductor's C++ build of a variant takes
    minutes there) recompiles the step after the engine is made; graphs are never captured on CPU."""
    started = time.perf_counter()
    engine = create_engine(str(model), max_num_seqs=1, max_model_len=512, dtype=dtype, device=device,
                           cuda_graph_sizes=[1], enforce_eager=eager, num_threads=1,
                           compile_mode=mode if backend == "inductor" else "none", static_step=True)
    if backend != "inductor":
        runner = engine.runner
        variants = len(runner.graphs.sizes) * len(runner.graphs.variants)
        runner.graphs.step = compile_static_step(runner.static, mode, variants, backend=backend)
    times = [t * 1000 for t in time_steps(engine, device, frames, warmup)]
    built = time.perf_counter() - started - sum(times) / 1000
    return (f"Compiled step (`compile: {mode}`): p50 {statistics.median(times):.2f} ms (min {min(times):.2f}) vs "
            f"{statistics.median(uncompiled_ms):.2f} ms uncompiled, {frames} steps each; compile + capture + "
            f"warm-up {built:.1f} s.\n")


def kernel_rows(prof, device: str, frames: int) -> tuple[list[dict], float, float]:
    """Per kernel (GPU) or operator (CPU): calls per frame, us per call, us per frame; and the
    kernels per frame and their us per frame in all. On CPU, operators' self time (no double
    counting of nested ones)."""
    rows = []
    for e in prof.key_averages():
        if device.startswith("cuda"):
            us = e.self_device_time_total if hasattr(e, "self_device_time_total") else e.self_cuda_time_total
            if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CPU"):
                continue
        else:
            us = e.self_cpu_time_total
        if us <= 0 or e.count <= 0:
            continue
        rows.append({"name": e.key, "calls_per_frame": e.count / frames, "us_per_call": us / e.count,
                     "us_per_frame": us / frames})
    rows.sort(key=lambda r: -r["us_per_frame"])
    return rows, sum(r["calls_per_frame"] for r in rows), sum(r["us_per_frame"] for r in rows)


def markdown(rows: list[dict], kernels: float, busy_us: float, step_ms: list[float], head: str, top: int) -> str:
    lines = [head, "",
             f"Step p50 {statistics.median(step_ms):.2f} ms (min {min(step_ms):.2f}); "
             f"{kernels:.0f} kernels per frame, {busy_us / 1000:.2f} ms of kernel time per frame.", "",
             "| kernel | calls / frame | us / call | us / frame | share |", "|---|---|---|---|---|"]
    for r in rows[:top]:
        name = r["name"] if len(r["name"]) <= 80 else r["name"][:77] + "..."
        lines.append(f"| `{name}` | {r['calls_per_frame']:.1f} | {r['us_per_call']:.1f} | {r['us_per_frame']:.1f} | "
                     f"{100 * r['us_per_frame'] / busy_us:.1f} % |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, float32: checks the logic")
    ap.add_argument("--device", default=None, help="default cuda (cpu with --dry-run)")
    ap.add_argument("--size", default=None, help="checkpoint shape (default 1.7b; dry run tiny)")
    ap.add_argument("--frames", type=int, default=None, help="profiled steps (default 30; dry run 3)")
    ap.add_argument("--warmup", type=int, default=None, help="steps before profiling (default 10; dry run 2)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--compile", default=None, choices=COMPILE_MODES[1:],
                    help="also time the step compiled with this inductor mode (default, max-autotune-no-cudagraphs)")
    ap.add_argument("--compile-backend", default="inductor", choices=("inductor", "aot_eager"),
                    help="aot_eager: dry run only (checks the script's logic without inductor's C++ build)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--work", help="folder for the checkpoint (default: a temporary folder)")
    ap.add_argument("--results", default=str(ROOT / "perf" / "JOURNAL.md"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args(argv)
    dry = args.dry_run
    device = args.device or ("cpu" if dry else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --dry-run for the CPU logic check", file=sys.stderr)
        return 2
    if args.compile_backend != "inductor" and not dry:
        ap.error("--compile-backend is for --dry-run only")
    size = args.size or ("tiny" if dry else "1.7b")
    frames = args.frames or (3 if dry else 30)
    warmup = args.warmup if args.warmup is not None else (2 if dry else 10)
    dtype = "float32" if device == "cpu" else "bfloat16"
    work = Path(args.work or tempfile.mkdtemp(prefix="frame-profile-"))
    model = work / size
    if not (model / "config.json").exists():
        write_random_checkpoint(str(model), size, "custom_voice", seed=0)
    # static_step: the step the engine runs on a GPU (on CPU too, so that --compile compares like with like)
    engine = create_engine(str(model), max_num_seqs=1, max_model_len=512, dtype=dtype, device=device,
                           cuda_graph_sizes=[1], enforce_eager=args.eager, num_threads=1,
                           static_step=True if args.compile else None)
    times, prof = profile_steps(engine, device, frames, warmup)
    rows, kernels, busy = kernel_rows(prof, device, frames)
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.machine()
    head = (f"### Frame step profile: Qwen3-TTS random {size}, c = 1, {device} ({gpu}), {dtype}, "
            f"{'eager' if args.eager or device == 'cpu' else 'CUDA graphs'}, {datetime.date.today()}\n\n"
            f"torch {torch.__version__}; {frames} profiled steps after {warmup}; command: `python "
            f"perf/gpu/frame_profile.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
            + (" (dry run: CPU operators, not GPU kernels)" if dry else ""))
    text = markdown(rows, kernels, busy, [t * 1000 for t in times], head, args.top)
    if args.compile:   # both timed without the profiler's overhead
        uncompiled = [t * 1000 for t in time_steps(engine, device, frames, warmup)]
        del engine, prof
        text += "\n" + compiled_line(model, args.compile, device, dtype, args.eager, frames, warmup, uncompiled,
                                     args.compile_backend)
    print(text)
    if not args.no_results:
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write("\n" + text)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
