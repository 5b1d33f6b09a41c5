"""Qwen3-Omni streaming benchmark (called by perf/bench.py for the qwen3_omni family).

    .venv/bin/python perf/bench.py --pipeline qwen3_omni_tiny_random --concurrency 1,4,8 --reference
    .venv/bin/python perf/bench.py --pipeline qwen3_omni --model /path/to/Qwen3-Omni-30B-A3B-Instruct

For each concurrency c, c clients stream chat turns back to back over gRPC (greedy thinker and
talker) and the table gives time to the first text delta (TTFT) and to the first audio (TTFA),
p50 / p95, the real-time factor (p50), audio seconds per wall second and errors. With
`--reference` the same turns run through the reference (transformers' `qwen3_omni_moe`
`generate()` in .venv-omni-oracle, one at a time, in its own process, `--reference-threads`
threads): it returns text and audio only when the whole answer is done, so its TTFT and TTFA are
its whole time per turn. The ratios come from one run on one machine.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit.load import run_clients
from benchkit.paths import ROOT, venv_python
from benchkit.percentiles import percentile
from benchkit.report import markdown_table, publish
from benchkit.served import served
from benchkit.versions import machine, versions

# the reference generate(), in its own venv (make omni-oracle), run as a script over a jobs file
ORACLE_PYTHON = venv_python(".venv-omni-oracle")
ORACLE_SCRIPT = ROOT / "tests" / "oracle" / "qwen3_omni_reference.py"

PROMPTS = [
    "Hello! Can you tell me a short story about a robot?",
    "What is the capital of France, and what is it famous for?",
    "你好，请用一句话介绍一下你自己。",
    "Give me three tips for sleeping well.",
]


def _stream(url: str, model: str, text: str, params: dict) -> dict:
    from client.triton_stream import stream_parts

    t0 = time.perf_counter()
    ttft = ttfa = None
    samples, rate = 0, 24000
    for part in stream_parts(url, model, text, params, timeout_s=900):
        now = time.perf_counter() - t0
        if "TEXT_DELTA" in part.outputs and ttft is None:
            ttft = now
        if part.audio is not None and part.audio.size:
            ttfa = now if ttfa is None else ttfa
            samples += part.audio.size
            rate = part.sample_rate or rate
    total = time.perf_counter() - t0
    audio_s = samples / rate
    return {"ttft": ttft, "ttfa": ttfa, "total": total, "audio_s": audio_s,
            "rtf": total / audio_s if audio_s else float("nan")}


def run_level(url: str, model: str, concurrency: int, requests: int, params: dict) -> dict:
    results, errors, wall = run_clients(concurrency, requests,
                                        lambda k, i: _stream(url, model, PROMPTS[(k + i) % len(PROMPTS)], params))
    ms = lambda key, q: percentile([r[key] * 1000 for r in results if r[key] is not None], q)  # noqa: E731
    return {"c": concurrency, "requests": len(results), "errors": len(errors),
            "ttft_p50": ms("ttft", 50), "ttft_p95": ms("ttft", 95), "ttfa_p50": ms("ttfa", 50),
            "ttfa_p95": ms("ttfa", 95), "rtf_p50": percentile([r["rtf"] for r in results], 50),
            "audio_s_per_s": sum(r["audio_s"] for r in results) / wall, "first_error": errors[0] if errors else ""}


def reference(model: str, params: dict, threads: int, work: Path) -> dict:
    """The reference generate() over the prompts, one at a time: per-turn seconds and audio."""
    jobs = [{"id": f"p{i}", "prompt": p, "speaker": params["speaker"], "thinker_max_new_tokens": params["max_tokens"],
             "talker_max_new_tokens": params["talker_max_new_tokens"]} for i, p in enumerate(PROMPTS)]
    (work / "jobs.json").write_text(json.dumps(jobs, ensure_ascii=False))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(ORACLE_PYTHON), str(ORACLE_SCRIPT), "--checkpoint", model,
                           "--jobs", str(work / "jobs.json"), "--out", str(work / "reference"),
                           "--threads", str(threads)], capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"reference failed: {proc.stderr[-2000:]}")
    report = json.loads((work / "reference" / "reference.json").read_text())
    runs = list(report["jobs"].values())
    seconds = [r["seconds"] for r in runs]
    audio = [r.get("samples", 0) / 24000 for r in runs]
    return {"seconds_p50": sorted(seconds)[len(seconds) // 2] * 1000,
            "rtf_p50": sorted(s / a for s, a in zip(seconds, audio) if a)[len(runs) // 2],
            "audio_s_per_s": sum(audio) / sum(seconds), "load_s": report["meta"]["load_seconds"]}


def omni_bench(args, argv, pipeline, deploy_path: str, levels: list[int]) -> int:
    from ensemble_builder.build import build
    from omni_backend.models.qwen3_omni.builtin import resolve_checkpoint

    model = resolve_checkpoint(args.model or pipeline.default_model)
    work = Path(tempfile.mkdtemp(prefix="omni-bench-"))
    params = {"do_sample": False, "talker_do_sample": False, "speaker": "ethan", "max_tokens": args.tokens,
              "talker_max_new_tokens": args.frames + 1}
    repo = work / "repo"
    build(args.pipeline, repo, deploy_path, args.model)
    rows = []
    with served(repo, work / "tritonserver.log") as run:
        _stream(run.grpc_url, args.pipeline, "Warm up.", params)
        for c in levels:
            print(f"[bench] served c={c}", flush=True)
            rows.append(run_level(run.grpc_url, args.pipeline, c, args.requests, params))
    ref = None
    if args.reference:
        print("[bench] reference generate()", flush=True)
        ref = reference(model, params, args.reference_threads, work)

    command = f"python perf/bench.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    head = (f"## {args.pipeline} ({Path(model).name}), {datetime.date.today()}\n\n"
            f"Machine: {machine()}; {versions(run.triton_version)}; deploy "
            f"`{Path(deploy_path).name}`; greedy, at most {args.tokens} answer tokens and {args.frames} frames per "
            f"turn. Server start-up {run.startup_s:.1f} s, resident memory {run.rss_mib:.0f} MiB (server + stubs). "
            f"Command: `{command}`\n")
    if ref:
        head += (f"\nReference (transformers `generate()`, {args.reference_threads} threads, one turn at a time, "
                 f"whole answer at the end): {ref['seconds_p50']:.0f} ms per turn p50 (= its TTFT and TTFA), "
                 f"RTF p50 {ref['rtf_p50']:.3f}, {ref['audio_s_per_s']:.2f} audio s/s.\n")
    cols = ["c", "requests", "errors", "TTFT p50 ms", "TTFT p95 ms", "TTFA p50 ms", "TTFA p95 ms", "RTF p50",
            "audio s/s"]
    if ref:
        cols += ["reference / served TTFA p50", "served / reference audio s/s"]
    cells = []
    for r in rows:
        row = [r["c"], r["requests"], r["errors"], f"{r['ttft_p50']:.0f}", f"{r['ttft_p95']:.0f}",
               f"{r['ttfa_p50']:.0f}", f"{r['ttfa_p95']:.0f}", f"{r['rtf_p50']:.3f}", f"{r['audio_s_per_s']:.2f}"]
        if ref:
            row += [f"{ref['seconds_p50'] / r['ttfa_p50']:.1f}", f"{r['audio_s_per_s'] / ref['audio_s_per_s']:.2f}"]
        cells.append(row)
    table = head + "\n" + markdown_table(cols, cells)
    errors = [r["first_error"] for r in rows if r["first_error"]]
    if errors:
        table += "\nFirst error: " + errors[0] + "\n"
    publish(table, args.results)
    return 0
