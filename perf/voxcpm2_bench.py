"""VoxCPM2 streaming benchmark (called by perf/bench.py for the voxcpm2 family).

    .venv/bin/python perf/bench.py --pipeline voxcpm2_tiny_random --concurrency 1,4,8,16 --rate 1,2,4 \
        --deploy deploy/voxcpm2_tiny_random.batched.yaml

Served through Triton: for each concurrency c, c clients stream requests back to back; for each
rate r, requests arrive at r per second (open loop, ``--rate-requests`` of them). Each request is
bounded to ``--patches`` LM steps (``min_len`` = patches - 2, ``max_len`` = patches: random weights
stop at random). The table gives time to first audio (p50 / p95), real-time factor (p50), audio
seconds per wall second and errors. The reference (voxcpm 2.0.3's own ``generate_streaming``, in
.venv-voxcpm-oracle, one request at a time, same texts and bounds) is timed in the same run
(perf/voxcpm2_reference_timing.py), so the ratios come from one machine.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchkit.load import run_arrivals, run_clients
from benchkit.paths import venv_python
from benchkit.percentiles import percentile
from benchkit.report import markdown_table, publish
from benchkit.served import served
from benchkit.texts import TEXTS
from benchkit.versions import machine, versions

PERF = Path(__file__).resolve().parent


def _row(label: str, results: list, errors: list, wall: float) -> dict:
    audio = sum(r.audio_s for r in results)
    return {"level": label, "requests": len(results), "errors": len(errors),
            "ttfa_p50_ms": percentile([r.ttfa_s * 1000 for r in results], 50),
            "ttfa_p95_ms": percentile([r.ttfa_s * 1000 for r in results], 95),
            "rtf_p50": percentile([r.rtf for r in results], 50),
            "audio_s_per_s": audio / wall if wall else 0.0, "first_error": errors[0] if errors else ""}


def reference_timing(checkpoint: str, texts: list[str], min_len: int, max_len: int, threads: int) -> dict:
    python = venv_python(".venv-voxcpm-oracle")
    if not python.exists():
        return {}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(python), str(PERF / "voxcpm2_reference_timing.py"), "--checkpoint",
                           checkpoint, "--texts-json", json.dumps(texts), "--min-len", str(min_len),
                           "--max-len", str(max_len), "--threads", str(threads)],
                          capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"reference timing failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    audio = sum(r["audio_s"] for r in rows)
    total = sum(r["total_s"] for r in rows)
    return {"ttfa_p50_ms": percentile([r["ttfa_s"] * 1000 for r in rows], 50),
            "rtf_p50": percentile([r["total_s"] / r["audio_s"] for r in rows if r["audio_s"]], 50),
            "audio_s_per_s": audio / total if total else 0.0, "requests": len(rows)}


def voxcpm2_bench(args, argv, pipeline, deploy_path: str, levels: list[int]) -> int:
    from client.triton_stream import synthesize
    from ensemble_builder.build import build
    from omni_backend.models.voxcpm2.builtin import resolve_checkpoint

    model = resolve_checkpoint(args.model or pipeline.default_model)
    work = Path(tempfile.mkdtemp(prefix="omni-bench-"))
    repo = work / "repo"
    build(args.pipeline, repo, deploy_path, model if args.model else None)
    patches = args.patches
    params = {"min_len": max(0, patches - 2), "max_len": patches, "seed": 0}
    rates = [float(r) for r in args.rate.split(",") if r]
    rows = []
    with served(repo, work / "tritonserver.log") as run:
        url = run.grpc_url
        synthesize(url, args.pipeline, "Warm up.", params)
        for c in levels:
            print(f"[bench] c={c}", flush=True)
            rows.append(_row(f"c={c}", *run_clients(c, args.requests, lambda k, i: synthesize(
                url, args.pipeline, TEXTS[(k + i) % len(TEXTS)], {**params, "seed": k * 1000 + i}))))
        for r in rates:
            print(f"[bench] {r:g} req/s", flush=True)
            # evenly spaced arrivals, each request seeded by its number
            rows.append(_row(f"{r:g} req/s", *run_arrivals(r, args.rate_requests, lambda k, i: synthesize(
                url, args.pipeline, TEXTS[i % len(TEXTS)], {**params, "seed": 5000 + i}), poisson=False)))
    print("[bench] reference", flush=True)
    ref = reference_timing(model, TEXTS, params["min_len"], params["max_len"], args.reference_threads)

    shape = "random tiny (builtin)" if not args.model else Path(model).name
    head = (f"## {args.pipeline} ({shape}), {datetime.date.today()}\n\n"
            f"Machine: {machine()}; {versions(run.triton_version)}; deploy "
            f"`{Path(deploy_path).name}`; {patches} LM steps (patches) per request at most. Server start-up "
            f"{run.startup_s:.1f} s, resident memory {run.rss_mib:.0f} MiB (server + stubs). Command: `python perf/bench.py "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    cols = ["level", "requests", "errors", "TTFA p50 ms", "TTFA p95 ms", "RTF p50", "audio s/s"]
    cells = [[r["level"], r["requests"], r["errors"], f"{r['ttfa_p50_ms']:.0f}", f"{r['ttfa_p95_ms']:.0f}",
              f"{r['rtf_p50']:.3f}", f"{r['audio_s_per_s']:.2f}"] for r in rows]
    if ref:
        cells.append(["reference in-process, one at a time", ref["requests"], 0, f"{ref['ttfa_p50_ms']:.0f}", "",
                      f"{ref['rtf_p50']:.3f}", f"{ref['audio_s_per_s']:.2f}"])
    table = head + "\n" + markdown_table(cols, cells)
    by_level = {r["level"]: r for r in rows}
    if "c=1" in by_level and "c=8" in by_level and by_level["c=1"]["audio_s_per_s"]:
        table += (f"\naudio s/s at c=8 / c=1: "
                  f"{by_level['c=8']['audio_s_per_s'] / by_level['c=1']['audio_s_per_s']:.2f}\n")
    if any(r["first_error"] for r in rows):
        table += "\nFirst error: " + next(r["first_error"] for r in rows if r["first_error"]) + "\n"
    publish(table, args.results)
    return 0
