"""Reference Orpheus output for parity tests; runs in `.venv-oracle` (transformers 4.57.3, snac 1.2.1,
orpheus-speech 0.1.0).

    .venv-oracle/bin/python tests/oracle/orpheus_reference.py JOBS.json OUT.npz

Each job: {"name", "checkpoint", "snac", "text", "voice", "max_new_tokens", "repetition_penalty",
"window_seeds": [...]}. For each: the prompt from orpheus-speech's `OrpheusModel._format_prompt`
tokenized again as vLLM does, greedy tokens from transformers' `LlamaForCausalLM.generate`, the
token -> code mapping and windowing of orpheus-speech's `tokens_decoder` fed vLLM's cumulative
output text, and each window decoded by the `snac` package. SNAC's decoder draws noise; here
window `w` draws it from `torch.Generator().manual_seed(window_seeds[w])`, as the served decoder does.

orpheus-speech's package `__init__` imports vLLM and its decoder module downloads SNAC at import:
its two modules are loaded here without those side effects (stub `vllm`, a deferred SNAC).
"""
from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import types

import numpy as np
import torch


def load_orpheus_modules():
    import snac

    spec = importlib.util.find_spec("orpheus_tts")
    package_dir = os.path.dirname(spec.origin)
    package = types.ModuleType("orpheus_tts")
    package.__path__ = [package_dir]          # its __init__ (vLLM import) never runs
    sys.modules["orpheus_tts"] = package
    vllm = types.ModuleType("vllm")
    for name in ("AsyncLLMEngine", "AsyncEngineArgs", "SamplingParams"):
        setattr(vllm, name, type(name, (), {}))
    sys.modules["vllm"] = vllm

    class Deferred:                           # what `SNAC.from_pretrained(hub id).eval().to(cuda)` gives
        def eval(self):
            return self

        def to(self, _device):
            return self

    original = snac.SNAC.from_pretrained
    snac.SNAC.from_pretrained = classmethod(lambda cls, *a, **k: Deferred())
    try:
        decoder = importlib.import_module("orpheus_tts.decoder")
        engine_class = importlib.import_module("orpheus_tts.engine_class")
    finally:
        snac.SNAC.from_pretrained = original
    decoder.snac_device = "cpu"
    return decoder, engine_class, snac


class SeededNoise:
    """torch.randn for SNAC's NoiseBlocks, drawn from one generator per window."""

    def __init__(self):
        self.generator = None
        self.original = torch.randn

    def __call__(self, *shape, **kwargs):
        if self.generator is None:
            return self.original(*shape, **kwargs)
        kwargs.pop("device", None)
        return self.original(*shape, generator=self.generator, **kwargs)


def run_job(job, decoder, engine_class, snac_pkg):
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(job["checkpoint"])
    holder = types.SimpleNamespace(tokeniser=tokenizer)
    prompt_string = engine_class.OrpheusModel._format_prompt(holder, job["text"], job["voice"])
    prompt_ids = tokenizer(prompt_string)["input_ids"]          # vLLM tokenizes the string again
    model = LlamaForCausalLM.from_pretrained(job["checkpoint"], torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=job["max_new_tokens"],
                             repetition_penalty=job["repetition_penalty"], eos_token_id=job["eos_token_ids"],
                             pad_token_id=job["eos_token_ids"][0])
    tokens = out[0, len(prompt_ids):].tolist()

    snac_model = snac_pkg.SNAC.from_pretrained(job["snac"]).eval()
    noise = SeededNoise()
    windows: list[int] = []
    audio: list[np.ndarray] = []

    class Recorder:
        def decode(self, codes):
            return snac_model.decode(codes)

    original_convert = decoder.convert_to_audio

    def convert(multiframe, count):
        w = count // 7 - 4
        noise.generator = torch.Generator().manual_seed(job["window_seeds"][w])
        torch.randn = noise
        try:
            captured = {}

            def decode(codes):
                captured["audio"] = snac_model.decode(codes)
                return captured["audio"]
            decoder.model = types.SimpleNamespace(decode=decode)
            result = original_convert(multiframe, count)
        finally:
            torch.randn = noise.original
        if result is not None:
            windows.append(w)
            audio.append(captured["audio"][0, 0, 2048:4096].float().numpy())
        return result

    decoder.convert_to_audio = convert

    async def texts():        # vLLM's cumulative output text after each token
        for i in range(len(tokens)):
            yield tokenizer.decode(tokens[:i + 1], skip_special_tokens=True)

    async def drain():
        async for _ in decoder.tokens_decoder(texts()):
            pass
    asyncio.run(drain())
    decoder.convert_to_audio = original_convert
    return {"prompt_ids": np.array(prompt_ids, dtype=np.int64), "tokens": np.array(tokens, dtype=np.int64),
            "windows": np.array(windows, dtype=np.int64),
            "audio": np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)}


def main() -> None:
    jobs_file, out_file = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    decoder, engine_class, snac_pkg = load_orpheus_modules()
    with open(jobs_file) as f:
        jobs = json.load(f)
    arrays = {}
    for job in jobs:
        for key, value in run_job(job, decoder, engine_class, snac_pkg).items():
            arrays[f"{job['name']}/{key}"] = value
    np.savez(out_file, **arrays)


if __name__ == "__main__":
    main()
