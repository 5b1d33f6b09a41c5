"""``engine: vllm``: vLLM as the AR engine of a plain causal-LM stage, run in a worker process.

:class:`VLLMEngine` has :class:`~omni_backend.engine.async_engine.AsyncEngine`'s surface
(``add_request`` -> :class:`FrameStream`, ``cancel``, ``num_requests``, ``close``), so a stage
runs either engine. Importing this module needs no vLLM.

    engine = VLLMEngine(model_dir, {"max_num_seqs": 8, "max_model_len": 2048, "dtype": "float32"},
                        eos_token_ids={128258})
    engine.start()                                   # blocks until the worker has loaded the model
    stream = engine.add_request("req-1", prompt_token_ids, params)   # inside a running event loop
    async for event in stream: ...                   # event.codes == [token]
    engine.close()

Why a worker process, and this one:

* Isolation. vLLM cannot live in the project's environment (it needs numpy >= 2, transformers 5
  and an older fastapi), so it has its own venv (``.venv-vllm``, ``make vllm``) and runs
  ``vllm_worker.py`` with that python. A crash of vLLM (a segfault in a kernel, an OOM kill, a
  broken engine) kills only the worker: every open stream ends with ``unavailable: ...``, the
  engine takes no more requests and tells its owner (``on_worker_exit``), who starts a new one. A
  served stage exits then and the supervisor reloads it with a fresh worker: one mechanism for
  every dead stage, and readiness is false meanwhile, so clients go elsewhere instead of
  reaching a stage that answers ``unavailable`` while a worker restarts behind it.
* Start-up. The worker hosts vLLM's engine core in its own process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni`` executor): measured here 3-4 s to build the
  engine after a ~7 s import, against ~19 s when vLLM starts its own engine-core and worker
  processes. On CPU it runs with ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (vLLM's default binding,
  in-process, made steps ~30x slower on these machines).
* Latency. The worker steps ``LLMEngine`` (``add_request`` / ``step`` / ``abort_request``) from
  its own loop and sends each step's new tokens, all requests together, as one message over a
  Unix socket (``multiprocessing.connection`` with an authkey; pickled plain dicts): one hop,
  no HTTP, no tokenizer (``skip_tokenizer_init``; the stage tokenizes, prompts are token ids).
  Messages between steps are taken at once, so an abort frees vLLM's slot before its next step.
* Shutdown. ``close()`` sends SIGTERM, then SIGKILL after a short grace, and removes the socket
  folder. The worker also exits by itself when the socket closes (this process died) or its
  parent goes away while loading, so no worker outlives its stage.

Semantics are the torch engine's (``model_runner.py``, ``sequence.py``): each generated token is
one :class:`FrameEvent` with ``codes=[token]``; a token in ``eos_token_ids`` ends the request with
``stop`` and is not a frame; ``max_new_tokens`` ends it with ``length`` (the last frame rides on
the end event when vLLM reports both in one step); ``min_new_tokens`` holds eos back; a cancel
ends it with ``cancelled``; a request vLLM refuses ends with ``error``. Greedy is temperature 0;
each request samples from its own seed (``params.seed``, else a fresh random one), so a seeded
request repeats exactly. One difference: an eos-stopped request ends with an event without codes,
since its last frame went out as soon as vLLM made it (the torch engine emits a frame one step
later, together with the next token). The stops are exactly ``eos_token_ids``: the worker hides
the checkpoint's ``generation_config.json`` from vLLM, which would otherwise add its eos ids.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Optional

from omni_backend.errors import Unavailable

from .ar_engine import DuplicateRequestError
from .async_engine import EngineClosedError, FrameStream
from .sequence import FrameEvent, PromptTooLongError, SamplingParams, SamplingParamsError

__all__ = ["VLLMEngine", "VLLMCounts", "VLLMWorkerError", "OPTION_KEYS", "engine_options", "vllm_python"]

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
WORKER_SCRIPT = Path(__file__).with_name("vllm_worker.py")
PYTHON_ENV = "OMNI_VLLM_PYTHON"
AUTHKEY_ENV = "OMNI_VLLM_AUTHKEY"
# What the worker reads from ``options`` (vllm_worker.py); anything else is a typo.
OPTION_KEYS = ("max_num_seqs", "max_model_len", "dtype", "block_size", "enforce_eager", "cuda_graph_sizes",
               "gpu_memory_utilization", "device", "threads", "enable_prefix_caching", "kv_cache_bytes")
# vLLM's finish reasons -> the torch engine's
_FINISH = {"stop": "stop", "length": "length", "abort": "cancelled"}
_TAIL_LINES = 40


class VLLMWorkerError(RuntimeError):
    """The worker could not be started (missing venv, load error, timeout); says why, with the
    worker's last output lines."""


class VLLMCounts(NamedTuple):
    """vLLM's own scheduler queues in the worker."""
    running: int
    waiting: int


def vllm_python() -> Path:
    """The python of vLLM's venv: ``$OMNI_VLLM_PYTHON`` or ``<repo>/.venv-vllm/bin/python``."""
    path = Path(os.environ.get(PYTHON_ENV) or REPO / ".venv-vllm" / "bin" / "python")
    if not path.exists():
        raise VLLMWorkerError(f"vLLM's python not found at {path}: run `make vllm` (deploy/vllm/install.sh), "
                              f"or set {PYTHON_ENV}")
    return path


def engine_options(stage_deploy: Any) -> dict[str, Any]:
    """The worker options of a deploy stage (``omni_backend.deploy.StageDeploy``, engine vllm)."""
    sd = stage_deploy
    options = {"max_num_seqs": sd.max_num_seqs, "max_model_len": sd.max_model_len, "dtype": sd.dtype,
               "block_size": sd.block_size, "enforce_eager": sd.enforce_eager,
               "cuda_graph_sizes": list(sd.cuda_graph_sizes), "device": sd.device, "threads": sd.threads}
    if sd.gpu_memory_utilization is not None:
        options["gpu_memory_utilization"] = sd.gpu_memory_utilization
    return options


def worker_sampling(params: SamplingParams, seed: int, eos_token_ids: Iterable[int]) -> dict[str, Any]:
    """A request's sampling as the worker's ``add`` message carries it (vLLM's field names)."""
    return {
        "temperature": float(params.temperature) if params.do_sample else 0.0,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "top_p": float(params.top_p),
        "repetition_penalty": float(params.repetition_penalty),
        "seed": seed,
        "max_tokens": params.max_new_tokens,
        # vLLM refuses min_tokens > max_tokens; either way eos is held back for every token
        "min_tokens": min(params.min_new_tokens, params.max_new_tokens),
        "stop_token_ids": sorted(eos_token_ids)}


def _model_config(model_path: Path) -> dict[str, Any]:
    try:
        config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config.get("text_config", config)


class _Worker:
    """One worker process, its connection and its socket folder."""

    def __init__(self, proc: subprocess.Popen, folder: str) -> None:
        self.proc = proc
        self.folder = folder
        self.conn: Optional[Connection] = None
        self.info: dict[str, Any] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.send_lock = threading.Lock()
        self._pump = threading.Thread(target=self._read_output, name=f"vllm-worker-{proc.pid}-output", daemon=True)
        self._pump.start()

    def _read_output(self) -> None:
        """vLLM's log lines (stdout and stderr): to our log, the last ones kept for errors."""
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            logger.info("vllm worker %d: %s", self.proc.pid, line)

    def output_tail(self) -> str:
        self._pump.join(timeout=1.0)   # a dead worker's last lines are still in the pipe
        return "\n".join(self.tail)

    def send(self, msg: dict[str, Any]) -> None:
        """Raises OSError when the connection is gone."""
        with self.send_lock:
            if self.conn is None:
                raise OSError("no connection to the vLLM worker")
            self.conn.send(msg)

    def terminate(self, grace_s: float) -> Optional[int]:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def release(self) -> None:
        """Close the connection and remove the socket folder. Called by the thread that reads
        the connection (or once it has ended): closing an fd under a reader risks its reuse."""
        with self.send_lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def stop(self, grace_s: float) -> None:
        self.terminate(grace_s)
        self.release()


@dataclass
class _Request:
    stream: FrameStream
    frames: int = 0


class _Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Optional[VLLMCounts] = None


class VLLMEngine:
    def __init__(self, model_path: str | Path, options: dict[str, Any], eos_token_ids: Iterable[int],
                 python: str | Path | None = None, *, default_params: Optional[SamplingParams] = None,
                 on_worker_exit: Optional[Callable[[str], None]] = None, start_timeout_s: float = 300.0,
                 hang_timeout_s: float = 60.0, ping_interval_s: float = 1.0, stop_grace_s: float = 3.0) -> None:
        """``options``: :data:`OPTION_KEYS` (see :func:`engine_options` for a deploy stage).
        ``on_worker_exit(reason)`` is called when a started worker is lost, after its streams
        have ended; the engine then refuses requests for good (a stage exits and is reloaded).
        ``hang_timeout_s``: a worker silent for this long (no step output, no answer to the
        pings sent every ``ping_interval_s`` when the line is quiet) is killed and lost; it
        must exceed the longest single engine step (a long prefill of a big model)."""
        unknown = sorted(set(options) - set(OPTION_KEYS))
        if unknown:
            raise ValueError(f"unknown vLLM engine options {unknown}; allowed: {', '.join(OPTION_KEYS)}")
        self.model_path = Path(model_path)
        self.python = Path(python) if python is not None else vllm_python()
        if not self.python.exists():
            raise VLLMWorkerError(f"vLLM's python not found at {self.python}: run `make vllm`")
        config = _model_config(self.model_path)
        self.options = dict(options)
        # as the torch runner does: no longer than the checkpoint's positions (vLLM refuses more)
        max_len = int(self.options.get("max_model_len", 4096))
        if config.get("max_position_embeddings"):
            max_len = min(max_len, int(config["max_position_embeddings"]))
        self.options["max_model_len"] = max_len
        self.max_model_len = max_len
        self.vocab_size: Optional[int] = config.get("vocab_size")
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.default_params = default_params or SamplingParams()
        self.on_worker_exit = on_worker_exit
        self.start_timeout_s = start_timeout_s
        self.hang_timeout_s = hang_timeout_s
        self.ping_interval_s = ping_interval_s
        self.stop_grace_s = stop_grace_s

        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._waiters: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self._worker: Optional[_Worker] = None
        self._ready = False
        self._closed = False
        self._reader: Optional[threading.Thread] = None
        self.worker_info: dict[str, Any] = {}

    # -- life cycle
    def start(self) -> None:
        """Start the worker and block until it has loaded the model (``VLLMWorkerError`` with the
        worker's last output lines if it fails or takes longer than ``start_timeout_s``)."""
        if self._reader is not None:
            return
        if self._closed:
            raise EngineClosedError("the engine is closed")
        worker = self._launch(lambda: self._closed)
        self._install(worker)
        self._reader = threading.Thread(target=self._read_worker, args=(worker,), name="vllm-engine", daemon=True)
        self._reader.start()

    @property
    def ready(self) -> bool:
        """A worker is up and takes requests (False once it is lost, and after close())."""
        return self._ready

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker; every open stream ends with ``EngineClosedError``."""
        with self._lock:
            self._closed = True
            self._ready = False
            worker = self._worker
        if worker is not None:
            worker.terminate(self.stop_grace_s)     # the reader sees EOF and ends
        if self._reader is not None:
            self._reader.join(timeout)
        if worker is not None:
            worker.release()
        with self._lock:
            requests, self._requests = list(self._requests.values()), {}
        self._fail_waiters()
        for request in requests:
            self._deliver(request.stream, EngineClosedError("the engine was closed"))

    async def __aenter__(self) -> "VLLMEngine":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    # -- requests (thread-safe)
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: Optional[SamplingParams] = None) -> FrameStream:
        """Queue a request (call from a running event loop). Bad parameters raise here
        (``InvalidRequest``); so does a worker that is not up (``unavailable: ...``)."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        params = (params or self.default_params).validate()
        self._check(prompt_token_ids, params)
        loop = asyncio.get_running_loop()
        stream = FrameStream(self, request_id, loop)
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2 ** 63)
        msg = {"op": "add", "rid": request_id, "prompt_token_ids": list(prompt_token_ids),
               "sampling": worker_sampling(params, seed, self.eos_token_ids)}
        with self._lock:
            worker = self._worker
            if not self._ready or worker is None:
                raise Unavailable("the vLLM worker is restarting; retry shortly")
            if request_id in self._requests:
                raise DuplicateRequestError(f"request id {request_id!r} is already in the engine")
            self._requests[request_id] = _Request(stream)
        try:
            worker.send(msg)
        except OSError:
            with self._lock:
                self._requests.pop(request_id, None)
            raise Unavailable("the vLLM worker went away; retry shortly") from None
        return stream

    def _check(self, prompt: Any, params: SamplingParams) -> None:
        if params.extra is not None:
            raise SamplingParamsError("extra", "the vllm engine takes no runner-specific sampling parameters")
        if (not isinstance(prompt, list) or not prompt
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            raise SamplingParamsError("input", "the prompt must be a non-empty list of token ids")
        if min(prompt) < 0 or (self.vocab_size is not None and max(prompt) >= self.vocab_size):
            raise SamplingParamsError("input", f"the prompt holds ids outside the vocabulary (0..{self.vocab_size})")
        if len(prompt) > self.max_model_len - 1:   # not even one token would fit
            raise PromptTooLongError("input", f"the prompt takes {len(prompt)} positions; this engine holds "
                                              f"{self.max_model_len} per request (max_model_len)")

    def cancel(self, request_id: str) -> bool:
        """Abort the request in vLLM; its stream ends with a ``cancelled`` event. False if the
        request is unknown or already ended."""
        with self._lock:
            worker = self._worker
            if request_id not in self._requests or worker is None or not self._ready:
                return False
        try:
            worker.send({"op": "abort", "rid": request_id})
        except OSError:   # the worker is gone: its loss ends the stream
            return False
        return True

    @property
    def num_requests(self) -> int:
        with self._lock:
            return len(self._requests)

    def running(self, timeout: float = 5.0) -> VLLMCounts:
        """vLLM's own running / waiting counts, asked of the worker (blocks for the answer,
        which comes between two engine steps)."""
        waiter = _Waiter()
        with self._lock:
            worker = self._worker
            if not self._ready or worker is None:
                raise Unavailable("the vLLM worker is restarting; retry shortly")
            ident = next(self._ids)
            self._waiters[ident] = waiter
        try:
            worker.send({"op": "stats", "id": ident})
            if not waiter.event.wait(timeout) or waiter.value is None:
                raise Unavailable("the vLLM worker did not answer")
            return waiter.value
        except OSError:
            raise Unavailable("the vLLM worker went away") from None
        finally:
            with self._lock:
                self._waiters.pop(ident, None)

    # -- the worker
    def _launch(self, cancelled: Callable[[], bool]) -> _Worker:
        """Spawn a worker, connect, wait for ``ready``; raise ``VLLMWorkerError`` otherwise."""
        folder = tempfile.mkdtemp(prefix="omni-vllm-")   # 0700: only this user reaches the socket
        address = os.path.join(folder, "worker.sock")
        authkey = secrets.token_bytes(32)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}   # the project's, not vLLM's
        env.update({AUTHKEY_ENV: authkey.hex(), "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1"})
        proc = subprocess.Popen(
            [str(self.python), str(WORKER_SCRIPT), "--address", address, "--model", str(self.model_path),
             "--options", json.dumps(self.options), "--parent-pid", str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=folder)
        worker = _Worker(proc, folder)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            worker.conn = self._connect(worker, address, authkey, deadline, cancelled)
            while True:
                if cancelled():
                    raise VLLMWorkerError("the engine was closed while the worker started")
                if time.monotonic() > deadline:
                    raise VLLMWorkerError(f"the worker was not ready within {self.start_timeout_s:.0f} s")
                if worker.conn.poll(0.1):
                    msg = worker.conn.recv()
                    if msg.get("op") == "ready":
                        worker.info = msg
                        return worker
                    if msg.get("op") == "load_error":
                        raise VLLMWorkerError(f"the worker could not load {self.model_path}: {msg.get('error')}")
                elif proc.poll() is not None:
                    raise VLLMWorkerError(f"the worker exited with code {proc.returncode} while loading")
        except (EOFError, OSError) as exc:
            code = proc.poll()
            error = VLLMWorkerError(f"the worker went away while starting (exit code {code}): {exc}")
        except VLLMWorkerError as exc:
            error = exc
        worker.stop(self.stop_grace_s)
        raise VLLMWorkerError(f"vLLM worker failed to start: {error}\n--- worker output (last lines) ---\n"
                              f"{worker.output_tail()}")

    def _connect(self, worker: _Worker, address: str, authkey: bytes, deadline: float,
                 cancelled: Callable[[], bool]) -> Connection:
        while True:
            try:
                return Client(address, family="AF_UNIX", authkey=authkey)
            except (FileNotFoundError, ConnectionRefusedError):
                pass
            if worker.proc.poll() is not None:
                raise VLLMWorkerError(f"the worker exited with code {worker.proc.returncode} before it listened")
            if cancelled():
                raise VLLMWorkerError("the engine was closed while the worker started")
            if time.monotonic() > deadline:
                raise VLLMWorkerError(f"the worker did not listen within {self.start_timeout_s:.0f} s")
            time.sleep(0.05)

    def _install(self, worker: _Worker) -> None:
        info = worker.info
        logger.info("vLLM worker %d ready: vllm %s, import %.2f s, engine %.2f s", worker.proc.pid,
                    info.get("vllm_version"), info.get("import_s", 0.0), info.get("engine_s", 0.0))
        with self._lock:
            if info.get("max_model_len"):
                self.max_model_len = int(info["max_model_len"])
            self.worker_info = info
            self._worker = worker
            self._ready = not self._closed

    def _read_worker(self, worker: _Worker) -> None:
        """Serve the worker's messages; when it is lost, fail the open streams and tell the owner."""
        reason = self._serve(worker)
        if not self._closed:
            self._lose(worker, reason)

    def _serve(self, worker: _Worker) -> str:
        """Read the worker's messages until it is lost; returns why."""
        conn = worker.conn
        assert conn is not None
        last_heard = time.monotonic()
        while not self._closed:
            try:
                if conn.poll(self.ping_interval_s):
                    msg = conn.recv()
                    last_heard = time.monotonic()
                    if msg.get("op") == "fatal":
                        return f"failed: {msg.get('error')}"
                    self._dispatch(msg)
                    continue
                silent = time.monotonic() - last_heard
                if silent > self.hang_timeout_s:
                    return f"stopped answering ({silent:.0f} s without a message)"
                worker.send({"op": "stats", "id": None})   # a ping; any message proves life
            except (EOFError, OSError):
                return self._why_gone(worker)
        return "closed"

    def _why_gone(self, worker: _Worker) -> str:
        """The connection ended: the worker died, or closed it and is about to exit."""
        try:
            code = worker.proc.wait(timeout=0 if self._closed else self.stop_grace_s)
        except subprocess.TimeoutExpired:
            return "closed its connection"
        return f"died (exit code {code})"

    def _lose(self, worker: _Worker, reason: str) -> None:
        """The worker is gone or useless: stop it and end every open stream with ``unavailable``."""
        with self._lock:
            self._ready = False
            requests, self._requests = list(self._requests.values()), {}
        logger.error("vLLM worker %d %s; failing %d open streams", worker.proc.pid, reason, len(requests))
        worker.stop(0.0 if worker.proc.poll() is None else self.stop_grace_s)   # a hung one gets SIGKILL at once
        self._fail_waiters()
        for request in requests:
            self._deliver(request.stream, Unavailable(f"the vLLM worker {reason}; it is restarting"))
        if self.on_worker_exit is not None:
            try:
                self.on_worker_exit(reason)
            except Exception:
                logger.exception("on_worker_exit failed")

    def _fail_waiters(self) -> None:
        with self._lock:
            waiters, self._waiters = list(self._waiters.values()), {}
        for waiter in waiters:
            waiter.event.set()   # value None: running() raises unavailable

    # -- messages from the worker
    def _dispatch(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "outputs":
            for out in msg["outputs"]:
                self._output(out)
        elif op == "error":
            with self._lock:
                request = self._requests.pop(msg["rid"], None)
            if request is not None:
                self._deliver(request.stream, FrameEvent(msg["rid"], None, True, "error", request.frames,
                                                         msg.get("error")))
        elif op == "stats" and msg.get("id") is not None:
            with self._lock:
                waiter = self._waiters.get(msg["id"])
            if waiter is not None:
                waiter.value = VLLMCounts(int(msg["running"]), int(msg["waiting"]))
                waiter.event.set()

    def _output(self, out: dict[str, Any]) -> None:
        """One request's new tokens of one step -> its frame events, in order."""
        rid = out["rid"]
        with self._lock:
            request = self._requests.get(rid)
        if request is None:
            return
        events: list[FrameEvent] = []
        ended = False
        for token in out["token_ids"]:
            if token in self.eos_token_ids:   # vLLM includes the stop token; eos is not a frame
                events.append(FrameEvent(rid, None, True, "stop", request.frames))
                ended = True
                break
            events.append(FrameEvent(rid, [token], False, None, request.frames))
            request.frames += 1
        if not ended and out["finished"]:
            reason = _FINISH.get(out.get("finish_reason") or "", out.get("finish_reason") or "error")
            last = events[-1] if events else None
            if last is not None and reason != "cancelled":   # the last frame carries the end, as on torch
                events[-1] = FrameEvent(rid, last.codes, True, reason, last.index)
            else:
                events.append(FrameEvent(rid, None, True, reason, request.frames))
            ended = True
        if ended:
            with self._lock:
                self._requests.pop(rid, None)
        for event in events:
            self._deliver(request.stream, event)

    @staticmethod
    def _deliver(stream: FrameStream, item: Any) -> None:
        try:
            stream._loop.call_soon_threadsafe(stream._push, item)
        except RuntimeError:  # the stream's loop is closed: nobody is listening
            pass
