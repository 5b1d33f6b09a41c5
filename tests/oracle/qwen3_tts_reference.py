"""Reference (oracle) codes for Qwen3-TTS checkpoints, from the official ``qwen-tts`` package.

Run with the oracle venv (see tests/oracle/install.sh), never with the project's:

    .venv-oracle/bin/python tests/oracle/qwen3_tts_reference.py --jobs JOBS.json --out OUT.npz [--threads N]
    .venv-oracle/bin/python tests/oracle/qwen3_tts_reference.py --checkpoint DIR --prompts PROMPTS.json --out OUT.npz

JOBS.json is a list of ``{"checkpoint": DIR, "prompts": [...], "tokenize": [...]}``; PROMPTS.json a
list of prompts. A prompt is a dict:

    {"id": "p1", "text": "...", "speaker": "Ryan", "language": "English", "instruct": "...",
     "non_streaming_mode": true, "repetition_penalty": 1.05, "max_new_tokens": 40, "greedy": true,
     "decode": false}

Every field but ``id`` and ``text`` is optional; a missing ``non_streaming_mode`` takes the
wrapper's default. The prompt goes through the public wrapper of the checkpoint's type
(``generate_custom_voice`` / ``generate_voice_design``), exactly as a user calls it; the codes
are taken from the ``model.generate()`` call the wrapper makes (audio decoding is skipped unless
``decode`` is true). ``tokenize`` lists texts whose ids ``_tokenize_texts`` returns.

OUT.npz holds ``codes/<id>`` (int64 ``[frames, 16]``), ``input_ids/<id>``, ``instruct_ids/<id>`` (when
an instruction was used), ``wav/<id>`` (float32, when decoded), ``tokens/<checkpoint index>/<i>``
and ``meta`` (a JSON string: ``seconds/<id>``, ``load_seconds/<i>``, ``missing_keys/<i>`` and
``unexpected_keys/<i>`` (weight names of the reference model absent from model.safetensors, and
the reverse) and ``threads``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load(checkpoint: str):
    import torch
    from qwen_tts import Qwen3TTSModel

    return Qwen3TTSModel.from_pretrained(checkpoint, dtype=torch.float32)


def _weight_names_check(model, checkpoint: str) -> tuple[list[str], list[str]]:
    """Parameter names the reference model has but model.safetensors lacks, and the reverse (the
    speech tokenizer is a separate module and not part of the model's state dict)."""
    from safetensors import safe_open

    with safe_open(os.path.join(checkpoint, "model.safetensors"), framework="pt") as handle:
        stored = set(handle.keys())
    expected = {name for name in model.state_dict() if not name.startswith("speech_tokenizer.")}
    return sorted(expected - stored), sorted(stored - expected)


def _run_prompt(tts, prompt: dict) -> dict:
    import numpy as np
    import torch

    captured = {}
    model = tts.model
    original_generate = model.generate
    original_decode = model.speech_tokenizer.decode

    def capture(*args, **kwargs):
        result = original_generate(*args, **kwargs)
        captured["kwargs"] = kwargs
        captured["codes"] = result[0]
        return result

    def no_decode(items):
        return [np.zeros(1, dtype=np.float32) for _ in items], 24000

    greedy = bool(prompt.get("greedy", True))
    kwargs = {"do_sample": not greedy, "subtalker_dosample": not greedy}
    for key in ("repetition_penalty", "max_new_tokens", "temperature", "top_k", "top_p", "subtalker_temperature",
                "subtalker_top_k", "subtalker_top_p"):
        if prompt.get(key) is not None:
            kwargs[key] = prompt[key]
    if "non_streaming_mode" in prompt and prompt["non_streaming_mode"] is not None:
        kwargs["non_streaming_mode"] = bool(prompt["non_streaming_mode"])
    if prompt.get("seed") is not None:
        torch.manual_seed(int(prompt["seed"]))

    model.generate = capture
    if not prompt.get("decode"):
        model.speech_tokenizer.decode = no_decode
    try:
        started = time.perf_counter()
        kind = model.tts_model_type
        if kind == "custom_voice":
            wavs, sr = tts.generate_custom_voice(text=prompt["text"], speaker=prompt.get("speaker"),
                                                 language=prompt.get("language"), instruct=prompt.get("instruct"),
                                                 **kwargs)
        elif kind == "voice_design":
            wavs, sr = tts.generate_voice_design(text=prompt["text"], instruct=prompt.get("instruct") or "",
                                                 language=prompt.get("language"), **kwargs)
        else:
            raise SystemExit(f"checkpoint type {kind!r}: voice cloning prompts are not supported by this oracle yet")
        seconds = time.perf_counter() - started
    finally:
        model.generate = original_generate
        model.speech_tokenizer.decode = original_decode

    gen_kwargs = captured["kwargs"]
    out = {
        "codes": captured["codes"][0].cpu().numpy().astype("int64"),
        "input_ids": gen_kwargs["input_ids"][0][0].cpu().numpy().astype("int64"),
        "seconds": seconds,
    }
    instruct_ids = gen_kwargs.get("instruct_ids")
    if instruct_ids and instruct_ids[0] is not None:
        out["instruct_ids"] = instruct_ids[0][0].cpu().numpy().astype("int64")
    if prompt.get("decode"):
        out["wav"] = np.asarray(wavs[0], dtype=np.float32)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", help="JSON list of {checkpoint, prompts, tokenize}")
    parser.add_argument("--checkpoint")
    parser.add_argument("--prompts", help="JSON list of prompts (with --checkpoint)")
    parser.add_argument("--out", required=True, help="output .npz")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.jobs:
        with open(args.jobs, encoding="utf-8") as handle:
            jobs = json.load(handle)
    elif args.checkpoint and args.prompts:
        with open(args.prompts, encoding="utf-8") as handle:
            jobs = [{"checkpoint": args.checkpoint, "prompts": json.load(handle)}]
    else:
        parser.error("give --jobs, or --checkpoint with --prompts")

    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, object] = {"threads": torch.get_num_threads()}
    for job_index, job in enumerate(jobs):
        started = time.perf_counter()
        tts = _load(job["checkpoint"])
        meta[f"load_seconds/{job_index}"] = time.perf_counter() - started
        missing, unexpected = _weight_names_check(tts.model, job["checkpoint"])
        meta[f"missing_keys/{job_index}"] = missing
        meta[f"unexpected_keys/{job_index}"] = unexpected
        for i, text in enumerate(job.get("tokenize", [])):
            arrays[f"tokens/{job_index}/{i}"] = tts._tokenize_texts([text])[0][0].cpu().numpy().astype("int64")
        for prompt in job.get("prompts", []):
            result = _run_prompt(tts, prompt)
            pid = prompt["id"]
            for key in ("codes", "input_ids", "instruct_ids", "wav"):
                if key in result:
                    arrays[f"{key}/{pid}"] = result[key]
            meta[f"seconds/{pid}"] = result["seconds"]
        del tts
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(args.out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
