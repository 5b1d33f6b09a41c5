"""GPU check of the Qwen3-TTS pipeline: parity of CUDA graphs, in-process speed, memory, served speed.

    python perf/gpu/check.py                      # on a machine with an NVIDIA GPU (see check.sh)
    python perf/gpu/check.py --dry-run            # CPU, tiny shape: exercises the script's logic

Steps (each prints as it goes; the tables are appended to perf/JOURNAL.md):

1. random-weight checkpoints of the released 0.6B and 1.7B shapes (bf16,
   ``omni_backend.models.qwen3_tts.random_checkpoint``);
2. greedy parity: the 1.7B AR engine with CUDA graphs vs the same engine with ``enforce_eager``,
   at concurrencies that hit bucket sizes and padded buckets, every frame compared;
3. memory: the 0.6B pipeline (AR engine bf16 at ``max_num_seqs`` 16 + code2wav fp32) running
   16 streams: ``torch.cuda.max_memory_allocated`` (and the engine's KV cache share);
4. in-process benchmark of the 1.7B pipeline at c = 1, 4, 8, 16, 32, 64: engine (graphs) +
   code2wav windows on the deploy chunk schedule (initial 2, chunk 25, left context 72),
   decoded in the same loop: time to first audio p50 / p95 (request arrival to its first audio
   window), real-time factor p50 (request wall time / its audio), audio seconds per wall second;
   also the eager engine at c=1 for the graph speed-up;
5. the served benchmark (``perf/bench.py`` through ``tritonserver``) when ``tritonserver`` is on
   PATH, with a generated GPU deploy YAML.

Random weights emit eos now and then; eos is held back (``min_new_tokens``) so that every request
makes exactly ``--frames`` frames.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from omni_backend.chunking import CodecChunkSchedule  # noqa: E402
from omni_backend.engine import SamplingParams  # noqa: E402
from omni_backend.models.qwen3_tts.code2wav import Code2Wav, Code2WavGraphs  # noqa: E402
from omni_backend.testing.qwen3_tts_graph_check import greedy_graph_parity  # noqa: E402
from omni_backend.models.qwen3_tts.random_checkpoint import write_random_checkpoint  # noqa: E402
from omni_backend.models.qwen3_tts.runner import create_engine  # noqa: E402
from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request  # noqa: E402

TEXTS = ["The weather is lovely today. Let us take a walk in the park.",
         "Please call me back tomorrow morning at nine. I will be at my desk.",
         "Streaming speech arrives in small chunks. The first one comes quickly.",
         "A quick brown fox jumps over the lazy dog. Then it runs away."]
GOALS = "goals (1.7B, H200): TTFA <= 50 ms at c=1 and <= 150 ms at c=10; RTF <= 0.10 at c=1; >= 80 audio s/s at c=10"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- in-process pipeline


def decode_ready(decoder: Code2Wav, graphs: Code2WavGraphs | None, windows: list, contexts: list) -> list:
    """Decode windows of many requests: same-shape windows together (a graph replay when
    ``graphs`` has that shape), in one padded batch otherwise."""
    if graphs is None:
        return decoder.decode_windows(windows, contexts)
    out: list = [None] * len(windows)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (w, left) in enumerate(zip(windows, contexts)):
        groups.setdefault((w.shape[-1], left), []).append(i)
    for (_, left), index in groups.items():
        audio = graphs.decode_window(torch.stack([windows[i] for i in index]), left)
        for row, i in enumerate(index):
            out[i] = audio[row]
    return out


def run_pipeline(engine, decoder: Code2Wav, schedule: CodecChunkSchedule, concurrency: int, frames: int,
                 device: str, tag: str, graphs: Code2WavGraphs | None = None) -> dict:
    """``concurrency`` requests arrive together; each engine step is followed by decoding every
    window that became ready (batched code2wav calls). Returns TTFA / RTF / throughput."""
    builder = engine.runner.checkpoint.prompt_builder()
    speakers = list(builder.speakers) or [None]
    params = sampling_params_from_request(engine.default_params, {"do_sample": False, "subtalker_do_sample": False,
                                                                  "max_new_tokens": frames + 1})
    params = dataclasses.replace(params, min_new_tokens=frames + 1)
    codes: dict[str, list[list[int]]] = {}
    emitted: dict[str, int] = {}
    finished: set[str] = set()
    first_audio: dict[str, float] = {}
    done_at: dict[str, float] = {}
    audio_samples: dict[str, int] = {}
    sync(device)
    started = time.perf_counter()
    for i in range(concurrency):
        rid = f"{tag}-{i}"
        prompt = builder.build(TEXTS[i % len(TEXTS)], speaker=speakers[i % len(speakers)])
        engine.add_request(rid, prompt, params)
        codes[rid], emitted[rid], audio_samples[rid] = [], 0, 0
    while engine.has_unfinished() or any(emitted[r] < len(codes[r]) for r in codes):
        for event in engine.step():
            if event.codes is not None:
                codes[event.request_id].append(event.codes)
            if event.finished:
                finished.add(event.request_id)
        windows, contexts, owners = [], [], []
        for rid in codes:
            window = schedule.next_window(emitted[rid], len(codes[rid]), rid in finished)
            if window is None:
                continue
            block = torch.tensor(codes[rid][window.start_frame:window.end_frame], dtype=torch.long).T
            windows.append(block.to(decoder.device))
            contexts.append(window.left_context_frames)
            owners.append((rid, window.end_frame))
        if windows:
            audio = decode_ready(decoder, graphs, windows, contexts)
            sync(device)
            now = time.perf_counter()
            for (rid, end), piece in zip(owners, audio):
                emitted[rid] = end
                audio_samples[rid] += piece.shape[-1]
                first_audio.setdefault(rid, now - started)
                if rid in finished and emitted[rid] == len(codes[rid]):
                    done_at[rid] = now - started
    wall = time.perf_counter() - started
    rate = decoder.sample_rate
    audio_s = {r: audio_samples[r] / rate for r in codes}
    rtf = [done_at.get(r, wall) / audio_s[r] for r in codes if audio_s[r] > 0]
    ttfa = [first_audio[r] * 1000 for r in first_audio]
    return {"concurrency": concurrency, "requests": concurrency, "frames": sum(len(v) for v in codes.values()),
            "ttfa_p50_ms": percentile(ttfa, 50), "ttfa_p95_ms": percentile(ttfa, 95),
            "rtf_p50": percentile(rtf, 50), "audio_s_per_s": sum(audio_s.values()) / wall, "wall_s": wall}


def step_ms(engine, concurrency: int, frames: int, device: str) -> float:
    """Median ms per engine decode step with ``concurrency`` greedy requests running."""
    builder = engine.runner.checkpoint.prompt_builder()
    speakers = list(builder.speakers) or [None]
    params = SamplingParams.greedy(max_new_tokens=frames + 1, min_new_tokens=frames + 1)
    for i in range(concurrency):
        engine.add_request(f"step{concurrency}-{i}-{time.time()}", builder.build(TEXTS[i % 4], speaker=speakers[0]),
                           params)
    engine.step()
    times = []
    while engine.has_unfinished():
        sync(device)
        t = time.perf_counter()
        events = engine.step()
        sync(device)
        if len(events) == concurrency and not any(e.finished for e in events):
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000 if times else float("nan")


def codec_graph_parity(decoder: Code2Wav, graphs: Code2WavGraphs, schedule: CodecChunkSchedule) -> float:
    """Max abs difference between a graph replay and the eager decoder on the same padded batch
    (3 windows in the bucket of 4), for the first and the steady window shape."""
    worst = 0.0
    if not graphs.graphs:  # nothing captured (CPU dry run): every call is the eager decoder
        return worst
    g = torch.Generator().manual_seed(0)
    steady = schedule.left_context_frames + schedule.chunk_frames
    for frames, skip in ((schedule.initial_chunk_frames, 0), (steady, schedule.left_context_frames)):
        codes = torch.randint(0, 2048, (3, decoder.num_quantizers, frames), generator=g)
        got = graphs.decode_window(codes, skip)
        size = next((b for b in graphs.batch_sizes if b >= 3), 3)
        padded = torch.zeros(size, decoder.num_quantizers, frames, dtype=torch.long)
        padded[:3] = codes
        with torch.inference_mode():
            want = decoder(padded.to(decoder.device), skip)[:3]
        worst = max(worst, float((got - want).abs().max()))
    return worst


# --------------------------------------------------------------------------- steps


def write_checkpoints(work: Path, sizes: list[str]) -> dict[str, str]:
    out = {}
    for size in sizes:
        started = time.perf_counter()
        out[size] = write_random_checkpoint(str(work / size), size, "custom_voice", seed=0)
        log(f"checkpoint {size}: {time.perf_counter() - started:.1f} s -> {out[size]}")
    return out


def memory_check(model_dir: str, device: str, dtype: str, frames: int, schedule: CodecChunkSchedule,
                 max_model_len: int, graph_sizes: list[int]) -> dict:
    """The 0.6B pipeline at max_num_seqs 16 running 16 streams."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    engine = create_engine(model_dir, max_num_seqs=16, max_model_len=max_model_len, dtype=dtype, device=device,
                           cuda_graph_sizes=graph_sizes, max_prefills_per_step=16, static_step=_static(device))
    decoder = Code2Wav.from_checkpoint(os.path.join(model_dir, "speech_tokenizer"), device=device)
    result = run_pipeline(engine, decoder, schedule, 16, frames, device, "mem")
    cache = engine.runner.cache.nbytes
    info = {"kv_cache_gib": cache / 2 ** 30, "max_model_len": max_model_len, "audio_s_per_s": result["audio_s_per_s"]}
    if device.startswith("cuda"):
        info["max_allocated_gib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
        info["max_reserved_gib"] = torch.cuda.max_memory_reserved() / 2 ** 30
    del engine, decoder
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return info


def _static(device: str):
    return None if device.startswith("cuda") else True  # CPU dry run: exercise the static step eagerly


# where code2wav and the talker run in the served deploy (README "Where code2wav runs"):
# stage 0's (`process`, `options.code2wav`)
PLACEMENTS = {"own_stage": ("own", "own_stage"), "in_talker": ("own", "in_talker"), "in_entry": ("entry", "in_talker"),
              "adaptive": ("entry", "adaptive")}


def served_deploy(concurrency: list[int], placement: str) -> str:
    """The served benchmark's deploy YAML: both stages on cuda, the talker bf16 with CUDA graphs."""
    process, code2wav = PLACEMENTS[placement]
    return f"""# generated by perf/gpu/check.py (placement {placement})
pipeline: qwen3_tts
async_chunk:
  enabled: true
  initial_chunk_frames: 2
  chunk_frames: 25
  left_context_frames: 72
entry:
  instances: 1
  max_streams: 128
stages:
  - stage_id: 0
    process: {process}
    engine: torch
    device: cuda
    dtype: bfloat16
    instances: 1
    threads: 4
    max_num_seqs: {max(max(concurrency), 1)}
    max_prefills_per_step: {max(max(concurrency), 1)}
    max_model_len: 1024
    cuda_graph_sizes: {sorted(set([1, 2, 4, 8, 16, 32, 64]) | {max(concurrency)})}
    options:
      code2wav: {code2wav}
  - stage_id: 1
    device: cuda
    instances: 1
    threads: 4
    max_batch_size: 64
    max_queue_delay_us: 1000
"""


def served(model_dir: str, work: Path, concurrency: list[int], frames: int, results: str, timeout: int,
           placement: str = "own_stage") -> str:
    if shutil.which("tritonserver") is None:
        return "skipped: tritonserver not on PATH"
    deploy = work / f"qwen3_tts_gpu.{placement}.yaml"
    deploy.write_text(served_deploy(concurrency, placement))
    cmd = [sys.executable, str(ROOT / "perf" / "bench.py"), "--pipeline", "qwen3_tts", "--model", model_dir,
           "--deploy", str(deploy), "--concurrency", ",".join(map(str, concurrency)), "--requests", "2",
           "--frames", str(frames), "--results", results]
    log("served: " + " ".join(cmd))
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = bench.communicate(timeout=timeout)
    except (subprocess.TimeoutExpired, Stopped) as exc:
        # SIGTERM first: bench.py then stops its tritonserver (its own session: no signal reaches it)
        bench.terminate()
        try:
            bench.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            bench.kill()
            bench.communicate()
        if isinstance(exc, Stopped):
            raise
        return f"timed out after {timeout} s"
    print(stdout[-4000:])
    if bench.returncode != 0:
        print(stderr[-4000:], file=sys.stderr)
        return f"failed (exit {bench.returncode})"
    return "ok (table appended by perf/bench.py)"


# --------------------------------------------------------------------------- main


class Stopped(BaseException):
    """SIGTERM (the ``timeout`` guard in check.sh): report what was measured so far. Not an
    ``Exception``, so no ``except Exception`` on the way (the engine's step has one) swallows it."""


@dataclasses.dataclass
class CheckReport:
    """What the check measured so far; every field has a value meaning "not reached"."""
    dry: bool
    small: str
    big: str
    device: str
    dtype: str
    gpu: str
    frames: int
    parity: dict = dataclasses.field(default_factory=lambda: {"ok": False, "levels": [], "capture_s": float("nan"),
                                                              "graphs": 0})
    memory: dict = dataclasses.field(default_factory=lambda: {"max_model_len": "-", "kv_cache_gib": float("nan")})
    buckets: list = dataclasses.field(default_factory=list)
    capture_s: float = float("nan")
    codec_graphs: int = 0
    codec_capture_s: float = float("nan")
    codec_parity: float = float("nan")
    eager_step: dict = dataclasses.field(default_factory=lambda: {1: float("nan"), 4: float("nan")})
    rows: list = dataclasses.field(default_factory=list)
    served_status: str = "not reached"
    served_only: bool = False
    problems: list = dataclasses.field(default_factory=list)

    def markdown(self, total_s: float) -> str:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        memory = self.memory
        lines = [f"## Qwen3-TTS GPU check ({'DRY RUN, ' if self.dry else ''}{self.small} / {self.big} random "
                 f"weights), {stamp}", "",
                 f"Machine: {self.gpu}, torch {torch.__version__}, python {platform.python_version()}, device "
                 f"{self.device}, AR dtype {self.dtype}, code2wav float32. Command: "
                 f"`perf/gpu/check.sh{' --dry-run' if self.dry else ''}` ({total_s:.0f} s). {self.frames} frames per "
                 "request (random weights never stop), chunk schedule 2 / 25 / 72, code2wav windows decoded in the "
                 "engine loop (serial, in-process).", "",
                 f"Parity (greedy and seeded sampling, graphs vs enforce_eager, {self.big}): "
                 + (", ".join(f"c={lv['concurrency']}{' sampled' if lv.get('sample') else ''} "
                              f"{'equal' if lv['equal'] else 'DIFFERENT'}" for lv in self.parity["levels"])
                    or "not measured")
                 + f"; capture {self.parity['capture_s']:.1f} s.", "",
                 f"Memory ({self.small} pipeline, max_num_seqs 16, max_model_len {memory['max_model_len']}, "
                 "16 streams): "
                 + (f"max allocated {memory['max_allocated_gib']:.2f} GiB (reserved "
                    f"{memory['max_reserved_gib']:.2f} GiB), " if "max_allocated_gib" in memory else "")
                 + f"of which KV cache {memory['kv_cache_gib']:.2f} GiB.", "",
                 f"Engine load + capture + warm-up for buckets {self.buckets}: {self.capture_s:.1f} s; code2wav "
                 f"graphs {self.codec_graphs} in {self.codec_capture_s:.1f} s (graph vs eager max abs diff "
                 f"{self.codec_parity:.3g}). Eager step (no graphs): c=1 {self.eager_step[1]:.2f} ms, "
                 f"c=4 {self.eager_step[4]:.2f} ms.", "",
                 "| c | TTFA p50 ms | TTFA p95 ms | RTF p50 | audio s/s | step ms (c frames) |",
                 "|---|---|---|---|---|---|"]
        if self.served_only:  # the served table is appended by perf/bench.py
            lines = [f"## Qwen3-TTS GPU check, served only ({self.big} random weights), {stamp}", "",
                     f"Machine: {self.gpu}, torch {torch.__version__}, python {platform.python_version()}. "
                     f"Command: `perf/gpu/check.sh --served-only` ({total_s:.0f} s). {self.frames} frames per "
                     "request (random weights never stop)."]
        for r in self.rows:
            lines.append(f"| {r['concurrency']} | {r['ttfa_p50_ms']:.1f} | {r['ttfa_p95_ms']:.1f} | "
                         f"{r['rtf_p50']:.3f} | {r['audio_s_per_s']:.1f} | {r['step_ms']:.2f} |")
        lines += ["", f"Served (tritonserver): {self.served_status}. {GOALS}.", ""]
        if self.problems:
            lines.insert(2, "**Problems: " + "; ".join(self.problems) + "**\n")
        return "\n".join(lines)


def _stop(signum, frame) -> None:
    raise Stopped()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, small concurrencies: test the logic")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    ap.add_argument("--concurrency", default=None, help="default 1,4,8,16,32,64 (dry run: 1,2,4)")
    ap.add_argument("--frames", type=int, default=None, help="frames per request (default 100; dry run 8)")
    ap.add_argument("--work", help="folder for the checkpoints (default: a temporary folder)")
    ap.add_argument("--results", default=str(ROOT / "perf" / "JOURNAL.md"))
    ap.add_argument("--no-results", action="store_true", help="print only, do not append to JOURNAL.md")
    ap.add_argument("--no-served", action="store_true")
    ap.add_argument("--served-only", action="store_true",
                    help="write the checkpoints and run only the served benchmark (steps 2-4 skipped)")
    ap.add_argument("--served-timeout", type=int, default=200)
    ap.add_argument("--placement", choices=sorted(PLACEMENTS), default="own_stage",
                    help="the served deploy's code2wav / talker placement (own_stage: two stages over BLS; "
                         "in_talker: code2wav in the talker's process; in_entry: the whole pipeline in the entry's; "
                         "adaptive: the talker in the entry's, code2wav there for a request alone, else batched)")
    args = ap.parse_args(argv)
    if args.served_only and (args.no_served or args.dry_run):
        ap.error("--served-only runs nothing with --no-served or --dry-run")

    dry = args.dry_run
    device = args.device or ("cpu" if dry else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --dry-run for the CPU logic check", file=sys.stderr)
        return 2
    dtype = "float32" if device == "cpu" else "bfloat16"
    small, big = ("tiny", "tiny2") if dry else ("0.6b", "1.7b")
    cuda = device.startswith("cuda")
    gpu = torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine()
    report = CheckReport(dry, small, big, device, dtype, gpu, args.frames or (8 if dry else 100),
                         served_only=args.served_only)
    log(f"device {device} ({gpu}), torch {torch.__version__}, python {platform.python_version()}, dtype {dtype}")
    started = time.perf_counter()
    # check.sh's `timeout` sends SIGTERM: the report below still gets written, with what was measured
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        run_checks(args, report)
    except Stopped:
        report.problems.append(f"stopped by SIGTERM (timeout) after {time.perf_counter() - started:.0f} s: "
                               "later steps were not measured")
        if report.served_status == "running":
            report.served_status = "stopped by the timeout"
        log(report.problems[-1])
    finally:
        signal.signal(signal.SIGTERM, previous)
    text = report.markdown(time.perf_counter() - started)
    print("\n" + text)
    if not args.no_results:
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write("\n" + text)
        log(f"appended to {args.results}")
    return 1 if report.problems else 0


def run_checks(args: argparse.Namespace, report: CheckReport) -> None:
    dry, device, small, big, frames = report.dry, report.device, report.small, report.big, report.frames
    concurrency = [int(c) for c in (args.concurrency or ("1,2,4" if dry else "1,4,8,16,32,64")).split(",")]
    graph_sizes = sorted({1, 2, 4, 8, 16, 32, 64} | set(concurrency))
    schedule = CodecChunkSchedule(2, 25, 72)
    # a serving-size cache, not a tight one: the step's attention length buckets go up to it
    max_model_len = 128 + frames if dry else 1024
    if device == "cpu":
        torch.set_num_threads(1)  # a dry run checks logic; spinning OpenMP threads on a busy box only add noise
    else:
        torch.backends.cuda.matmul.allow_tf32 = False

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        dirs = write_checkpoints(work, [big] if args.served_only else [small, big])

        if args.served_only:
            log("parity, memory and in-process benchmark: skipped (--served-only)")
        else:
            measure_in_process(report, dirs, concurrency, graph_sizes, schedule, max_model_len)

        # 5. served
        report.served_status = "skipped (--no-served or dry run)"
        if not args.no_served and not dry:
            report.served_status = "running"
            report.served_status = served(dirs[big], work, [c for c in concurrency if c <= 16], frames,
                                          args.results if not args.no_results else os.devnull,
                                          args.served_timeout, args.placement)
        log(f"served: {report.served_status}")


def measure_in_process(report: CheckReport, dirs: dict[str, str], concurrency: list[int], graph_sizes: list[int],
                       schedule: CodecChunkSchedule, max_model_len: int) -> None:
    """Steps 2-4: graph parity, the 0.6B memory check and the in-process 1.7B benchmark."""
    dry, device, dtype, small, big, frames = (report.dry, report.device, report.dtype, report.small, report.big,
                                              report.frames)
    problems = report.problems
    # 2. parity (1.7B shape): graphs vs enforce_eager, buckets 1, 2, 4 with c = 1, 3 (padded), 4,
    # greedy and with seeded sampling (the in-graph noise)
    log("parity: codes with CUDA graphs vs the same step eager")
    try:
        report.parity = greedy_graph_parity(dirs[big], device=device, dtype=dtype, concurrency=(1, 3, 4),
                                            frames=min(frames, 24), cuda_graph_sizes=[1, 2, 4],
                                            max_model_len=max_model_len, sample_concurrency=(3,))
    except Exception as exc:  # report it and go on to the benchmarks
        log(f"  parity check raised {type(exc).__name__}: {exc}")
        problems.append(f"parity check raised {type(exc).__name__}: {exc}")
    parity = report.parity
    if device.startswith("cuda") and parity["graphs"] == 0:
        problems.append("no CUDA graph was captured (capture failed: see the log; the engine ran eagerly)")
    for level in parity["levels"]:
        log(f"  c={level['concurrency']}{' sampled' if level.get('sample') else ''}: {level['frames']} frames, "
            f"equal={level['equal']}"
            + (f" (first mismatch: {level['first_mismatch']})" if level["first_mismatch"] else ""))
    if parity["levels"] and not parity["ok"]:
        problems.append("graph vs eager parity FAILED")
    log(f"  capture + warm-up: {parity['capture_s']:.2f} s for {parity['graphs']} graphs")

    # 3. memory (0.6B pipeline, max_num_seqs 16)
    log(f"memory: {small} pipeline, max_num_seqs 16, 16 streams")
    report.memory["max_model_len"] = max_model_len if dry else 2048
    try:
        report.memory = memory_check(dirs[small], device, dtype, frames, schedule,
                                     max_model_len if dry else 2048, [1, 2, 4, 8, 16])
    except Exception as exc:  # report it and go on to the benchmark
        problems.append(f"memory check raised {type(exc).__name__}: {exc}")
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    log("  " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in report.memory.items()))

    # 4. in-process benchmark (1.7B)
    log(f"in-process: {big}, c={concurrency}, {frames} frames per request")
    started_load = time.perf_counter()
    engine = create_engine(dirs[big], max_num_seqs=max(concurrency), max_model_len=max_model_len, dtype=dtype,
                           device=device, cuda_graph_sizes=graph_sizes, max_prefills_per_step=max(concurrency),
                           static_step=_static(device))
    report.capture_s = time.perf_counter() - started_load
    report.buckets = engine.runner.graphs.sizes if engine.runner.graphs is not None else []
    decoder = Code2Wav.from_checkpoint(os.path.join(dirs[big], "speech_tokenizer"), device=device)
    codec_graphs = Code2WavGraphs(decoder, windows=schedule.full_window_shapes(), batch_sizes=graph_sizes,
                                  enabled=device.startswith("cuda") or dry)
    started_codec = time.perf_counter()
    if device.startswith("cuda"):
        try:
            codec_graphs.capture()
        except Exception as exc:  # optional: fall back to the eager decoder
            problems.append(f"code2wav graph capture failed ({type(exc).__name__}: {exc})")
            codec_graphs.graphs.clear()
    report.codec_capture_s = time.perf_counter() - started_codec
    report.codec_graphs = len(codec_graphs.graphs)
    log(f"  code2wav graphs: {report.codec_graphs} captured in {report.codec_capture_s:.1f} s")
    report.codec_parity = codec_graph_parity(decoder, codec_graphs, schedule)
    log(f"  code2wav graph vs eager (same padded batch): max abs diff {report.codec_parity:.3g}")
    if report.codec_parity != 0:
        problems.append(f"code2wav graph vs eager differ by {report.codec_parity:.3g}")
    run_pipeline(engine, decoder, schedule, 1, 4, device, "warm", codec_graphs)
    for c in concurrency:
        try:
            row = run_pipeline(engine, decoder, schedule, c, frames, device, f"c{c}", codec_graphs)
            row["step_ms"] = step_ms(engine, c, min(frames, 40), device)
        except Exception as exc:  # keep the levels measured so far
            problems.append(f"in-process c={c} raised {type(exc).__name__}: {exc}")
            log(f"  c={c}: {problems[-1]}")
            break
        report.rows.append(row)
        log(f"  c={c}: TTFA p50 {row['ttfa_p50_ms']:.1f} ms p95 {row['ttfa_p95_ms']:.1f} ms, "
            f"RTF p50 {row['rtf_p50']:.3f}, {row['audio_s_per_s']:.1f} audio s/s, step {row['step_ms']:.2f} ms")
    del engine
    try:
        eager = create_engine(dirs[big], max_num_seqs=4, max_model_len=max_model_len, dtype=dtype,
                              device=device, cuda_graph_sizes=[1, 4], enforce_eager=True,
                              static_step=_static(device))
        report.eager_step = {c: step_ms(eager, c, min(frames, 40), device) for c in (1, 4)}
        del eager
    except Exception as exc:
        problems.append(f"eager step raised {type(exc).__name__}: {exc}")
    log(f"  eager (no graphs) step: c=1 {report.eager_step[1]:.2f} ms, c=4 {report.eager_step[4]:.2f} ms")
    del decoder


if __name__ == "__main__":
    sys.exit(main())
