"""Plain vLLM on a checkpoint, as the baseline of the served vLLM stage: `LLM.generate` tokens/s.

Runs with vLLM's own python (`.venv-vllm/bin/python perf/vllm_generate.py JOB.json`) and builds
vLLM with the same engine arguments as the stage's worker (omni_backend/engine/vllm_worker.py:
in-process engine core, `uni` executor, the same KV cache), so the ratio to the served figures is
our serving overhead. JOB: {"model", "options", "prompts": [[ids]], "levels": [c],
"requests": n, "sampling": the worker's `add` sampling of the served requests}. Prints one JSON line:
{"tokens_per_s": {c: tokens/s}, "load_s": s}.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "omni_backend" / "engine" / "vllm_worker.py"


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    spec = importlib.util.spec_from_file_location("vllm_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker._environment(job["options"])
    from vllm import LLM, SamplingParams

    scratch = tempfile.mkdtemp(prefix="vllm-generate-")
    started = time.perf_counter()
    llm = LLM(**worker.engine_kwargs(job["model"], job["options"], scratch))
    load_s = time.perf_counter() - started
    params = SamplingParams(**worker.sampling_kwargs(job["sampling"]))
    prompts = job["prompts"]
    llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)   # warm-up
    out = {}
    for c in job["levels"]:
        batch = [{"prompt_token_ids": prompts[i % len(prompts)]} for i in range(c)]
        tokens = 0
        t0 = time.perf_counter()
        for _ in range(job["requests"]):
            for result in llm.generate(batch, params, use_tqdm=False):
                tokens += len(result.outputs[0].token_ids)
        out[c] = tokens / (time.perf_counter() - t0)
    print(json.dumps({"tokens_per_s": out, "load_s": load_s}))


if __name__ == "__main__":
    main()
