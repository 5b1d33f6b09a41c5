"""Where a Qwen3-TTS frame step's time goes: torch.profiler over the engine's step at c = 1.

A random-weight checkpoint of the released 1.7B shape (bf16 on the GPU), one greedy request, a
few warm-up frames, then `--frames` steps under the profiler (each step: the talker's decode and
the code predictor's 15 inner steps; with CUDA graphs unless `--eager`). Prints the step time, the
kernels per frame and the top kernels by time (calls per frame, microseconds per call and per
frame), as a markdown table, appended to perf/RESULTS.md unless `--no-results`. On the CPU
(`--dry-run`: tiny shape, float32) the "kernels" are the profiler's CPU operators: the script's
logic is checked anywhere; the figures that matter come from a GPU.

    python perf/gpu/frame_profile.py                 # GPU, 1.7B shape, CUDA graphs
    python perf/gpu/frame_profile.py --eager         # the same without graphs (kernel launch cost)
    python perf/gpu/frame_profile.py --dry-run --no-results
"""
from __future__ import annotations

import argparse
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
from omni_backend.models.qwen3_tts.runner import create_engine  # noqa: E402
from omni_backend.testing.qwen3_tts_random import write_random_checkpoint  # noqa: E402

TEXT = "Hello world, this is a profile of one frame step."


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def profile_steps(engine, device: str, frames: int, warmup: int) -> tuple[list[float], "torch.profiler.profile"]:
    """Step times (s) of `frames` steps of one running request, and the profiler that watched them."""
    from torch.profiler import ProfilerActivity, profile

    builder = engine.runner.checkpoint.prompt_builder()
    speaker = (list(builder.speakers) or [None])[0]
    total = warmup + frames + 2
    engine.add_request("profile", builder.build(TEXT, speaker=speaker),
                       SamplingParams.greedy(max_new_tokens=total, min_new_tokens=total))
    engine.step()   # the prefill
    for _ in range(warmup):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    times = []
    with profile(activities=activities) as prof:
        for _ in range(frames):
            sync(device)
            t = time.perf_counter()
            engine.step()
            sync(device)
            times.append(time.perf_counter() - t)
    engine.cancel("profile")
    while engine.has_unfinished():
        engine.step()
    return times, prof


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
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--work", help="folder for the checkpoint (default: a temporary folder)")
    ap.add_argument("--results", default=str(ROOT / "perf" / "RESULTS.md"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args(argv)
    dry = args.dry_run
    device = args.device or ("cpu" if dry else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --dry-run for the CPU logic check", file=sys.stderr)
        return 2
    size = args.size or ("tiny" if dry else "1.7b")
    frames = args.frames or (3 if dry else 30)
    warmup = args.warmup if args.warmup is not None else (2 if dry else 10)
    dtype = "float32" if device == "cpu" else "bfloat16"
    work = Path(args.work or tempfile.mkdtemp(prefix="frame-profile-"))
    model = work / size
    if not (model / "config.json").exists():
        write_random_checkpoint(str(model), size, "custom_voice", seed=0)
    engine = create_engine(str(model), max_num_seqs=1, max_model_len=512, dtype=dtype, device=device,
                           cuda_graph_sizes=[1], enforce_eager=args.eager, num_threads=1)
    times, prof = profile_steps(engine, device, frames, warmup)
    rows, kernels, busy = kernel_rows(prof, device, frames)
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.machine()
    head = (f"### Frame step profile: Qwen3-TTS random {size}, c = 1, {device} ({gpu}), {dtype}, "
            f"{'eager' if args.eager or device == 'cpu' else 'CUDA graphs'}, {datetime.date.today()}\n\n"
            f"torch {torch.__version__}; {frames} profiled steps after {warmup}; command: `python "
            f"perf/gpu/frame_profile.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
            + (" (dry run: CPU operators, not GPU kernels)" if dry else ""))
    text = markdown(rows, kernels, busy, [t * 1000 for t in times], head, args.top)
    print(text)
    if not args.no_results:
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write("\n" + text)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
