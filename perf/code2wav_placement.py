"""First audio at c = 1 with code2wav in its own stage vs in the talker's process vs the whole
pipeline in the entry's process vs the talker there with code2wav placed per window.

The four placements of one Qwen3-TTS pipeline are served at once (four tritonservers, the deploy
as given with the talker's option `code2wav` set to `own_stage`, to `in_talker`, to `in_talker`
with the talker in the entry's process, `process: entry`, and to `adaptive` there); each round times one
request on each server, in turn order, the in-process engine + decoder of the same deploy,
and each talker stage that has a model of its own alone (to its first chunk's frames, or audio
where it decodes) and one code2wav call (perf/ttfa_breakdown.py), so a busy spell of a shared
host weighs on all alike. Each server's client keeps its connection (perf_analyzer's do too). A
fifth server holds only a model that answers at once with the first chunk's audio
(perf/benchkit/triton_floor.py): its row is what Triton itself takes of first audio.
Prints p50 / p95 per column, served / in-process p50 and the median of the per-round ratios, as a
markdown table.

    .venv/bin/python perf/code2wav_placement.py --pipeline qwen3_tts_tiny_random --rounds 30
    .venv/bin/python perf/code2wav_placement.py --pipeline qwen3_tts --size small --rounds 10
"""
from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from benchkit.percentiles import percentile
from benchkit.triton_floor import MODEL as FLOOR_MODEL, floor_server
from client.triton_process import TritonProcess
from client.triton_stream import StreamSession

TEXT = "Hello world, this is a streaming test of the first audio."
PLACEMENTS = ("own_stage", "in_talker", "in_entry", "adaptive")
SEPARATE_TALKER = ("own_stage", "in_talker")   # placements whose talker is a Triton model of its own
FLOOR_ROW = "Triton alone (a model that answers at once with the first chunk's audio)"


def deploy_with(deploy_path: Path, placement: str, out: Path) -> Path:
    """The deploy with the talker's `code2wav` option (and `process`) set for `placement`."""
    raw = yaml.safe_load(deploy_path.read_text())
    talker = next(s for s in raw["stages"] if s["stage_id"] == 0)
    talker.setdefault("options", {})["code2wav"] = placement if placement in ("own_stage", "adaptive") else "in_talker"
    talker["process"] = "entry" if placement in ("in_entry", "adaptive") else "own"
    raw.setdefault("entry", {})["instances"] = 1
    out.write_text(yaml.safe_dump(raw))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipeline", default="qwen3_tts_tiny_random")
    ap.add_argument("--size", default="", help="a random Qwen3-TTS checkpoint of this size (pipeline qwen3_tts)")
    ap.add_argument("--deploy", default="", help="deploy YAML (default: the pipeline's)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--frames", type=int, default=10, help="frames per request")
    args = ap.parse_args(argv)

    from ensemble_builder.build import build
    from omni_backend.deploy import default_deploy_path
    from omni_backend.families import get_pipeline
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from omni_backend.models.qwen3_tts.builtin import cache_root, resolve_checkpoint
    from ttfa_breakdown import _InProcess, _codec_call_s, _talker_first_chunk_s

    pipeline = get_pipeline(args.pipeline)
    model = pipeline.default_model
    if args.size:
        from omni_backend.models.qwen3_tts.random_checkpoint import write_random_checkpoint

        model = str(cache_root() / f"bench-{args.size}")
        if not (Path(model) / "config.json").exists():
            write_random_checkpoint(model, args.size, "custom_voice", 0)
    model = resolve_checkpoint(model)
    work = Path(tempfile.mkdtemp(prefix="code2wav-placement-"))
    base = Path(args.deploy) if args.deploy else default_deploy_path(pipeline.default_deploy)
    params = {"do_sample": False, "subtalker_do_sample": False, "max_new_tokens": args.frames + 1}
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    stack = contextlib.ExitStack()
    servers: dict[str, TritonProcess] = {}
    sessions: dict[str, StreamSession] = {}
    first = yaml.safe_load(base.read_text()).get("async_chunk", {}).get("initial_chunk_frames", 2)
    try:
        for placement in PLACEMENTS:
            deploy = deploy_with(base, placement, work / f"{placement}.yaml")
            build(args.pipeline, work / placement, deploy, model)
            servers[placement] = TritonProcess(work / placement, log_path=work / f"{placement}.log")
            servers[placement].start()
            sessions[placement] = StreamSession(servers[placement].grpc_url)
        request = Qwen3TTSAdapter.from_model(model).validate(TEXT, dict(params))
        local = _InProcess(model, str(deploy_with(base, "own_stage", work / "local.yaml")), request)
        floor = stack.enter_context(floor_server(work, first * local.decoder.hop_length, pipeline.sample_rate))
        sessions["floor"] = StreamSession(floor.grpc_url)
        times: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
        for name in ("in-process", "in-process engine", "in-process decode", "in-process prompt build",
                     "in-process with its prompt build", "own_stage: talker alone",
                     "own_stage: code2wav alone", "in_talker: talker alone", FLOOR_ROW):
            times[name] = []
        for k in range(args.rounds + 1):   # round 0 warms up
            order = PLACEMENTS[k % len(PLACEMENTS):] + PLACEMENTS[:k % len(PLACEMENTS)]
            # each server's client keeps its connection, as a streaming client does
            got = {p: sessions[p].synthesize(args.pipeline, TEXT, params).ttfa_s for p in order}
            floor_s = sessions["floor"].synthesize(FLOOR_MODEL, TEXT, params).ttfa_s
            engine_s, decode_s = local.first_audio_s(first)
            prompt_s = local.prompt_s()
            talker = {p: _talker_first_chunk_s(servers[p].grpc_url, f"{args.pipeline}__talker", request, first)
                      for p in order if p in SEPARATE_TALKER}
            codec = _codec_call_s(servers["own_stage"].grpc_url, f"{args.pipeline}__code2wav", talker["own_stage"][1])
            if k:
                for p in PLACEMENTS:
                    times[p].append(got[p] * 1000)
                for p in SEPARATE_TALKER:
                    times[f"{p}: talker alone"].append(talker[p][0] * 1000)
                times["own_stage: code2wav alone"].append(codec * 1000)
                times[FLOOR_ROW].append(floor_s * 1000)
                times["in-process"].append((engine_s + decode_s) * 1000)
                times["in-process engine"].append(engine_s * 1000)
                times["in-process decode"].append(decode_s * 1000)
                times["in-process prompt build"].append(prompt_s * 1000)
                times["in-process with its prompt build"].append((prompt_s + engine_s + decode_s) * 1000)
        inproc = statistics.median(times["in-process"])
        print(f"\n{args.pipeline} {args.size or ''}, c = 1, {args.rounds} rounds, first audio ms:\n")
        # per round: each placement against the in-process run of the same round, so that a shared
        # host's drift in speed between rounds (often 2x within minutes) cancels out
        print("| first audio (pipeline) or part | p50 ms | p95 ms | / in-process p50 | p50 of per-round ratios |")
        print("|---|---|---|---|---|")
        for name, values in times.items():
            p50 = statistics.median(values)
            paired = statistics.median(v / i for v, i in zip(values, times["in-process"]))
            print(f"| {name} | {p50:.1f} | {percentile(values, 95):.1f} | {p50 / inproc:.2f}x | {paired:.2f}x |")
    finally:
        for session in sessions.values():
            session.close()
        for server in servers.values():
            server.stop()
        stack.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
