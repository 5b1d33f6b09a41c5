"""engine: vllm: a real vLLM worker (.venv-vllm) serving tiny random Llamas, against transformers'
greedy ``generate()`` (.venv-oracle, by subprocess) and against its own solo runs.

Two shapes: head_dim 32 with GQA and an untied head; head_dim 64, tied embeddings and llama3 rope
scaling. One engine per shape (module-scoped, parametrized: one worker alive at a time); the
oracle runs once for both. Skipped when .venv-vllm or .venv-oracle is missing, except under
CI=true, where that fails: both venvs are part of `make test`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omni_backend.engine import FrameEvent, PromptTooLongError, SamplingParams
from omni_backend.engine.ar_engine import DuplicateRequestError
from omni_backend.engine.vllm_engine import VLLMEngine, VLLMWorkerError
from omni_backend.errors import InvalidRequest, Unavailable
from omni_backend.models.orpheus.random_llama import write_random_llama
from tests.requirement import require

REPO = Path(__file__).resolve().parents[2]
# a vLLM worker in .venv-vllm against .venv-oracle: not the edit-test loop (tests/tiers.py)
pytestmark = pytest.mark.oracle
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
ORACLE_PYTHON = REPO / ".venv-oracle" / "bin" / "python"
ORACLE_SCRIPT = REPO / "tests" / "oracle" / "llama_reference.py"

SHAPES = {
    "hd32_gqa": dict(vocab_size=384, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                     intermediate_size=256, tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None,
                     max_position_embeddings=1024, seed=1),
    "hd64_tied": dict(vocab_size=320, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=64,
                      intermediate_size=192, tie_word_embeddings=True, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
                      max_position_embeddings=1024, seed=2),
}
OPTIONS = {"max_num_seqs": 8, "max_model_len": 512, "dtype": "float32", "block_size": 32, "enforce_eager": True}
PROMPTS = [[5, 6, 7], [17, 3, 250, 9, 41, 77, 2], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]]
EOS_PROMPT = [12, 34, 56, 78]
NEW_TOKENS = 32
GREEDY = SamplingParams.greedy(max_new_tokens=NEW_TOKENS, min_new_tokens=0, repetition_penalty=1.0)


@pytest.fixture(scope="session")
def llamas(tmp_path_factory) -> dict[str, dict]:
    """Per shape: the checkpoint, the engine's eos ids and transformers' greedy outputs.

    The eos: a token the model emits greedily for EOS_PROMPT at position k >= 3 (not before),
    found from the oracle's run; with it as eos the reference output is the run cut at its
    first eos (greedy: eos only stops). vocab_size - 1 is a second eos id."""
    require(VLLM_PYTHON.exists(), f"vLLM venv missing: {VLLM_PYTHON} (run `make vllm`)")
    require(ORACLE_PYTHON.exists(), f"reference venv missing: {ORACLE_PYTHON} (run `make oracle`)")
    root = tmp_path_factory.mktemp("llamas")
    out: dict[str, dict] = {}
    jobs = []
    for name, shape in SHAPES.items():
        path = write_random_llama(root / name, **shape)
        out[name] = {"path": path, "vocab_size": shape["vocab_size"]}
        jobs.append({"checkpoint": str(path), "prompts": PROMPTS + [EOS_PROMPT], "max_new_tokens": NEW_TOKENS,
                     "eos_token_id": shape["vocab_size"] - 1})
    run = subprocess.run([str(ORACLE_PYTHON), str(ORACLE_SCRIPT)], input=json.dumps({"threads": 1, "jobs": jobs}),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for (name, info), results in zip(out.items(), json.loads(run.stdout)["results"]):
        *reference, eos_run = results
        k = next(i for i in range(3, len(eos_run)) if eos_run[i] not in eos_run[:i])
        eos_ids = {info["vocab_size"] - 1, eos_run[k]}
        info.update(eos_ids=eos_ids, eos_at=k, eos_frames=eos_run[:k],
                    reference=[_cut(tokens, eos_ids) for tokens in reference + [eos_run]][:-1])
    return out


def _cut(tokens: list[int], eos_ids: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i]
    return tokens


@pytest.fixture(scope="module", params=sorted(SHAPES))
def served(request, llamas):
    info = llamas[request.param]
    engine = VLLMEngine(info["path"], OPTIONS, eos_token_ids=info["eos_ids"], hang_timeout_s=30.0)
    engine.start()
    yield engine, info
    worker = engine._worker
    engine.close()
    assert worker.proc.poll() is not None and not Path(worker.folder).exists()   # nothing left behind


async def _collect(engine: VLLMEngine, rid: str, prompt: list[int], params: SamplingParams) -> list[FrameEvent]:
    return [event async for event in engine.add_request(rid, prompt, params)]


def _frames(events: list[FrameEvent]) -> list[int]:
    return [e.codes[0] for e in events if e.codes is not None]


def _run(engine: VLLMEngine, prompt: list[int], params: SamplingParams, rid: str = "solo") -> list[FrameEvent]:
    return asyncio.run(_collect(engine, rid, prompt, params))


def _check_stream(events: list[FrameEvent]) -> None:
    """One frame per token, indices in order, exactly one end event (the last)."""
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    assert all(e.codes is None or len(e.codes) == 1 for e in events)
    assert [e.index for e in events if e.codes is not None] == list(range(len(_frames(events))))


def test_greedy_equals_transformers_generate(served):
    engine, info = served
    for prompt, expected in zip(PROMPTS, info["reference"]):
        events = _run(engine, prompt, GREEDY)
        _check_stream(events)
        assert _frames(events) == expected
        assert events[-1].finish_reason == ("length" if len(expected) == NEW_TOKENS else "stop")


def test_concurrent_requests_equal_their_solo_runs(served):
    engine, info = served
    seeded = SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.05,
                            max_new_tokens=NEW_TOKENS, min_new_tokens=0)
    requests = [(f"g{i}", PROMPTS[i % 3], GREEDY) for i in range(4)]
    requests += [(f"s{i}", PROMPTS[i % 3], dataclasses.replace(seeded, seed=1000 + i)) for i in range(4)]
    solo = {rid: _frames(_run(engine, prompt, params)) for rid, prompt, params in requests}
    assert _frames(_run(engine, PROMPTS[0], requests[4][2])) == solo["s0"]   # a seeded request repeats exactly

    async def together():
        return await asyncio.gather(*(_collect(engine, rid, p, params) for rid, p, params in requests))

    results = asyncio.run(together())
    for (rid, prompt, _), events in zip(requests, results):
        _check_stream(events)
        assert _frames(events) == solo[rid], rid
    for i in range(4):
        assert solo[f"g{i}"] == info["reference"][i % 3]
    assert len({tuple(solo[f"s{i}"]) for i in range(4)}) > 1   # the seeds matter
    assert engine.num_requests == 0


def test_a_burst_of_seeded_requests_with_long_prompts(served):
    """More prompt tokens at once than one step takes (vLLM would prefill some in chunks): with
    per-request generators that failed the whole engine in vLLM 0.32 on CPU ("CPU Generator does
    not use offset"); every request must finish, each equal to its solo run."""
    engine, info = served
    vocab = info["vocab_size"]
    prompts = [[(7 * i + 3 * j) % (vocab - 2) for j in range(300)] for i in range(OPTIONS["max_num_seqs"])]
    params = [SamplingParams(do_sample=True, temperature=0.9, top_p=0.9, repetition_penalty=1.05, seed=i,
                             max_new_tokens=8, min_new_tokens=0) for i in range(len(prompts))]

    async def burst():
        return await asyncio.gather(*(_collect(engine, f"b{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params))))

    results = asyncio.run(burst())
    for i, events in enumerate(results):
        assert events[-1].finish_reason in ("length", "stop"), events[-1]
        assert _frames(events) == _frames(_run(engine, prompts[i], params[i])), i


def test_eos_stops_and_is_not_a_frame(served):
    engine, info = served
    events = _run(engine, EOS_PROMPT, GREEDY)
    _check_stream(events)
    assert _frames(events) == info["eos_frames"] and len(info["eos_frames"]) == info["eos_at"]
    assert events[-1] == FrameEvent("solo", None, True, "stop", info["eos_at"])
    # min_new_tokens holds eos back past it
    held = _frames(_run(engine, EOS_PROMPT, SamplingParams.greedy(
        max_new_tokens=NEW_TOKENS, min_new_tokens=info["eos_at"] + 1, repetition_penalty=1.0)))
    assert held[:info["eos_at"]] == info["eos_frames"] and len(held) > info["eos_at"]
    assert not set(held[:info["eos_at"] + 1]) & info["eos_ids"]


def test_max_new_tokens_ends_with_length(served):
    engine, info = served
    events = _run(engine, PROMPTS[0], SamplingParams.greedy(max_new_tokens=5, min_new_tokens=0,
                                                            repetition_penalty=1.0))
    _check_stream(events)
    assert _frames(events) == info["reference"][0][:5]
    assert events[-1].finish_reason == "length" and events[-1].codes == [info["reference"][0][4]]


def test_cancel_mid_stream_frees_vllm_at_once(served):
    engine, _ = served

    async def main():
        stream = engine.add_request("long", PROMPTS[1], SamplingParams.greedy(max_new_tokens=400, min_new_tokens=0))
        events = []
        async for event in stream:
            events.append(event)
            if len(events) == 3:
                assert engine.running() == (1, 0)
                assert engine.cancel("long")
        return events

    events = asyncio.run(main())
    assert events[-1].finished and events[-1].finish_reason == "cancelled" and events[-1].codes is None
    assert 3 <= len(_frames(events)) < 400
    assert engine.running() == (0, 0)        # vLLM itself holds nothing any more
    assert engine.num_requests == 0 and not engine.cancel("long")


@pytest.mark.parametrize("params, prompt, field", [
    (SamplingParams(temperature=0.0), PROMPTS[0], "temperature"),
    (SamplingParams(top_p=0.0), PROMPTS[0], "top_p"),
    (SamplingParams(top_k=-1), PROMPTS[0], "top_k"),
    (SamplingParams(max_new_tokens=0), PROMPTS[0], "max_new_tokens"),
    (SamplingParams(min_new_tokens=-1), PROMPTS[0], "min_new_tokens"),
    (SamplingParams(repetition_penalty=0.0), PROMPTS[0], "repetition_penalty"),
    (SamplingParams(seed=-3), PROMPTS[0], "seed"),
    (SamplingParams(extra={"x": 1}), PROMPTS[0], "extra"),
    (GREEDY, [], "input"),
    (GREEDY, [1, 2, 10_000], "input"),
    (GREEDY, [1] * OPTIONS["max_model_len"], "input"),
])
def test_bad_requests_name_the_field(served, params, prompt, field):
    engine, _ = served

    async def main():
        with pytest.raises(InvalidRequest) as e:
            engine.add_request("bad", prompt, params)
        return e.value

    error = asyncio.run(main())
    assert error.field == field and str(error).startswith(f"invalid_request: {field}:")
    assert engine.num_requests == 0


def test_prompt_bounds_and_duplicate_ids(served):
    engine, _ = served
    fits = [3] * (OPTIONS["max_model_len"] - 1)   # room for one token

    async def main():
        with pytest.raises(PromptTooLongError):
            engine.add_request("long", fits + [3], GREEDY)
        stream = engine.add_request("dup", fits, GREEDY)
        with pytest.raises(DuplicateRequestError):
            engine.add_request("dup", PROMPTS[0], GREEDY)
        return [event async for event in stream]

    events = asyncio.run(main())
    assert events[-1].finished and len(_frames(events)) <= 1


@pytest.fixture
def lone_engine(llamas):
    """An engine of its own (hd32_gqa) for a test that loses its worker: a lost engine stays lost."""
    info = llamas["hd32_gqa"]
    engine = VLLMEngine(info["path"], OPTIONS, eos_token_ids=info["eos_ids"], hang_timeout_s=30.0)
    engine.start()
    yield engine, info
    worker = engine._worker
    engine.close()
    assert worker.proc.poll() is not None and not Path(worker.folder).exists()   # nothing left behind


def _worker_children() -> list[int]:
    """This process's children that run vllm_worker.py."""
    pids = []
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                if b"vllm_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
            except OSError:
                pass
    return pids


def _stays_lost(engine: VLLMEngine, pid: int, others: set[int]) -> None:
    """A lost worker is not replaced by the engine (its owner restarts it: a served stage exits
    and the supervisor reloads it); requests are refused meanwhile. `others`: workers of other
    engines (a module-scoped one) that ran before the loss."""

    async def refused():
        with pytest.raises(Unavailable, match="^unavailable: "):
            engine.add_request("early", PROMPTS[0], GREEDY)

    asyncio.run(refused())
    time.sleep(3.0)   # the engine's own restart started a worker 0.5 s after the loss
    assert not engine.ready and engine._worker.proc.pid == pid
    assert not set(_worker_children()) - others - {pid}, "the engine started a worker of its own"


def test_worker_killed_mid_stream_ends_streams_and_tells_its_owner(lone_engine):
    engine, info = lone_engine
    pid = engine._worker.proc.pid
    others = set(_worker_children()) - {pid}
    lost: list[str] = []
    engine.on_worker_exit = lost.append

    async def main():
        streams = [engine.add_request(f"k{i}", PROMPTS[i % 3], SamplingParams.greedy(max_new_tokens=400))
                   for i in range(3)]
        first = await streams[0].__anext__()
        assert first.codes is not None
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        errors = []
        for stream in streams:
            with pytest.raises(Unavailable) as e:
                async for _ in stream:
                    pass
            errors.append(str(e.value))
        return time.monotonic() - killed, errors

    elapsed, errors = asyncio.run(main())
    assert elapsed < 5.0 and all(e.startswith("unavailable: ") for e in errors), errors
    assert not engine.ready and engine.num_requests == 0
    deadline = time.monotonic() + 1.0   # the hook runs on the engine's thread just after the streams end
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lost == ["died (exit code -9)"]
    _stays_lost(engine, pid, others)
    assert lost == ["died (exit code -9)"]


def test_hung_worker_is_killed_and_its_owner_told(lone_engine):
    engine, info = lone_engine
    worker = engine._worker
    others = set(_worker_children()) - {worker.proc.pid}
    lost: list[str] = []
    engine.on_worker_exit = lost.append
    engine.hang_timeout_s = 2.0

    async def main():
        stream = engine.add_request("hung", PROMPTS[0], SamplingParams.greedy(max_new_tokens=400))
        assert (await stream.__anext__()).codes is not None
        os.kill(worker.proc.pid, signal.SIGSTOP)   # alive, silent
        stopped = time.monotonic()
        with pytest.raises(Unavailable, match="^unavailable: the vLLM worker stopped answering"):
            async for _ in stream:
                pass
        return time.monotonic() - stopped

    assert asyncio.run(main()) < 2.0 + 2 * engine.ping_interval_s + 1.0
    assert worker.proc.wait(5) == -signal.SIGKILL
    # the owner is told after the streams are failed, from the engine's reader thread
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(lost) == 1 and lost[0].startswith("stopped answering")
    _stays_lost(engine, worker.proc.pid, others)


def test_start_failures_are_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_VLLM_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(VLLMWorkerError, match="make vllm"):
        VLLMEngine(tmp_path, OPTIONS, eos_token_ids=[1])
    monkeypatch.delenv("OMNI_VLLM_PYTHON")
    require(VLLM_PYTHON.exists(), f"vLLM venv missing: {VLLM_PYTHON} (run `make vllm`)")
    engine = VLLMEngine(tmp_path, OPTIONS, eos_token_ids=[1])   # no checkpoint there
    with pytest.raises(VLLMWorkerError, match="config.json"):
        engine.start()
    assert not engine.ready
    engine.close()


def _gone(pid: int) -> bool:
    """Exited (a zombie left for init to reap counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


_DIE_LOADING = """
import os, subprocess, sys
from omni_backend.engine.vllm_engine import WORKER_SCRIPT, vllm_python
os.makedirs(sys.argv[2] + "/w")
proc = subprocess.Popen([str(vllm_python()), str(WORKER_SCRIPT), "--address", sys.argv[2] + "/w/w.sock",
                         "--model", sys.argv[1], "--parent-pid", str(os.getpid())],
                        env={**os.environ, "OMNI_VLLM_AUTHKEY": "00" * 32}, stdout=subprocess.DEVNULL)
print(proc.pid, sys.argv[2] + "/w", flush=True)
os._exit(0)   # before anyone connected: the worker waits in accept()
"""
_DIE_SERVING = """
import json, os, sys
from omni_backend.engine.vllm_engine import VLLMEngine
engine = VLLMEngine(sys.argv[1], json.loads(sys.argv[3]), eos_token_ids=[1])
engine.start()
print(engine._worker.proc.pid, engine._worker.folder, flush=True)
os._exit(0)   # a stage process that dies without close()
"""


@pytest.mark.parametrize("script", [_DIE_LOADING, _DIE_SERVING], ids=["while_loading", "after_ready"])
def test_worker_never_outlives_its_stage(llamas, tmp_path, script):
    run = subprocess.run([sys.executable, "-c", script, str(llamas["hd32_gqa"]["path"]), str(tmp_path),
                          json.dumps(OPTIONS)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    pid, folder = run.stdout.split()[:2]
    pid = int(pid)
    deadline = time.monotonic() + 5.0
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), f"worker {pid} outlived its parent"
    assert not Path(folder).exists()   # the worker removed the socket folder of its dead stage
