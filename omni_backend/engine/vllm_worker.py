"""The vLLM worker process: hosts vLLM's engine for one stage and serves it over a local socket.

Run BY PATH with the python of ``.venv-vllm`` (never imported by the project: it imports only the
standard library and vllm, whose pins conflict with the project's):

    OMNI_VLLM_AUTHKEY=<hex> .venv-vllm/bin/python omni_backend/engine/vllm_worker.py \\
        --address /tmp/x/vllm.sock --model DIR --options '{"max_num_seqs": 8, ...}' --parent-pid PID

The authkey comes by environment, not argv (argv is world-readable in ``ps``). The project side
is :mod:`omni_backend.engine.vllm_engine`, whose docstring explains the design.

Start-up: listen on ``--address`` (a Unix socket), accept the stage's one connection, close the
listener (which removes the socket file: nobody else can connect), then import vLLM and build
``LLMEngine`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni`` executor) and send
``ready`` or ``load_error``.

Protocol: pickled plain dicts, one per message, each with ``op``.

stage -> worker
    {"op": "add", "rid": str, "prompt_token_ids": [int], "sampling": {temperature (0: greedy),
     top_k (-1 or 0: off), top_p, repetition_penalty, seed, max_tokens, min_tokens, stop_token_ids}}
    {"op": "abort", "rid": str}          -> an ``outputs`` entry with finish_reason "abort"
    {"op": "stats", "id": int | None}    -> {"op": "stats", "id", "running", "waiting"}; with id None
                                            it is the stage's liveness ping (answered between steps)
worker -> stage
    {"op": "ready", "pid", "vllm_version", "import_s", "engine_s", "max_model_len", "kv_cache_bytes"}
    {"op": "load_error", "error": str}   (then the worker exits 1)
    {"op": "outputs", "outputs": [{"rid", "token_ids": [int] (new ones), "finished": bool,
                                    "finish_reason": "stop" | "length" | "abort" | None}]}
                                            one message per engine step, all requests' deltas
    {"op": "error", "rid": str, "error": str}   a request vLLM refused (it is not in the engine)
    {"op": "fatal", "error": str}        ``step()`` raised: the engine is broken; the worker exits 1

A stop token ends a request with "stop" and is included in ``token_ids`` (vLLM's behaviour; the
stage drops it). The worker exits when the socket closes (the stage closed it or died) and, as a
second guard, when its parent (``--parent-pid``) goes away, e.g. while it is still loading; either
way it removes the socket folder, which a dead stage cannot.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, Listener
from typing import Any

AUTHKEY_ENV = "OMNI_VLLM_AUTHKEY"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _environment(options: dict[str, Any]) -> None:
    """Settings vLLM and torch read at import time, so set before importing them."""
    # vLLM's engine core in this process: 3-4 s start-up instead of ~19 s for its own processes
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = options.get("device", "cpu")
    if device == "cpu":
        # In-process, vLLM's default binding (auto) made steps 30x slower on these machines:
        # 62-84 ms instead of 2.25 ms with nobind for a tiny model.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        if options.get("threads"):
            os.environ["OMP_NUM_THREADS"] = str(int(options["threads"]))
    elif device.startswith("cuda:"):
        # vLLM takes the first visible GPU; cuda:N is made the only one this process sees
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]


def _watch_parent(parent: int, scratch: str) -> None:
    """Exit when the parent goes away (we are reparented), e.g. while loading, before the socket
    can tell us: a worker must never outlive its stage. ``parent`` comes from the stage, not
    from ``os.getppid()`` at start: a parent that died before this line ran would pass unseen."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                _stage_gone(scratch)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _kv_cache_bytes(model: str, options: dict[str, Any]) -> int | None:
    """On CPU, the KV cache for ``max_num_seqs`` full-length sequences (the torch engine's static
    cache holds as much, so admission means the same on both engines). Left unset, vLLM on CPU
    reserves ``gpu_memory_utilization`` of the machine's memory (0.9 by default)."""
    if options.get("kv_cache_bytes"):
        return int(options["kv_cache_bytes"])
    if options.get("device", "cpu") != "cpu":
        return None   # on GPU gpu_memory_utilization sizes it
    with open(os.path.join(model, "config.json")) as handle:
        config = json.load(handle)
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    dtype = options.get("dtype") or config.get("torch_dtype") or "float32"
    per_token = 2 * config["num_hidden_layers"] * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 4)
    block = int(options.get("block_size") or 128)
    blocks = int(options.get("max_num_seqs", 8)) * math.ceil(int(options["max_model_len"]) / block) + 1
    return blocks * block * per_token


def engine_kwargs(model: str, options: dict[str, Any], scratch: str) -> dict[str, Any]:
    """vLLM's engine arguments for these options (also what perf/vllm_generate.py gives plain
    ``vllm.LLM``, so the baseline runs the same engine). ``scratch``: a folder the caller owns."""
    # vLLM adds the eos ids of the model's generation_config.json to every request's stop ids; a
    # folder with an empty one keeps the stops to the stage's own eos ids (and adds no default
    # sampling parameters), as on the torch engine.
    generation_config = os.path.join(scratch, "generation_config")
    os.makedirs(generation_config, exist_ok=True)
    with open(os.path.join(generation_config, "generation_config.json"), "w") as handle:
        handle.write("{}")
    device = options.get("device", "cpu")
    kv_cache_bytes = _kv_cache_bytes(model, options)
    kwargs: dict[str, Any] = dict(
        model=model,
        skip_tokenizer_init=True,               # the stage tokenizes; prompts are token ids
        generation_config=generation_config,
        dtype=options.get("dtype", "auto"),
        max_model_len=int(options["max_model_len"]),
        max_num_seqs=int(options.get("max_num_seqs", 8)),
        enforce_eager=bool(options.get("enforce_eager", False)),
        distributed_executor_backend="uni",
        enable_prefix_caching=bool(options.get("enable_prefix_caching", False)),
        disable_log_stats=True,
        seed=0,
    )
    if device == "cpu":
        # vLLM 0.32 rewinds the generator of a request whose sampled token it discards (a prompt
        # prefilled in chunks) with set_offset, which CPU generators do not have: one seeded
        # request caught mid-prefill by a burst failed the whole engine ("CPU Generator does not
        # use offset"). Whole prompts per step avoid the discard; the budget holds a full prompt.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(int(options["max_model_len"]), 4096)
    if options.get("block_size"):
        kwargs["block_size"] = int(options["block_size"])
    if kv_cache_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
    if device != "cpu":
        if options.get("gpu_memory_utilization"):
            kwargs["gpu_memory_utilization"] = float(options["gpu_memory_utilization"])
        if options.get("cuda_graph_sizes") and not options.get("enforce_eager"):
            kwargs["cudagraph_capture_sizes"] = sorted(int(s) for s in options["cuda_graph_sizes"])
    return kwargs


def sampling_kwargs(s: dict[str, Any]) -> dict[str, Any]:
    """vLLM ``SamplingParams`` arguments of an ``add`` message's sampling (also perf/vllm_generate.py's)."""
    return dict(temperature=float(s["temperature"]), top_k=int(s["top_k"]), top_p=float(s["top_p"]),
                repetition_penalty=float(s["repetition_penalty"]), seed=s.get("seed"),
                max_tokens=int(s["max_tokens"]), min_tokens=int(s.get("min_tokens", 0)),
                stop_token_ids=list(s.get("stop_token_ids", [])), detokenize=False)


def _load_engine(model: str, options: dict[str, Any], scratch: str) -> tuple[Any, dict[str, Any]]:
    """``scratch``: a folder the stage owns and removes (the socket's)."""
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    kwargs = engine_kwargs(model, options, scratch)
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    return engine, {"max_model_len": engine.model_config.max_model_len,
                    "kv_cache_bytes": kwargs.get("kv_cache_memory_bytes")}


def _stage_gone(scratch: str) -> None:
    """The stage closed the socket or died: remove the socket folder (a dead stage cannot; a
    live one ignores that it is gone) and exit."""
    # the main thread may be binding its socket in there meanwhile (a stage that died while we
    # started): rmtree then lists the folder before the socket appears and cannot remove the folder
    for _ in range(40):
        shutil.rmtree(scratch, ignore_errors=True)
        if not os.path.exists(scratch):
            break
        time.sleep(0.05)
    os._exit(0)


class WorkerLoop:
    """Drains the stage's messages between engine steps, steps while requests exist, and sends
    each step's deltas as one message. Single-threaded: vLLM's engine is not thread-safe."""

    def __init__(self, engine: Any, conn: Connection) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.engine = engine
        self.conn = conn
        self.live: set[str] = set()     # request ids in the engine and not finished
        self._sampling_params = SamplingParams
        self._delta = RequestOutputKind.DELTA

    def run(self) -> None:
        while True:
            busy = bool(self.live)
            # idle: block until a message (or EOF) comes; busy: take what is there, then step
            if self.conn.poll(0 if busy else None):
                self._drain()
            if self.live:
                self._step()

    def _drain(self) -> None:
        while self.conn.poll(0):
            self._handle(self.conn.recv())   # EOFError when the stage is gone: run() ends

    def _handle(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "add":
            self._add(msg)
        elif op == "abort":
            rid = msg["rid"]
            if rid in self.live:   # unknown: it finished already and its end is on the way
                self.engine.abort_request([rid])
                self.live.discard(rid)
                self.conn.send({"op": "outputs", "outputs": [
                    {"rid": rid, "token_ids": [], "finished": True, "finish_reason": "abort"}]})
        elif op == "stats":
            running, waiting = self._counts()
            self.conn.send({"op": "stats", "id": msg.get("id"), "running": running, "waiting": waiting})

    def _add(self, msg: dict[str, Any]) -> None:
        rid = msg["rid"]
        s = msg["sampling"]
        try:
            params = self._sampling_params(**sampling_kwargs(s), output_kind=self._delta)
            self.engine.add_request(rid, {"prompt_token_ids": list(msg["prompt_token_ids"])}, params)
        except Exception as exc:   # vLLM refused it; the request is not in the engine
            self.conn.send({"op": "error", "rid": rid, "error": f"{type(exc).__name__}: {exc}"})
            return
        self.live.add(rid)

    def _counts(self) -> tuple[int, int]:
        """vLLM's own running / waiting queues (its in-process engine core's scheduler)."""
        try:
            scheduler = self.engine.engine_core.engine_core.scheduler
            return len(scheduler.running), len(scheduler.waiting)
        except AttributeError:   # another vLLM layout: its unfinished count, all as running
            return self.engine.get_num_unfinished_requests(), 0

    def _step(self) -> None:
        outputs = []
        for out in self.engine.step():
            rid = out.request_id
            if rid not in self.live:
                continue
            completion = out.outputs[0]
            if out.finished:
                self.live.discard(rid)
            tokens = list(completion.token_ids)
            if tokens or out.finished:
                outputs.append({"rid": rid, "token_ids": tokens, "finished": bool(out.finished),
                                "finish_reason": completion.finish_reason if out.finished else None})
        if outputs:
            self.conn.send({"op": "outputs", "outputs": outputs})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True, help="Unix socket path to listen on")
    parser.add_argument("--model", required=True, help="Hugging Face checkpoint folder")
    parser.add_argument("--options", default="{}", help="engine options as JSON")
    parser.add_argument("--parent-pid", type=int, default=None, help="the stage's pid (default: our parent now)")
    args = parser.parse_args(argv)
    authkey = bytes.fromhex(os.environ.pop(AUTHKEY_ENV))
    options = json.loads(args.options)
    _environment(options)
    scratch = os.path.dirname(os.path.abspath(args.address))   # the stage's folder for this worker
    _watch_parent(args.parent_pid if args.parent_pid is not None else os.getppid(), scratch)

    with Listener(args.address, family="AF_UNIX", authkey=authkey) as listener:
        conn = listener.accept()
    # the listener is closed: its socket file is gone, the accepted connection stays
    if not os.path.isfile(os.path.join(args.model, "config.json")):   # fail before the 10 s import
        conn.send({"op": "load_error", "error": f"no config.json in {args.model}"})
        return 1
    started = time.monotonic()
    try:
        import vllm
        import vllm.v1.engine.llm_engine  # noqa: F401  (the heavy part: torch, inductor, transformers)
        imported = time.monotonic()
        engine, info = _load_engine(args.model, options, scratch)
    except Exception as exc:
        traceback.print_exc()
        conn.send({"op": "load_error", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    conn.send({"op": "ready", "pid": os.getpid(), "vllm_version": vllm.__version__,
               "import_s": round(imported - started, 3), "engine_s": round(time.monotonic() - imported, 3),
               **info})
    try:
        WorkerLoop(engine, conn).run()
    except (EOFError, ConnectionError):   # the stage closed the socket or died: nothing left to serve
        _stage_gone(scratch)
    except Exception as exc:      # the engine itself failed: tell the stage, which restarts us
        traceback.print_exc()
        try:
            conn.send({"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:   # the stage (reading our output) is gone
        pass
    # Skip interpreter teardown: vLLM's finalizers can block or print noise; nothing is pending.
    os._exit(code)
