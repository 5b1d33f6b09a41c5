"""Orpheus parity with the reference (orpheus-speech 0.1.0 + transformers' LlamaForCausalLM + snac
1.2.1), on random checkpoints of two shapes: prompt ids, greedy tokens (torch engine and vLLM),
accepted codes, windows, and the decoded waveform (within 1e-4)."""
from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import torch

from omni_backend.engine import SamplingParams


def _params(job) -> SamplingParams:
    return SamplingParams.greedy(max_new_tokens=job["max_new_tokens"], min_new_tokens=0,
                                 repetition_penalty=job["repetition_penalty"])


def _audio(job, tokens) -> tuple[list[int], np.ndarray]:
    """What the served pipeline makes of these tokens: codes -> windows -> SNAC audio."""
    from omni_backend.models.orpheus.snac import load_snac, window_noise_seed
    from omni_backend.models.orpheus.tokens import CodeAssembler, OrpheusPrompt, WindowCutter, window_codebooks

    tokens_of = OrpheusPrompt(job["checkpoint"]).tokens
    windows = WindowCutter().add(CodeAssembler(tokens_of).feed(tokens))
    snac = load_snac(job["snac"])
    chunks = []
    for index, window in windows:
        books = [torch.from_numpy(np.ascontiguousarray(c)) for c in window_codebooks(np.asarray([window]))]
        with torch.inference_mode():
            audio = snac.decode(books, [window_noise_seed(job["seed"], index)])
        chunks.append(audio[0, 0, snac.frame_samples:2 * snac.frame_samples].numpy())
    return [i for i, _ in windows], (np.concatenate(chunks) if chunks else np.zeros(0, np.float32))


def test_prompt_ids_equal_reference(orpheus_jobs, orpheus_reference):
    from omni_backend.models.orpheus.tokens import OrpheusPrompt

    for job in orpheus_jobs:
        got = OrpheusPrompt(job["checkpoint"]).ids(job["text"], job["voice"])
        assert got == orpheus_reference[job["name"]]["prompt_ids"].tolist(), job["name"]


def test_torch_engine_tokens_codes_and_audio_equal_reference(orpheus_jobs, orpheus_reference):
    from omni_backend.models.orpheus.runner import create_engine
    from omni_backend.models.orpheus.sampling import stop_token_ids
    from omni_backend.models.orpheus.tokens import OrpheusPrompt

    torch.set_num_threads(1)
    engines = {}
    for job in orpheus_jobs:
        ref = orpheus_reference[job["name"]]
        prompt = OrpheusPrompt(job["checkpoint"])
        if job["shape"] not in engines:
            eos = stop_token_ids(job["checkpoint"], prompt.tokens.end_of_speech)
            engines[job["shape"]] = create_engine(job["checkpoint"], eos, max_num_seqs=4, max_model_len=512)
        engine = engines[job["shape"]]
        rid = uuid.uuid4().hex
        tokens = [f[0] for f in engine.generate([(rid, ref["prompt_ids"].tolist(), _params(job))])[rid]]
        want = [t for t in ref["tokens"].tolist() if t not in engine.runner.eos_token_ids]
        assert tokens == want, job["name"]
        windows, audio = _audio(job, tokens)
        assert windows == ref["windows"].tolist(), job["name"]
        assert len(windows) >= 3, "the random checkpoint should speak (valid windows)"
        assert audio.shape == ref["audio"].shape
        assert np.max(np.abs(audio - ref["audio"])) <= 1e-4, job["name"]


def test_torch_engine_batch_equals_solo(orpheus_jobs, orpheus_reference):
    """All tiny jobs at once (one engine, batched steps) equal the reference's solo runs."""
    from omni_backend.models.orpheus.runner import create_engine
    from omni_backend.models.orpheus.sampling import stop_token_ids
    from omni_backend.models.orpheus.tokens import OrpheusPrompt

    jobs = [j for j in orpheus_jobs if j["shape"] == "tiny2"]
    prompt = OrpheusPrompt(jobs[0]["checkpoint"])
    eos = stop_token_ids(jobs[0]["checkpoint"], prompt.tokens.end_of_speech)
    engine = create_engine(jobs[0]["checkpoint"], eos, max_num_seqs=4, max_model_len=512)
    got = engine.generate([(j["name"], orpheus_reference[j["name"]]["prompt_ids"].tolist(), _params(j)) for j in jobs])
    for j in jobs:
        assert [f[0] for f in got[j["name"]]] == orpheus_reference[j["name"]]["tokens"].tolist(), j["name"]


@pytest.fixture(scope="module")
def vllm_available():
    from pathlib import Path

    from tests.requirement import require

    venv = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    require(venv.exists() or bool(os.environ.get("OMNI_VLLM_PYTHON")), f"vLLM venv missing: {venv} (run `make vllm`)")


def test_vllm_engine_tokens_equal_reference(vllm_available, orpheus_jobs, orpheus_reference):
    import asyncio

    from omni_backend.engine.vllm_engine import VLLMEngine, engine_options
    from omni_backend.models.orpheus.sampling import stop_token_ids
    from omni_backend.models.orpheus.tokens import OrpheusPrompt
    from omni_backend.deploy import StageDeploy

    for shape in ("tiny", "tiny2"):
        jobs = [j for j in orpheus_jobs if j["shape"] == shape]
        path = jobs[0]["checkpoint"]
        eos = stop_token_ids(path, OrpheusPrompt(path).tokens.end_of_speech)
        engine = VLLMEngine(path, engine_options(StageDeploy(engine="vllm", max_num_seqs=4, max_model_len=512)), eos)
        engine.start()
        try:
            async def run(job):
                stream = engine.add_request(uuid.uuid4().hex, orpheus_reference[job["name"]]["prompt_ids"].tolist(),
                                            _params(job))
                return [e.codes[0] async for e in stream if e.codes is not None]

            async def all_at_once():
                return await asyncio.gather(*(run(j) for j in jobs))

            for job, tokens in zip(jobs, asyncio.run(all_at_once())):
                want = [t for t in orpheus_reference[job["name"]]["tokens"].tolist() if t not in eos]
                assert tokens == want, job["name"]
        finally:
            engine.close()
