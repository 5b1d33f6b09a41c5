"""Streaming benchmark through Triton, with in-process and reference ratios from the same run.

    .venv/bin/python perf/bench.py --pipeline hibari --concurrency 1,4,8
    .venv/bin/python perf/bench.py --pipeline qwen3_tts --size small --concurrency 1,4,8
    .venv/bin/python perf/bench.py --pipeline qwen3_tts_tiny_random --concurrency 1,4,8 --rate 1,2,4 --breakdown
    .venv/bin/python perf/bench.py --pipeline qwen3_tts --model /path/to/checkpoint --concurrency 1,4,8,16
    .venv/bin/python perf/bench.py --pipeline orpheus_tiny_random --engine vllm,torch --concurrency 1,4,8,16
    .venv/bin/python perf/bench.py --pipeline qwen3_omni_tiny_random --concurrency 1,4,8 --reference
    .venv/bin/python perf/bench.py --pipeline voxcpm2_tiny_random --concurrency 1,4,8,16 --rate 1,2,4 \
        --deploy deploy/voxcpm2_tiny_random.batched.yaml

For each concurrency c, c clients stream requests back to back over gRPC (tritonclient) from a
fixed set of texts, each on one connection it keeps (as perf_analyzer's clients do); with
`--rate R1,R2`, requests instead arrive as a Poisson process of R requests per second
(`--rate-requests` of them per rate, each on a connection of its own), as an open-loop load does.
The table gives, with vLLM-Omni's names, `audio_ttfp` (time to the first audio packet, p50 / p95),
`audio_rtf` (a request's wall time over its audio's duration, p50), audio seconds per
wall second, what a listener hears (a player that starts at the first audio,
omni_backend/playback.py): underrun (its total wait, p50 and max over requests) and the
continuity rate (streams whose worst gap is under 100 ms), and errors. For Qwen3-TTS each
level also gives served minus in-process TTFA, and `--breakdown` times first audio part by part
at c = 1 (perf/ttfa_breakdown.py: the engine and the decoder in-process, each stage alone through
Triton, the pipeline), which says how much of the difference is each stage's hop and how much the
entry's. For Qwen3-TTS the same requests also run in-process
(engine + code2wav in this process, same chunk schedule) and, with --reference, through the
reference `generate()` (qwen-tts in .venv-oracle), so the ratios come from one run on one machine.
For Orpheus each engine in `--engine` is served in turn (the deploy's stage 0 switched to it) and
the LM's tokens/s is set against plain vLLM `LLM.generate` on the same checkpoint with the
worker's engine arguments (perf/vllm_generate.py, in .venv-vllm): served / plain is our overhead.
For Qwen3-Omni (perf/omni_bench.py) the table adds the time to the first text delta, and
`--reference` times transformers' `generate()` on the same turns. For VoxCPM2 (perf/voxcpm2_bench.py)
`--rate` adds open-loop arrival rates as for the other families, and the reference's own streaming generator is timed in the
same run.
The server's start-up time and resident memory (server + stub processes) are reported too.
Results are printed and appended to perf/JOURNAL.md (`--results`) as a dated markdown entry;
perf/RESULTS.md holds the current figures.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit.load import run_arrivals, run_clients
from benchkit.paths import JOURNAL, ROOT, venv_python
from benchkit.percentiles import percentile
from benchkit.served import served, unwind_on_sigterm
from benchkit.texts import TEXTS
from benchkit.versions import versions
from client.triton_stream import StreamSession, synthesize

PERF = ROOT / "perf"


def level_row(results: list, errors: list[str], wall: float) -> dict:
    """A level's figures from its requests' results (client.triton_stream.StreamResult)."""
    audio = sum(r.audio_s for r in results)
    plays = [r.playback for r in results]
    return {"requests": len(results), "errors": len(errors),
            "ttfa_p50_ms": percentile([r.ttfa_s * 1000 for r in results], 50),
            "ttfa_p95_ms": percentile([r.ttfa_s * 1000 for r in results], 95),
            "rtf_p50": percentile([r.rtf for r in results], 50),
            "underrun_p50_s": percentile([p.underrun_s for p in plays], 50),
            "underrun_max_s": max((p.underrun_s for p in plays), default=float("nan")),
            "worst_gap_max_s": max((p.worst_gap_s for p in plays), default=float("nan")),
            "continuity": sum(p.continuous for p in plays) / len(plays) if plays else float("nan"),
            "audio_s_per_s": audio / wall, "audio_s": audio, "wall_s": wall,
            "first_error": errors[0] if errors else ""}


class Requests:
    """`one(client, i)`: the i-th request of a client, from the fixed texts (seeded when sampling).
    With `keep_connections`, each client keeps one connection and stream for all its requests (a
    StreamSession, as perf_analyzer's clients do), so its times leave out opening them; otherwise
    each request opens its own (the open-loop arrivals: each is a new client)."""

    def __init__(self, url: str, model: str, params: dict, keep_connections: bool):
        self.url, self.model, self.params, self.keep = url, model, params, keep_connections
        self.sessions: dict[int, StreamSession] = {}   # by client; each client is one thread

    def __call__(self, k: int, i: int):
        text = TEXTS[(k + i) % len(TEXTS)]
        params = {**self.params, **({"seed": k * 1000 + i} if "seed" in self.params else {})}
        if not self.keep:
            return synthesize(self.url, self.model, text, params)
        if k not in self.sessions:
            self.sessions[k] = StreamSession(self.url)
        return self.sessions[k].synthesize(self.model, text, params)

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()


def run_level(url: str, model: str, concurrency: int, requests: int, params: dict) -> dict:
    """`concurrency` clients, each streaming `requests` requests back to back on its connection."""
    one = Requests(url, model, params, keep_connections=True)
    try:
        results, errors, wall = run_clients(concurrency, requests, one)
    finally:
        one.close()
    return {"concurrency": concurrency, **level_row(results, errors, wall)}


def run_rate(url: str, model: str, rate: float, requests: int, params: dict) -> dict:
    """`requests` requests arriving as a Poisson process of `rate` per second."""
    results, errors, wall = run_arrivals(rate, requests, Requests(url, model, params, keep_connections=False))
    return {"rate": rate, **level_row(results, errors, wall)}


LISTENER_COLUMNS = ["audio_ttfp p50 ms", "audio_ttfp p95 ms", "audio_rtf p50", "audio s/s",
                    "underrun p50 s", "underrun max s", "worst gap ms", "continuity"]


def listener_cells(r: dict) -> list[str]:
    return [f"{r['ttfa_p50_ms']:.0f}", f"{r['ttfa_p95_ms']:.0f}", f"{r['rtf_p50']:.3f}",
            f"{r['audio_s_per_s']:.2f}", f"{r['underrun_p50_s']:.3f}", f"{r['underrun_max_s']:.3f}",
            f"{r['worst_gap_max_s'] * 1000:.0f}", f"{r['continuity'] * 100:.0f} %"]


def serve_levels(repo: Path, pipeline: str, levels: list[int], requests: int, params: dict, log: Path,
                 label: str, rates: tuple[list[float], int] = ([], 0),
                 then=None) -> tuple[float, float, str, list[dict]]:
    """Start a server on `repo`, warm it up, run every level (then every Poisson rate of
    `rates`: (rates, requests per rate), then `then(grpc url)` if given); (start-up s, resident
    MiB of the server and its stubs (and their children), Triton version, rows)."""
    rows = []
    with served(repo, log) as run:
        synthesize(run.grpc_url, pipeline, "Warm up.", params)
        for c in levels:
            print(f"[bench] {label} c={c}", flush=True)
            rows.append(run_level(run.grpc_url, pipeline, c, requests, params))
        for rate in rates[0]:
            print(f"[bench] {label} {rate:g} requests/s", flush=True)
            rows.append(run_rate(run.grpc_url, pipeline, rate, rates[1], params))
        if then is not None:
            then(run.grpc_url)
    return run.startup_s, run.rss_mib, run.triton_version, rows


def qwen3_in_process(model_dir: str, deploy_path: str, concurrency: int, params: dict) -> dict:
    """Engine + code2wav in this process, same schedule: the served path minus Triton."""
    import dataclasses

    import torch

    from omni_backend.deploy import load_deploy
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav
    from omni_backend.models.qwen3_tts.runner import create_engine
    from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request

    deploy = load_deploy(deploy_path)
    s0, s1 = deploy.stage(0), deploy.stage(1)
    torch.set_num_threads(s0.threads)
    engine = create_engine(model_dir, max_num_seqs=s0.max_num_seqs,
                           max_model_len=s0.max_model_len, dtype=s0.dtype, device=s0.device,
                           cuda_graph_sizes=s0.cuda_graph_sizes, enforce_eager=s0.enforce_eager,
                           batch_invariant=s0.batch_invariant, max_prefills_per_step=s0.max_prefills_per_step)
    decoder = Code2Wav.from_checkpoint(os.path.join(model_dir, "speech_tokenizer"), device=s1.device)
    decoder.batch_invariant = s1.batch_invariant
    builder = engine.runner.checkpoint.prompt_builder()
    sp = sampling_params_from_request(engine.default_params, params)   # the talker stage's mapping
    a = deploy.async_chunk
    schedule = a.chunk_schedule()
    speaker = params.get("voice") or (builder.speakers[0] if builder.speakers else None)
    prompts = [builder.build(TEXTS[k % len(TEXTS)], speaker=speaker) for k in range(concurrency)]
    engine.generate([("warm", prompts[0], dataclasses.replace(sp, max_new_tokens=3))])
    # Time to first audio per request: arrival (all together) to its first window decoded, which
    # happens inline, as soon as the request has its initial chunk, like the served path.
    started = time.perf_counter()
    frames: dict[str, list] = {}
    ttfa: list[float] = []
    for k, p in enumerate(prompts):
        engine.add_request(f"r{k}", p, sp)
    first = schedule.next_window(0, a.initial_chunk_frames, False)
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.codes is not None:
                frames.setdefault(ev.request_id, []).append(ev.codes)
                if len(frames[ev.request_id]) == a.initial_chunk_frames:
                    decoder.decode_window(torch.tensor(frames[ev.request_id]).T[None], first.left_context_frames)
                    ttfa.append(time.perf_counter() - started)
    torch.set_num_threads(s1.threads)
    for codes in frames.values():
        list(decoder.decode_stream(torch.tensor(codes).T[None], schedule))
    wall = time.perf_counter() - started
    audio = sum(len(c) for c in frames.values()) * decoder.hop_length / decoder.sample_rate
    return {"concurrency": concurrency, "ttfa_ms": percentile(ttfa, 50) * 1000,
            "audio_s_per_s": audio / wall, "rtf": wall / (audio / concurrency)}


def reference_audio_s_per_s(model_dir: str, batch: int, frames: int) -> float:
    """The reference generate() (qwen-tts, static batch) + its decode, in .venv-oracle."""
    py = venv_python(".venv-oracle")
    if not py.exists():
        return float("nan")
    script = f"""
import time, torch, os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from qwen_tts import Qwen3TTSModel
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
tts = Qwen3TTSModel.from_pretrained({model_dir!r}, dtype=torch.float32, attn_implementation="sdpa")
texts = {json.dumps(TEXTS)}
texts = [texts[i % len(texts)] for i in range({batch})]
spk = tts.get_supported_speakers()
kw = dict(do_sample=False, subtalker_dosample=False, max_new_tokens={frames + 1})
tts.generate_custom_voice(text=texts[0], speaker=spk[0], language="Auto", max_new_tokens=3)
t = time.perf_counter()
wavs, sr = tts.generate_custom_voice(text=texts, speaker=[spk[0]] * len(texts), language=["Auto"] * len(texts), **kw)
wall = time.perf_counter() - t
print(sum(len(w) for w in wavs) / sr / wall)
"""
    out = subprocess.run([str(py), "-c", script], capture_output=True, text=True, timeout=3600)
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(out.stderr[-2000:], file=sys.stderr)
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipeline", default="hibari", help="hibari | qwen3_tts | qwen3_tts_tiny_random")
    ap.add_argument("--model", help="checkpoint folder (qwen3_tts)")
    ap.add_argument("--size", help="write a random Qwen3-TTS checkpoint of this size (tiny, small, 0.6b, 1.7b)")
    ap.add_argument("--deploy", help="deploy YAML (default: the pipeline's)")
    ap.add_argument("--concurrency", default="1,4,8", help="closed-loop levels ('' for none)")
    ap.add_argument("--rate", default="", help="open-loop levels: Poisson arrivals, requests per second (1,2,4)")
    ap.add_argument("--rate-requests", type=int, default=16, help="requests per rate")
    ap.add_argument("--requests", type=int, default=3, help="requests per client per level")
    ap.add_argument("--frames", type=int, default=50, help="frames per Qwen3-TTS request (at most: random weights seldom emit eos)")
    ap.add_argument("--reference", action="store_true", help="also time the reference generate() (slow)")
    ap.add_argument("--breakdown", action="store_true",
                    help="qwen3_tts: where served first audio goes beyond in-process, at c = 1 (perf/ttfa_breakdown.py)")
    ap.add_argument("--engine", default="vllm,torch", help="orpheus: engines of the LM stage, served in turn")
    ap.add_argument("--tokens", type=int, default=280, help="LM tokens per Orpheus request (random weights never "
                                                            "stop); Qwen3-Omni: the thinker's answer limit")
    ap.add_argument("--reference-threads", type=int, default=2, help="qwen3_omni: threads of the reference process")
    ap.add_argument("--patches", type=int, default=24, help="voxcpm2: LM steps per request at most")
    ap.add_argument("--results", default=str(JOURNAL), help="where the dated entry is appended")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    rates = [float(r) for r in args.rate.split(",") if r]

    from ensemble_builder.build import build
    from omni_backend.deploy import default_deploy_path
    from omni_backend.families import get_pipeline

    pipeline = get_pipeline(args.pipeline)
    deploy_path = args.deploy or str(default_deploy_path(pipeline.default_deploy))
    if args.breakdown and pipeline.family == "qwen3_tts":
        from omni_backend.deploy import load_deploy

        if load_deploy(deploy_path).stage(0).process == "entry":
            ap.error(f"--breakdown: {deploy_path} runs the talker in the entry's process (stages[0].process: entry), "
                     "so it has no talker model to time alone; give a deploy with the talker as a model of its own "
                     "(e.g. deploy/qwen3_tts.two_stage.yaml), or time the placements with perf/code2wav_placement.py")
    if pipeline.family == "orpheus":
        return orpheus_bench(args, argv, pipeline, deploy_path, levels)
    if pipeline.family == "voxcpm2":
        from voxcpm2_bench import voxcpm2_bench

        return voxcpm2_bench(args, argv, pipeline, deploy_path, levels)
    if pipeline.family == "qwen3_omni":
        from omni_bench import omni_bench

        return omni_bench(args, argv, pipeline, deploy_path, levels)
    model = args.model
    shape = "bundled"
    work = Path(tempfile.mkdtemp(prefix="omni-bench-"))
    if pipeline.family == "qwen3_tts":
        from omni_backend.models.qwen3_tts.builtin import cache_root, resolve_checkpoint
        from omni_backend.models.qwen3_tts.random_checkpoint import write_random_checkpoint

        if args.size:
            model = str(cache_root() / f"bench-{args.size}")
            if not (Path(model) / "config.json").exists():
                print(f"[bench] writing a random {args.size} checkpoint to {model}", flush=True)
                write_random_checkpoint(model, args.size, "custom_voice", 0)
            shape = f"random {args.size}"
        model = resolve_checkpoint(model or pipeline.default_model)
        if shape == "bundled":
            shape = Path(model).name
    repo = work / "repo"
    build(args.pipeline, repo, deploy_path, model if pipeline.family == "qwen3_tts" else None)
    params: dict = {}
    if pipeline.family == "qwen3_tts":
        params = {"do_sample": False, "subtalker_do_sample": False, "max_new_tokens": args.frames + 1}

    unwind_on_sigterm()
    parts: dict = {}

    def breakdown(url: str) -> None:
        from ttfa_breakdown import ttfa_breakdown

        print("[bench] first-audio breakdown at c = 1", flush=True)
        parts.update(ttfa_breakdown(url, args.pipeline, model, deploy_path, TEXTS[0], params))

    startup, rss, triton_version, rows = serve_levels(repo, args.pipeline, levels, args.requests, params,
                                                      work / "tritonserver.log", "served",
                                                      (rates, args.rate_requests),
                                                      breakdown if args.breakdown and pipeline.family == "qwen3_tts"
                                                      else None)
    rate_rows = [r for r in rows if "rate" in r]
    rows = [r for r in rows if "concurrency" in r]

    inproc: dict[int, dict] = {}
    ref: dict[int, float] = {}
    if pipeline.family == "qwen3_tts":
        for c in levels:
            print(f"[bench] in-process c={c}", flush=True)
            inproc[c] = qwen3_in_process(model, deploy_path, c, params)
            if args.reference and c in (1, 8):
                print(f"[bench] reference static batch {c}", flush=True)
                ref[c] = reference_audio_s_per_s(model, c, args.frames)

    head = (f"## {args.pipeline} ({shape}), {datetime.date.today()}\n\n"
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs; {versions(triton_version)}; "
            f"checkpoint: {shape}; deploy `{Path(deploy_path).name}`. Server start-up {startup:.1f} s, resident memory "
            f"{rss:.0f} MiB (server + stubs, after the run). Command: `python perf/bench.py "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    cols = ["c", "requests", "errors"] + LISTENER_COLUMNS
    if inproc:
        cols += ["in-proc TTFA p50 ms", "served - in-proc TTFA p50 ms", "in-proc audio s/s", "served/in-proc RTF"]
    if ref:
        cols += ["reference audio s/s", "served/reference audio s/s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        c = r["concurrency"]
        cells = [c, r["requests"], r["errors"], *listener_cells(r)]
        if inproc:
            ip = inproc[c]
            cells += [f"{ip['ttfa_ms']:.0f}", f"{r['ttfa_p50_ms'] - ip['ttfa_ms']:.0f}", f"{ip['audio_s_per_s']:.2f}",
                      f"{r['rtf_p50'] / ip['rtf']:.2f}"]
        if ref:
            cells += [f"{ref[c]:.2f}" if c in ref else "", f"{r['audio_s_per_s'] / ref[c]:.2f}" if c in ref else ""]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    table = head + "\n" + ("\n".join(lines) + "\n" if rows else "")
    if rate_rows:
        cols = ["requests/s (Poisson)", "requests", "errors"] + LISTENER_COLUMNS
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(str(x) for x in [f"{r['rate']:g}", r["requests"], r["errors"], *listener_cells(r)])
                  + " |" for r in rate_rows]
        table += "\n" + "\n".join(lines) + "\n"
    if parts:
        from ttfa_breakdown import breakdown_table

        table += ("\nFirst audio at c = 1, part by part (perf/ttfa_breakdown.py; 10 requests each, "
                  "p50):\n\n" + breakdown_table(parts) + "\n")
    if any(r["first_error"] for r in rows + rate_rows):
        table += "\nFirst error: " + next(r["first_error"] for r in rows + rate_rows if r["first_error"]) + "\n"
    print("\n" + table)
    with open(args.results, "a") as f:
        f.write("\n" + table)
    return 0


ENGINE_ONLY_KEYS = {"torch": ("block_size", "gpu_memory_utilization"), "vllm": ("max_prefills_per_step", "batch_invariant")}


def deploy_for_engine(deploy_path: str, engine: str, out: Path) -> Path:
    """The deploy YAML with its AR stage (stage 0) on `engine` and the other engine's keys dropped."""
    import yaml

    raw = yaml.safe_load(Path(deploy_path).read_text())
    stage = next(s for s in raw["stages"] if s.get("stage_id", 0) == 0)
    stage["engine"] = engine
    for key in ENGINE_ONLY_KEYS[engine]:
        stage.pop(key, None)
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def plain_vllm(model: str, deploy_path: str, levels: list[int], requests: int, served_params: dict, work: Path) -> dict:
    """perf/vllm_generate.py in vLLM's venv with the stage's engine options: tokens/s per level."""
    from omni_backend.deploy import load_deploy
    from omni_backend.engine.vllm_engine import engine_options, vllm_python, worker_sampling
    from omni_backend.models.orpheus.sampling import default_params, params_from_request, stop_token_ids
    from omni_backend.models.orpheus.tokens import OrpheusPrompt

    prompt = OrpheusPrompt(model)
    stage = load_deploy(deploy_path).stage(0)
    # the served requests' sampling: the stage's defaults under the bench's parameters
    sampling = params_from_request(default_params(model, stage.default_sampling_params), served_params)
    eos = stop_token_ids(model, prompt.tokens.end_of_speech)
    job = {"model": model, "options": engine_options(stage), "prompts": [prompt.ids(t, "tara") for t in TEXTS],
           "levels": levels, "requests": requests, "sampling": worker_sampling(sampling, 0, eos)}
    (work / "vllm_job.json").write_text(json.dumps(job))
    proc = subprocess.run([str(vllm_python()), str(PERF / "vllm_generate.py"), str(work / "vllm_job.json")],
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"plain vLLM failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {int(c): v for c, v in out["tokens_per_s"].items()}


def orpheus_bench(args, argv, pipeline, deploy_path: str, levels: list[int]) -> int:
    from ensemble_builder.build import build
    from omni_backend.models.orpheus.builtin import resolve_checkpoint

    model = resolve_checkpoint(args.model or pipeline.default_model)
    work = Path(tempfile.mkdtemp(prefix="omni-bench-"))
    params = {"do_sample": False, "max_new_tokens": args.tokens}
    unwind_on_sigterm()
    sections = []
    plain = None
    for engine in args.engine.split(","):
        deploy = deploy_for_engine(deploy_path, engine, work / f"deploy-{engine}.yaml")
        repo = work / f"repo-{engine}"
        build(args.pipeline, repo, str(deploy), args.model)
        startup, rss, triton_version, rows = serve_levels(repo, args.pipeline, levels, args.requests, params,
                                                          work / f"tritonserver-{engine}.log", engine)
        if engine == "vllm":
            print("[bench] plain vLLM LLM.generate", flush=True)
            plain = plain_vllm(model, str(deploy), levels, args.requests, params, work)
        sections.append((engine, startup, rss, rows))

    command = f"python perf/bench.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    head = (f"## {args.pipeline} ({Path(model).name}), {datetime.date.today()}\n\n"
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs; {versions(triton_version)}; deploy "
            f"`{Path(deploy_path).name}` with stage 0 on each engine; {args.tokens} LM tokens per request "
            f"(greedy; random weights never stop). Command: `{command}`\n")
    cols = ["engine", "c", "requests", "errors", "TTFA p50 ms", "TTFA p95 ms", "RTF p50", "audio s/s", "LM tok/s",
            "plain vLLM tok/s", "plain / served"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    notes = []
    for engine, startup, rss, rows in sections:
        notes.append(f"{engine}: server start-up {startup:.1f} s, resident memory {rss:.0f} MiB (server + stubs"
                     f"{' + vLLM worker' if engine == 'vllm' else ''})")
        for r in rows:
            c = r["concurrency"]
            tok_s = r["requests"] * args.tokens / r["wall_s"]
            base = plain.get(c) if plain else None
            lines.append("| " + " | ".join(str(x) for x in [
                engine, c, r["requests"], r["errors"], f"{r['ttfa_p50_ms']:.0f}", f"{r['ttfa_p95_ms']:.0f}",
                f"{r['rtf_p50']:.3f}", f"{r['audio_s_per_s']:.2f}", f"{tok_s:.0f}",
                f"{base:.0f}" if base else "", f"{base / tok_s:.2f}" if base else ""]) + " |")
    table = head + "\n" + "; ".join(notes) + ".\n\n" + "\n".join(lines) + "\n"
    errors = [r["first_error"] for _, _, _, rows in sections for r in rows if r["first_error"]]
    if errors:
        table += "\nFirst error: " + errors[0] + "\n"
    print("\n" + table)
    with open(args.results, "a") as f:
        f.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
