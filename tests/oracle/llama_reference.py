"""Test oracle: transformers' own Llama greedy ``generate()``, run in .venv-oracle (transformers 4.57.3).

    .venv-oracle/bin/python tests/oracle/llama_reference.py < REQUEST.json > RESULT.json

REQUEST (stdin): {"threads": 1, "jobs": [{"checkpoint": dir, "prompts": [[ids], ...],
                  "max_new_tokens": N, "eos_token_id": id or [ids], "min_new_tokens": 0,
                  "repetition_penalty": 1.0}, ...]}
RESULT (stdout): {"results": [[[ids], ...], ...]}: per job, the generated ids of each prompt run
alone (batch 1, no padding), eos included where it was generated (``generate`` keeps it).
Several jobs share one process: importing transformers is most of the time.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402


def run_job(job: dict) -> list:
    model = LlamaForCausalLM.from_pretrained(job["checkpoint"], dtype=torch.float32).eval()
    eos = job["eos_token_id"]
    pad = eos[0] if isinstance(eos, list) else eos
    out = []
    with torch.inference_mode():
        for prompt in job["prompts"]:
            ids = torch.tensor([prompt], dtype=torch.long)
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=job["max_new_tokens"],
                                       min_new_tokens=job.get("min_new_tokens", 0),
                                       repetition_penalty=job.get("repetition_penalty", 1.0),
                                       eos_token_id=eos, pad_token_id=pad)
            out.append(generated[0, len(prompt):].tolist())
    return out


def main() -> None:
    request = json.load(sys.stdin)
    torch.set_num_threads(int(request.get("threads", 1)))
    json.dump({"results": [run_job(job) for job in request["jobs"]]}, sys.stdout)


if __name__ == "__main__":
    main()
