"""Shared Qwen3-TTS fixtures (loaded through ``pytest_plugins = ["tests.qwen3_fixtures"]``).

Session-scoped: tiny random checkpoints written once to temporary folders, loaded checkpoints,
and one run of the reference package (in ``.venv-oracle``, by subprocess) that produces the
reference codes and token ids for every parity case.

Fixtures:
    qwen3_checkpoint_factory(size, model_type, seed=0, eos_after=None) -> Path   (cached per args)
    qwen3_tiny_cv       tiny custom_voice (0.6B-style size string: instructions ignored)
    qwen3_tiny_vd       tiny voice_design
    qwen3_tiny2_cv      tiny2 custom_voice (other layer counts, 1.7B-style projection)
    qwen3_tiny_eos      tiny custom_voice rigged to stop after QWEN3_EOS_AFTER frames
    qwen3_loaded(path)  -> Qwen3TTSCheckpoint (cached per path)
    qwen3_parity_jobs   the parity prompts per checkpoint (the oracle's jobs list)
    qwen3_reference     the oracle's output (dict of numpy arrays + "meta"); needs the oracle venv

Tests that need the oracle venv call :func:`require_qwen3_oracle` (through their reference
fixture): without the venv they skip, and under CI (``CI=true``) they fail.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.requirement import require

REPO = Path(__file__).resolve().parents[1]
QWEN3_ORACLE_PYTHON = REPO / ".venv-oracle" / "bin" / "python"
QWEN3_ORACLE_SCRIPT = REPO / "tests" / "oracle" / "qwen3_tts_reference.py"
QWEN3_EOS_AFTER = 5
QWEN3_THREADS = 1  # the same on both sides: on CPU a prefill's bits depend on the thread count


def require_qwen3_oracle() -> None:
    """Skip the calling test (or fixture) when the reference venv is missing; fail instead when
    the environment variable ``CI`` is ``true``: there a missing oracle is a broken set-up, and a
    skipped parity test would pass unnoticed."""
    require(QWEN3_ORACLE_PYTHON.exists(),
            f"reference venv missing: {QWEN3_ORACLE_PYTHON} (run `make oracle` or tests/oracle/install.sh)")


# Strings that stress the tokenizer: contractions, CamelCase, digits, slashes, newlines, CJK, emoji.
QWEN3_TOKENIZER_TEXTS = [
    "Hello world, this is a streaming test.",
    "Don't stop; it's 5 o'clock, we'll see. I'M SHOUTING!",
    "HelloWorld CamelCaseWords iPhone XMLHttpRequest McDonald's",
    "path/to/file and a/b/c // comments\nnew line\r\n\n  indented",
    "1234567 3.14159 1,000,000 #hashtag @user",
    "你好，世界。今天天气很好！",
    "こんにちは、世界。カタカナ",
    "안녕하세요 세계",
    "Ünïcödé café naïve 😀 emoji",
    "  leading spaces and trailing   ",
    "<|im_start|> literal special tokens <|im_end|>",
]


def _greedy(prompt_id: str, text: str, **fields) -> dict:
    return {"id": prompt_id, "text": text, "greedy": True, **fields}


def qwen3_parity_prompts() -> dict[str, list[dict]]:
    """Prompts per checkpoint fixture name. Modes follow the wrappers: without
    ``non_streaming_mode`` the wrapper default (True) applies."""
    hello = "Hello world, this is a streaming test."
    return {
        "qwen3_tiny_cv": [
            _greedy("cv_en_ryan", hello, speaker="Ryan", language="English", max_new_tokens=16),
            _greedy("cv_zh_eric_stream", "你好，世界。今天天气很好。", speaker="eric", language="Chinese",
                    non_streaming_mode=False, max_new_tokens=12),
            _greedy("cv_auto_dylan", "我们去北京吧，好不好？", speaker="Dylan", language="auto",
                    instruct="Speak slowly.", max_new_tokens=12),
            _greedy("cv_fr_vivian_penalty", "Bonjour tout le monde, comment ça va ?", speaker="vivian",
                    language="French", non_streaming_mode=False, repetition_penalty=1.3, max_new_tokens=12),
        ],
        "qwen3_tiny_vd": [
            _greedy("vd_en", "Hello there, how are you doing today?", instruct="A calm, low male voice.",
                    language="English", max_new_tokens=12),
            _greedy("vd_zh_stream", "今天我们来讨论一下人工智能。", instruct="用特别愤怒的语气说",
                    non_streaming_mode=False, repetition_penalty=1.0, max_new_tokens=12),
        ],
        "qwen3_tiny2_cv": [
            _greedy("t2_en_instruct", "Speak up, please! It's 5 o'clock.", speaker="Aiden", language="english",
                    instruct="Speak happily and fast.", max_new_tokens=12),
            _greedy("t2_ko_stream", "북쪽 바람과 해님이 서로 힘이 세다고 다투고 있었습니다.", speaker="sohee",
                    language="Korean", non_streaming_mode=False, repetition_penalty=1.3, max_new_tokens=12),
            _greedy("t2_zh_dylan", "我们去北京吧。", speaker="Dylan", language="Chinese", instruct="",
                    max_new_tokens=12),
        ],
        "qwen3_tiny_eos": [
            _greedy("eos_en", hello, speaker="Ryan", language="English", max_new_tokens=20),
            _greedy("eos_zh_stream", "你好，世界。今天天气很好。", speaker="eric", language="Chinese",
                    non_streaming_mode=False, max_new_tokens=20),
            _greedy("eos_long_stream", "A much longer sentence, with quite a few more tokens in it than the "
                    "others have, moves the anchor further along.", speaker="vivian", non_streaming_mode=False,
                    max_new_tokens=20),
        ],
    }


@pytest.fixture(scope="session")
def qwen3_checkpoint_factory(tmp_path_factory):
    from omni_backend.models.qwen3_tts.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("qwen3_checkpoints")
    made: dict[tuple, Path] = {}

    def make(size: str, model_type: str, seed: int = 0, eos_after: int | None = None) -> Path:
        key = (size, model_type, seed, eos_after)
        if key not in made:
            name = f"{size}_{model_type}_s{seed}" + (f"_eos{eos_after}" if eos_after else "")
            made[key] = Path(write_random_checkpoint(str(root / name), size, model_type, seed, eos_after))
        return made[key]

    return make


@pytest.fixture(scope="session")
def qwen3_tiny_cv(qwen3_checkpoint_factory) -> Path:
    return qwen3_checkpoint_factory("tiny", "custom_voice")


@pytest.fixture(scope="session")
def qwen3_tiny_vd(qwen3_checkpoint_factory) -> Path:
    return qwen3_checkpoint_factory("tiny", "voice_design", seed=1)


@pytest.fixture(scope="session")
def qwen3_tiny2_cv(qwen3_checkpoint_factory) -> Path:
    return qwen3_checkpoint_factory("tiny2", "custom_voice", seed=2)


@pytest.fixture(scope="session")
def qwen3_tiny_eos(qwen3_checkpoint_factory) -> Path:
    return qwen3_checkpoint_factory("tiny", "custom_voice", seed=3, eos_after=QWEN3_EOS_AFTER)


@pytest.fixture(scope="session")
def qwen3_loaded():
    from omni_backend.models.qwen3_tts.checkpoint import load_checkpoint

    loaded = {}

    def load(path: Path):
        if str(path) not in loaded:
            loaded[str(path)] = load_checkpoint(str(path))
        return loaded[str(path)]

    return load


@pytest.fixture(scope="session")
def qwen3_parity_jobs(qwen3_tiny_cv, qwen3_tiny_vd, qwen3_tiny2_cv, qwen3_tiny_eos) -> list[dict]:
    paths = {"qwen3_tiny_cv": qwen3_tiny_cv, "qwen3_tiny_vd": qwen3_tiny_vd, "qwen3_tiny2_cv": qwen3_tiny2_cv,
             "qwen3_tiny_eos": qwen3_tiny_eos}
    return [{"name": name, "checkpoint": str(paths[name]), "prompts": prompts}
            for name, prompts in qwen3_parity_prompts().items()]


def _unpatched_copy(checkpoint: Path, target: Path) -> Path:
    """The same checkpoint with a config.json from transformers 4.57.1 (tokenizer not patched)."""
    target.mkdir(parents=True, exist_ok=True)
    for item in checkpoint.iterdir():
        if item.name != "config.json":
            (target / item.name).symlink_to(item)
    config = json.loads((checkpoint / "config.json").read_text())
    config["transformers_version"] = "4.57.1"
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="session")
def qwen3_reference(qwen3_parity_jobs, qwen3_checkpoint_factory, tmp_path_factory) -> dict:
    """One oracle run: parity prompts, tokenizer texts (both tokenizer regimes), and a load of
    every tiny type (its missing/unexpected weight names land in ``meta``)."""
    require_qwen3_oracle()
    work = tmp_path_factory.mktemp("qwen3_oracle")
    jobs = [dict(job) for job in qwen3_parity_jobs]
    jobs[0]["tokenize"] = QWEN3_TOKENIZER_TEXTS
    unpatched = _unpatched_copy(Path(jobs[0]["checkpoint"]), work / "unpatched")
    jobs.append({"name": "unpatched_tokenizer", "checkpoint": str(unpatched), "tokenize": QWEN3_TOKENIZER_TEXTS})
    for size, kind in (("tiny", "base"), ("tiny2", "voice_design"), ("tiny2", "base")):
        jobs.append({"name": f"load_{size}_{kind}", "checkpoint": str(qwen3_checkpoint_factory(size, kind))})
    jobs_path = work / "jobs.json"
    jobs_path.write_text(json.dumps(jobs, ensure_ascii=False))
    out = work / "reference.npz"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(QWEN3_ORACLE_PYTHON), str(QWEN3_ORACLE_SCRIPT), "--jobs", str(jobs_path),
                           "--out", str(out), "--threads", str(QWEN3_THREADS)],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"oracle failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    with np.load(out) as data:
        result = {key: data[key] for key in data.files}
    result["meta"] = json.loads(str(result["meta"]))
    result["jobs"] = jobs
    return result


# ----------------------------------------------------------------------------- helpers


def qwen3_prompt_from_case(builder, case: dict):
    """Our prompt for an oracle prompt case (same fields the reference wrapper takes)."""
    return builder.build(case["text"], speaker=case.get("speaker"), language=case.get("language"),
                         instruct=case.get("instruct"), non_streaming_mode=case.get("non_streaming_mode"))


def qwen3_params_from_case(case: dict, **overrides):
    from omni_backend.engine import SamplingParams

    values = {"max_new_tokens": case.get("max_new_tokens", 40),
              "repetition_penalty": case.get("repetition_penalty", 1.05)}
    values.update(overrides)
    if case.get("greedy", True):
        return SamplingParams.greedy(**values)
    return SamplingParams(**values)


@pytest.fixture(scope="module")
def qwen3_threads():
    """CPU float results depend on torch's intra-op thread count: the Qwen3 tests pin it to
    QWEN3_THREADS for a module and restore it after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(QWEN3_THREADS)
    yield
    torch.set_num_threads(before)


def talker_stage_responses(url: str, pipeline: str, request: dict,
                           outputs: tuple[str, ...] = ("AUDIO", "CODES")) -> list[dict]:
    """A Qwen3-TTS talker stage's own responses over gRPC, each as {output name: array or None};
    `request` is the adapter's normalized request (the stage's REQUEST). The final flag-only
    response is left out; a final response that carries outputs is kept."""
    import queue
    import uuid

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = [grpcclient.InferInput("REQUEST", [1], "BYTES"), grpcclient.InferInput("REQUEST_ID", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([json.dumps(request).encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([uuid.uuid4().hex.encode()], dtype=np.object_))
    client.async_stream_infer(f"{pipeline}__talker", inputs, enable_empty_final_response=True)
    responses = []
    try:
        while True:
            result, error = results.get(timeout=120)
            assert error is None, error
            response = {name: result.as_numpy(name) for name in outputs}
            final = result.get_response().parameters["triton_final_response"].bool_param
            if not final or any(value is not None for value in response.values()):
                responses.append(response)
            if final:
                return responses
    finally:
        client.stop_stream()
        client.close()

