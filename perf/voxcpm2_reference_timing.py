"""The reference VoxCPM2 (voxcpm 2.0.3, in .venv-voxcpm-oracle) timed in process, one request at a
time, with its own streaming generator (``generate_streaming``): time to the first audio chunk,
whole time, audio seconds. Called by perf/voxcpm2_bench.py; prints one JSON object.

    .venv-voxcpm-oracle/bin/python perf/voxcpm2_reference_timing.py --checkpoint DIR --texts-json '[...]'
        --min-len N --max-len M [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--texts-json", required=True)
    ap.add_argument("--min-len", type=int, required=True)
    ap.add_argument("--max-len", type=int, required=True)
    ap.add_argument("--timesteps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    model = VoxCPM2Model.from_local(args.checkpoint, optimize=False, device="cpu")
    texts = json.loads(args.texts_json)
    kw = {"min_len": args.min_len, "max_len": args.max_len, "inference_timesteps": args.timesteps}
    next(iter(model.generate_streaming(target_text="Warm up.", **kw)))
    rows = []
    for i, text in enumerate(texts):
        torch.manual_seed(i)
        t0 = time.perf_counter()
        first, samples = None, 0
        for chunk in model.generate_streaming(target_text=text, **kw):
            first = time.perf_counter() - t0 if first is None else first
            samples += chunk.shape[-1]
        total = time.perf_counter() - t0
        rows.append({"ttfa_s": first, "total_s": total, "audio_s": samples / model.sample_rate})
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
