"""GPU check of VoxCPM2's LM step on CUDA graphs, side module included (run by perf/gpu/check.sh).

    python perf/gpu/voxcpm2_check.py [--dry-run] [--results FILE] [--no-results] [--patches N]

On one NVIDIA GPU, with a random-weight language model of the released VoxCPM2 sizes made in GPU
memory (backbone, residual LM, local encoder and LocDiT in bf16; no checkpoint on disk; the
AudioVAE is not built), as ``deploy/voxcpm2.gpu.yaml`` runs it (static step, CUDA graphs per batch
bucket for the default 10 solver steps):

1. **graphs vs eager**: the latent patches of the engine with CUDA graphs equal those of the same
   engine with ``enforce_eager`` (the same static step, no graphs), at c = 1, 3 (a padded bucket)
   and 4, with different seeds and guidance scales per request;
2. **step throughput** at c = 1, 8, 16, 32 (every request ``--patches`` patches long: ``min_len``
   holds the random stop head off): engine step time, patches per second and the LM's audio
   seconds per wall second (a patch is 160 ms of audio), with graphs and, at c = 1 and 16, eagerly.

``--dry-run`` runs it on CPU with the tiny shape in float32 and the static step eagerly (the
script's logic, not GPU figures).
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from check_report import Stopped, finish, stop_on_sigterm  # noqa: E402

from omni_backend.engine import SamplingParams  # noqa: E402
from omni_backend.models.voxcpm2.config import AudioVAEConfig, parse_config  # noqa: E402
from omni_backend.models.voxcpm2.model import VoxCPM2  # noqa: E402
from omni_backend.models.voxcpm2.prompt import build_prompt  # noqa: E402
from omni_backend.models.voxcpm2.random_checkpoint import checkpoint_config, released_scale_config  # noqa: E402
from omni_backend.models.voxcpm2.runner import VoxCPM2Params, create_engine  # noqa: E402

TEXTS = ["Hello! This is a test of streaming speech.", "The quick brown fox jumps over the lazy dog.",
         "你好，今天天气很好。", "One more sentence, a little longer than the others, to speak."]


def log(message: str) -> None:
    print(f"[voxcpm2-check] {message}", flush=True)


def random_model(released: bool, device: str, dtype: torch.dtype) -> VoxCPM2:
    config = parse_config(released_scale_config() if released else checkpoint_config("tiny"))
    torch.manual_seed(0)
    with torch.device(device):
        model = VoxCPM2(config)
    return model.to(dtype).eval()


def _tokenizer(vocab: int):
    """Stand-in ids below ``vocab`` and past the special ids (random weights: any ids speak alike)."""
    return lambda text: [200 + ord(c) % (vocab - 200) for c in text]


def requests(model: VoxCPM2, count: int, patches: int, tag: str) -> list:
    out = []
    for i in range(count):
        prompt = build_prompt(_tokenizer(model.config.lm_config.vocab_size), TEXTS[i % len(TEXTS)], model.patch_size, model.feat_dim)
        extra = VoxCPM2Params(cfg_value=(2.0, 1.5, 3.0)[i % 3], inference_timesteps=10, min_len=patches)
        out.append((f"{tag}{i}", prompt, SamplingParams(max_new_tokens=patches, min_new_tokens=0, seed=100 + i,
                                                        extra=extra)))
    return out


def engine(model: VoxCPM2, rows: int, static: bool | None, eager: bool, sizes) -> object:
    return create_engine(model, max_num_seqs=rows, max_model_len=1024, batch_invariant=False,
                         static_step=static, cuda_graph_sizes=sizes, enforce_eager=eager)


def parity(model: VoxCPM2, static: bool | None, patches: int) -> str:
    graphs, eager = engine(model, 4, static, False, [1, 2, 4]), engine(model, 4, static, True, [1, 2, 4])
    log(f"graphs captured: {len(graphs.runner.graphs.graphs)}")
    worst, results = 0.0, []
    for c in (1, 3, 4):
        a = graphs.generate(requests(model, c, patches, f"c{c}-"))
        b = eager.generate(requests(model, c, patches, f"c{c}-"))
        diff = max(float((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max()) for k in a)
        worst = max(worst, diff)
        results.append(f"c = {c}: {'equal' if diff == 0 else f'DIFFERENT (max |diff| {diff:.3g})'}")
    return (f"{len(graphs.runner.graphs.graphs)} graphs; " + ", ".join(results)
            + f" ({patches} patches per request)")


def throughput(model: VoxCPM2, static: bool | None, levels: list[int], patches: int, eager: bool,
               seconds_per_patch: float) -> list[str]:
    e = engine(model, max(levels), static, eager, sorted({1, 2, 4, 8, 16, 32} | set(levels)))
    e.generate(requests(model, 1, 2, "warm"))
    rows = []
    for c in levels:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        frames = e.generate(requests(model, c, patches, f"t{c}-"))
        wall = time.perf_counter() - started
        made = sum(len(v) for v in frames.values())
        step = "eager" if eager else "graphs" if e.runner.graphs.graphs else "static step, no graphs"
        rows.append(f"| {step} | {c} | {wall / patches * 1e3:.1f} | {made / wall:.0f} | "
                    f"{made * seconds_per_patch / wall:.1f} |")
        log(rows[-1])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--results", default=str(ROOT / "perf" / "JOURNAL.md"))
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--patches", type=int, default=None, help="patches per request (default 50 = 8 s; dry run 4)")
    args = ap.parse_args(argv)
    stop_on_sigterm()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cuda = torch.cuda.is_available() and not args.dry_run
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    static = None if cuda else True   # CPU: the static step, eagerly
    patches = args.patches or (50 if cuda else 4)
    levels = [1, 8, 16, 32] if cuda else [1, 2]
    vae = AudioVAEConfig()
    head = f"## VoxCPM2 GPU check{'' if cuda else ' (DRY RUN, CPU, tiny shape)'}, {stamp}\n\n"
    if cuda:
        head += (f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA {torch.version.cuda}; random "
                 "weights of the released VoxCPM2 LM sizes made in GPU memory (bf16), static step, 10 solver steps.\n\n")
    lines, problems = [], []
    try:
        started = time.perf_counter()
        model = random_model(cuda, device, dtype)
        seconds_per_patch = model.patch_size * vae.hop_length / vae.sample_rate
        log(f"model made in {time.perf_counter() - started:.1f} s")
        try:
            result = parity(model, static, min(patches, 12))
        except Stopped:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, the check goes on
            result = f"failed: {type(exc).__name__}: {exc}"
        if "DIFFERENT" in result or result.startswith("failed"):
            problems.append("graphs vs eager")
        lines.append(f"Graphs vs eager (latent patches): {result}")
        log(lines[-1])
        lines += ["", f"LM step throughput ({patches} patches per request, all at once; the AudioVAE not run):", "",
                  "| step | c | ms per step | patches/s | LM audio s/s |", "|---|---|---|---|---|"]
        lines += throughput(model, static, levels, patches, False, seconds_per_patch)
        if cuda:
            lines += throughput(model, static, [1, 16], patches, True, seconds_per_patch)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"{type(exc).__name__}: {exc}")
    return finish(head, lines, problems, args.results, args.no_results)


if __name__ == "__main__":
    sys.exit(main())
