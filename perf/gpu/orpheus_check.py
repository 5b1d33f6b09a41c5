"""GPU check of the Orpheus pipeline's vLLM stage (run by perf/gpu/check.sh after the Qwen3-TTS check).

    python perf/gpu/orpheus_check.py [--dry-run] [--results FILE]

vLLM must be importable by the python in ``$OMNI_VLLM_PYTHON`` (else ``.venv-vllm/bin/python``,
else this python); when it is not, the check says so in one line and stops (exit 0). Otherwise,
on a random Orpheus checkpoint of a mid-size shape (bf16 on the GPU):

1. vLLM (the stage's worker, `engine: vllm` with CUDA graphs) vs the torch engine on the same GPU:
   greedy tokens of 4 prompts, how many agree (bf16 kernels differ, so this is reported, not
   required) and whether every token is a valid SNAC code for its frame position;
2. the LM's tokens/s through the stage's engine at c = 1, 8, 32 against plain vLLM
   ``LLM.generate`` with the same engine arguments (perf/vllm_generate.py): our overhead;
3. SNAC 24 kHz windows per second on the GPU at batch 1 and 32.

``--dry-run`` runs the same steps on CPU with the tiny shape (checks the script's logic).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TEXTS = ["The weather is lovely today.", "Please call me back tomorrow morning at nine.",
         "Streaming speech arrives in small chunks.", "A quick brown fox jumps over the lazy dog."]


def vllm_python() -> str | None:
    """A python that imports vllm, or None."""
    candidates = [os.environ.get("OMNI_VLLM_PYTHON"), str(ROOT / ".venv-vllm" / "bin" / "python"), sys.executable]
    for python in filter(None, candidates):
        if Path(python).exists() and subprocess.run([python, "-c", "import vllm"], capture_output=True,
                                                    timeout=300).returncode == 0:
            return python
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per request (default 700; dry run 70)")
    ap.add_argument("--results", default=str(ROOT / "perf" / "JOURNAL.md"))
    ap.add_argument("--no-results", action="store_true")
    args = ap.parse_args(argv)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    python = vllm_python()
    if python is None:
        text = (f"## Orpheus vLLM GPU check, {stamp}\n\nSkipped: vLLM is not importable here (tried "
                f"$OMNI_VLLM_PYTHON, .venv-vllm/bin/python, {sys.executable}); install a CUDA vLLM build and set "
                "OMNI_VLLM_PYTHON to run it.\n")
        return _report(text, args)
    os.environ["OMNI_VLLM_PYTHON"] = python
    try:
        text = run(args, python, stamp)
    except Exception as exc:  # noqa: BLE001 - the report says what failed
        text = f"## Orpheus vLLM GPU check, {stamp}\n\n**Problem: {type(exc).__name__}: {exc}**\n"
        _report(text, args)
        return 1
    return _report(text, args)


def _report(text: str, args) -> int:
    print(text)
    if not args.no_results:
        with open(args.results, "a") as f:
            f.write("\n" + text)
    return 0


def run(args, python: str, stamp: str) -> str:
    import torch

    from omni_backend.engine import SamplingParams
    from omni_backend.engine.vllm_engine import VLLMEngine, worker_sampling
    from omni_backend.models.orpheus.builtin import SNAC_FOLDER
    from omni_backend.models.orpheus.runner import create_engine
    from omni_backend.models.orpheus.sampling import stop_token_ids
    from omni_backend.models.orpheus.snac import load_snac
    from omni_backend.models.orpheus.tokens import CodeAssembler, OrpheusPrompt
    from omni_backend.models.orpheus.random_checkpoint import write_random_orpheus
    from omni_backend.models.orpheus.random_snac import write_random_snac

    dry = args.dry_run
    device, dtype = ("cpu", "float32") if dry else ("cuda", "bfloat16")
    shape = "tiny" if dry else "medium"
    tokens = args.tokens or (70 if dry else 700)
    work = Path(tempfile.mkdtemp(prefix="orpheus-gpu-"))
    t0 = time.perf_counter()
    model = write_random_orpheus(work / shape, shape, seed=0)
    # the released SNAC 24 kHz dimensions on the GPU
    write_random_snac(model / SNAC_FOLDER, seed=0, **({} if dry else {"encoder_dim": 48, "decoder_dim": 1024}))
    write_s = time.perf_counter() - t0
    prompt = OrpheusPrompt(str(model))
    eos = stop_token_ids(str(model), prompt.tokens.end_of_speech)
    prompts = [prompt.ids(t, "tara") for t in TEXTS]
    greedy = SamplingParams.greedy(max_new_tokens=tokens, min_new_tokens=0, repetition_penalty=1.0)
    levels = [1, 4] if dry else [1, 8, 32]
    options = {"max_num_seqs": max(levels), "max_model_len": 2048, "dtype": dtype, "device": device,
               "enforce_eager": dry, "cuda_graph_sizes": [1, 2, 4, 8, 16, 32]}

    t0 = time.perf_counter()
    engine = VLLMEngine(model, options, eos)
    engine.start()
    start_s = time.perf_counter() - t0

    async def generate(c: int) -> tuple[list[list[int]], float]:
        async def one(i: int) -> list[int]:
            stream = engine.add_request(uuid.uuid4().hex, prompts[i % len(prompts)], greedy)
            return [e.codes[0] async for e in stream if e.codes is not None]
        t = time.perf_counter()
        outs = await asyncio.gather(*(one(i) for i in range(c)))
        return outs, time.perf_counter() - t

    try:
        vllm_tokens, _ = asyncio.run(generate(len(prompts)))
        served = {}
        for c in levels:
            outs, wall = asyncio.run(generate(c))
            served[c] = sum(len(o) for o in outs) / wall
    finally:
        engine.close()

    torch_engine = create_engine(str(model), eos, max_num_seqs=len(prompts), max_model_len=2048, dtype=dtype,
                                 device=device)
    ids = {f"p{i}": p for i, p in enumerate(prompts)}
    got = torch_engine.generate([(k, p, greedy) for k, p in ids.items()])
    torch_tokens = [[f[0] for f in got[f"p{i}"]] for i in range(len(prompts))]
    agree = [next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
             for x, y in zip(vllm_tokens, torch_tokens)]
    valid = all(len(CodeAssembler(prompt.tokens).feed(t)) == len(t) for t in vllm_tokens)

    job = {"model": str(model), "options": options, "prompts": prompts, "levels": levels, "requests": 1,
           "sampling": worker_sampling(greedy, 0, eos)}
    (work / "job.json").write_text(json.dumps(job))
    proc = subprocess.run([python, str(ROOT / "perf" / "vllm_generate.py"), str(work / "job.json")],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"plain vLLM failed: {proc.stderr[-1500:]}")
    plain = {int(c): v for c, v in json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"].items()}

    snac = load_snac(model / SNAC_FOLDER, device=device)
    windows = {}
    for batch in (1, 32):
        books = [torch.randint(0, 4096, (batch, n), device=device) for n in (4, 8, 16)]
        seeds = list(range(batch))
        snac.decode(books, seeds)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            snac.decode(books, seeds)
        if device == "cuda":
            torch.cuda.synchronize()
        windows[batch] = 5 * batch / (time.perf_counter() - t)

    if dry and min(agree) < min(len(t) for t in vllm_tokens + torch_tokens):
        raise RuntimeError(f"float32 greedy tokens of vLLM and the torch engine differ (first at {agree})")
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (dry run)"
    lines = [f"## Orpheus vLLM GPU check ({'DRY RUN, ' if dry else ''}random {shape} shape), {stamp}", "",
             f"Machine: {gpu}; vLLM python {python}; LM {dtype} on {device}, SNAC float32. Checkpoint written in "
             f"{write_s:.0f} s; vLLM worker start {start_s:.1f} s. Command: `perf/gpu/check.sh` "
             f"(`perf/gpu/orpheus_check.py{' --dry-run' if dry else ''}`), {tokens} greedy tokens per request.", "",
             f"vLLM vs torch engine, greedy, {len(prompts)} prompts: first differing token at "
             f"{agree} of {tokens} ({'float32: expected equal' if dry else 'bf16 kernels differ: reported, not required'}); every vLLM token a valid SNAC "
             f"code for its position: {valid}.", "",
             "| c | stage engine tok/s | plain vLLM tok/s | plain / stage |", "|---|---|---|---|"]
    for c in levels:
        lines.append(f"| {c} | {served[c]:.0f} | {plain[c]:.0f} | {plain[c] / served[c]:.2f} |")
    lines += ["", "SNAC windows (4 frames -> 2048 samples) per second: "
              + ", ".join(f"batch {b}: {w:.0f}" for b, w in windows.items()) + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
