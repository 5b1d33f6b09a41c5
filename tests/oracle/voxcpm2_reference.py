"""The reference VoxCPM2 (``voxcpm`` 2.0.3) over a list of jobs, run in ``.venv-voxcpm-oracle``.

    voxcpm2_reference.py --checkpoint DIR --jobs jobs.json --out DIR [--threads 1]

A job: ``id``, ``text`` and optionally ``seed`` (default 0: the global generator is seeded with it
right before generation, as a user of the reference does), ``cfg_value``, ``inference_timesteps``,
``min_len``, ``max_len``, and for cloning ``prompt_wav`` (a 16-kHz wav path) with ``prompt_text``
(continuation) and / or ``reference_wav`` (reference mode; both: ``ref_continuation``).
Per job, ``<id>.npz`` holds ``text_token`` (the tokenizer's ids of the backbone's full text),
``patches`` [N, P, D] (the generated latents, ``generate_with_prompt_cache``), ``waveform`` (its
non-streaming audio) and ``streaming_waveform`` (the reference's own stateful streaming decode of
the same request, joined), ``prompt_patches`` / ``ref_patches`` (the recordings' prompt cache);
``reference.json`` has the summaries.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np
import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--decode", help="an npz of latents [D, T] to decode with the reference's AudioVAE")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from voxcpm.cli import build_final_text
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    model = VoxCPM2Model.from_local(args.checkpoint, optimize=False, device="cpu")
    os.makedirs(args.out, exist_ok=True)
    with open(args.jobs, encoding="utf-8") as f:
        jobs = json.load(f)
    report = {"meta": {"sample_rate": int(model.sample_rate), "patch_size": int(model.patch_size),
                       "feat_dim": int(model.feat_dim)}, "jobs": {}}
    for job in jobs:
        # the package's public VoxCPM.generate (core.py) does this to the target text before the
        # model's generate_with_prompt_cache, which is called here for its latents
        # a voice description goes before the text as the package's CLI (`--control`) puts it
        text = build_final_text(job["text"], job.get("control")) if job.get("control") else job["text"]
        job = {**job, "text": re.sub(r"\s+", " ", text.replace("\n", " "))}
        kw = {k: job[k] for k in ("min_len", "max_len", "inference_timesteps", "cfg_value") if k in job}
        cache = None
        if job.get("prompt_wav") or job.get("reference_wav"):
            cache = model.build_prompt_cache(prompt_text=job.get("prompt_text"), prompt_wav_path=job.get("prompt_wav"),
                                             reference_wav_path=job.get("reference_wav"))
        full_text = (job["prompt_text"] + job["text"]) if job.get("prompt_wav") else job["text"]
        torch.manual_seed(int(job.get("seed", 0)))
        audio, _, patches = model.generate_with_prompt_cache(target_text=job["text"], prompt_cache=cache, **kw)
        torch.manual_seed(int(job.get("seed", 0)))
        chunks = [c for c, _, _ in model.generate_with_prompt_cache_streaming(
            target_text=job["text"], prompt_cache=cache, **kw)]
        streaming = torch.cat(chunks, dim=-1) if chunks else torch.zeros(1, 0)
        arrays = {"text_token": np.asarray(model.text_tokenizer(full_text), dtype=np.int64),
                  "patches": patches.float().numpy(), "waveform": audio[0].float().numpy(),
                  "streaming_waveform": streaming[0].float().numpy()}
        if cache is not None and "audio_feat" in cache:
            arrays["prompt_patches"] = cache["audio_feat"].float().numpy()
        if cache is not None and "ref_audio_feat" in cache:
            arrays["ref_patches"] = cache["ref_audio_feat"].float().numpy()
        np.savez(os.path.join(args.out, f"{job['id']}.npz"), **arrays)
        report["jobs"][job["id"]] = {"job": job, "patches": int(patches.shape[0]),
                                     "samples": int(audio.shape[-1])}
    if args.decode:
        with np.load(args.decode) as data:
            z = torch.from_numpy(data["latents"]).float()[None]
        with torch.inference_mode():
            np.save(os.path.join(args.out, "decoded.npy"), model.audio_vae.decode(z)[0, 0].numpy())
    with open(os.path.join(args.out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, ensure_ascii=False, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
