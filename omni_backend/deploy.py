"""Deploy settings: where and how a pipeline's stages run (the YAML half of the pipeline).

Strict by design: an unknown key or a bad value is an error that names the file and the key
path (`deploy/qwen3_tts.yaml: stages[0].max_num_seqs: must be an integer >= 1, got 0`), so a
typo never silently falls back to a default.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from omni_backend.chunking import CodecChunkSchedule
from omni_backend.errors import InvalidRequest
from omni_backend.pipeline import PipelineConfig

DEPLOY_DIR = Path(__file__).resolve().parent.parent / "deploy"

ENGINES = ("torch", "vllm")
PROCESSES = ("own", "entry")
# Keys only one engine reads: given for a stage on the other engine they are errors, not ignored.
ENGINE_ONLY_KEYS = {"torch": ("max_prefills_per_step", "batch_invariant"),
                    "vllm": ("block_size", "gpu_memory_utilization")}
DTYPES = ("float32", "bfloat16", "float16")
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "repetition_penalty", "do_sample",
                 "max_new_tokens", "min_new_tokens")


# The 2.51 Python backend gives each model instance one pool of threads (its `thread-pool-size`,
# 32 by default) for two jobs: the BLS calls its stub makes, each held until the call's first
# answer, and the responses its stub sends. An entry with more BLS calls in flight than the pool
# has threads (a stage that stopped answering, its streams' pulls all waiting) leaves none to send
# its responses: its streams, and the supervisor's `abort`, could not end. tritonserver gets this
# many (omni_backend/supervisor/server_binary.py) and an entry's BLS threads stay below it.
PYTHON_BACKEND_THREADS = 96
RESPONSE_THREADS = 16
MAX_BLS_THREADS = PYTHON_BACKEND_THREADS - RESPONSE_THREADS


class DeployError(ValueError):
    """A deploy YAML problem; the message starts with `<file>: <key>:`."""


@dataclass
class AsyncChunk:
    enabled: bool = True
    initial_chunk_frames: int = 2
    chunk_frames: int = 25
    left_context_frames: int = 72
    # chunks after the first grow so that each is made while the audio before it plays, for an
    # engine up to this real-time factor; 0: fixed chunks (omni_backend/chunking.py)
    continuity_rtf: float = 0.75

    def chunk_schedule(self, initial_chunk_frames: int | None = None, chunk_frames: int | None = None,
                       left_context_frames: int | None = None) -> CodecChunkSchedule:
        """This schedule, with a request's own values where it gives them; a request's
        ``initial_chunk_frames`` 0 (vLLM-Omni's "no initial phase") makes the first chunk a regular one."""
        chunk = self.chunk_frames if chunk_frames is None else chunk_frames
        if initial_chunk_frames == 0:
            initial_chunk_frames = chunk
        return CodecChunkSchedule(
            self.initial_chunk_frames if initial_chunk_frames is None else initial_chunk_frames,
            chunk,
            self.left_context_frames if left_context_frames is None else left_context_frames,
            self.continuity_rtf)


@dataclass
class EntryDeploy:
    instances: int = 1
    max_streams: int = 64          # concurrent streams before `unavailable:` (HTTP 429)
    bls_threads: int = 64          # threads pulling upstream BLS streams


@dataclass
class StageDeploy:
    stage_id: int = 0
    engine: str = "torch"
    device: str = "cpu"
    dtype: str = "float32"
    instances: int = 1
    threads: int = 1               # torch / onnxruntime intra-op threads per instance
    max_num_seqs: int = 8
    max_model_len: int = 4096
    max_prefills_per_step: int = 8  # requests admitted per engine step (a burst's first audio vs running streams' pace)
    enforce_eager: bool = False
    # batched rows bit-identical to solo rows (exact per-row matmuls): default on CPU, off on GPU
    batch_invariant: bool | None = None
    cuda_graph_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    max_batch_size: int = 8        # Triton dynamic batching for stateless stages
    max_queue_delay_us: int = 2000
    # where a stream stage runs: `own` (its own Triton model and process) or `entry` (inside the
    # entry model's process, one process hop less on every chunk's path: omni_backend/triton/local_stage.py)
    process: str = "own"
    # vLLM only: tokens per KV-cache block (a multiple of 32 on CPU, whose attention needs it; of
    # 16 on GPU), and the share of the GPU's memory vLLM takes for weights and KV cache (GPU only)
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    # The family's own knobs for this stage (StageConfig.options declares them; check_options)
    options: dict[str, Any] = field(default_factory=dict)

    def resolve(self) -> "StageDeploy":
        """Settle the defaults that depend on the device and engine: batch_invariant is on for
        CPU (torch); vLLM's block size is 128 on CPU (its CPU default), 16 on GPU."""
        if self.engine == "torch" and self.batch_invariant is None:
            self.batch_invariant = self.device == "cpu"
        if self.engine == "vllm":
            if self.block_size is None:
                self.block_size = 128 if self.device == "cpu" else 16
            if self.gpu_memory_utilization is None and self.device != "cpu":
                self.gpu_memory_utilization = 0.9
        return self

    def to_dict(self) -> dict:
        """The keys this stage's engine reads (what the builder writes; parse_deploy reads it back)."""
        d = asdict(self)
        for engine, keys in ENGINE_ONLY_KEYS.items():
            for k in keys:
                if engine != self.engine or d[k] is None:
                    d.pop(k)
        return d


@dataclass
class DeployConfig:
    pipeline: str
    model: str | None = None
    entry: EntryDeploy = field(default_factory=EntryDeploy)
    async_chunk: AsyncChunk = field(default_factory=AsyncChunk)
    stages: list[StageDeploy] = field(default_factory=list)
    source: str = "<defaults>"

    def stage(self, stage_id: int) -> StageDeploy:
        for s in self.stages:
            if s.stage_id == stage_id:
                return s
        return StageDeploy(stage_id=stage_id).resolve()

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("source")
        d["stages"] = [s.to_dict() for s in self.stages]
        return d


def _fail(src: str, key: str, msg: str) -> DeployError:
    return DeployError(f"{src}: {key}: {msg}")


def _int(src: str, key: str, v: Any, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _fail(src, key, f"must be an integer >= {lo}, got {v!r}")
    return v


def _bool(src: str, key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _fail(src, key, f"must be true or false, got {v!r}")
    return v


def _choice(src: str, key: str, v: Any, choices: tuple[str, ...]) -> str:
    if v not in choices:
        raise _fail(src, key, f"must be one of {', '.join(choices)}, got {v!r}")
    return v


def _mapping(src: str, key: str, v: Any) -> dict:
    if not isinstance(v, dict):
        raise _fail(src, key, f"must be a mapping, got {type(v).__name__}")
    return v


def _check_keys(src: str, prefix: str, raw: dict, cls: type) -> None:
    known = {f.name for f in fields(cls)} - {"source"}
    for k in raw:
        if k not in known:
            raise _fail(src, f"{prefix}{k}", f"unknown key; allowed: {', '.join(sorted(known))}")


def _device(src: str, key: str, v: Any) -> str:
    if not isinstance(v, str) or not (v == "cpu" or v == "cuda" or
                                      (v.startswith("cuda:") and v[5:].isdigit())):
        raise _fail(src, key, f"must be cpu, cuda or cuda:N, got {v!r}")
    return v


def _sampling(src: str, key: str, v: Any) -> dict:
    v = _mapping(src, key, v)
    for k, x in v.items():
        if k not in SAMPLING_KEYS:
            raise _fail(src, f"{key}.{k}", f"unknown key; allowed: {', '.join(SAMPLING_KEYS)}")
        if k == "do_sample":
            _bool(src, f"{key}.{k}", x)
        elif k in ("top_k", "max_new_tokens", "min_new_tokens"):
            _int(src, f"{key}.{k}", x, 0)
        elif isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0:
            raise _fail(src, f"{key}.{k}", f"must be a number >= 0, got {x!r}")
    return dict(v)


def _stage(src: str, prefix: str, raw: Any) -> StageDeploy:
    raw = _mapping(src, prefix.rstrip("."), raw)
    _check_keys(src, prefix, raw, StageDeploy)
    s = StageDeploy()
    for k, v in raw.items():
        key = prefix + k
        if k in ("stage_id", "max_queue_delay_us"):
            setattr(s, k, _int(src, key, v, 0))
        elif k in ("instances", "threads", "max_num_seqs", "max_model_len", "max_batch_size", "max_prefills_per_step"):
            setattr(s, k, _int(src, key, v, 1))
        elif k == "engine":
            s.engine = _choice(src, key, v, ENGINES)
        elif k == "process":
            s.process = _choice(src, key, v, PROCESSES)
        elif k == "dtype":
            s.dtype = _choice(src, key, v, DTYPES)
        elif k == "device":
            s.device = _device(src, key, v)
        elif k in ("enforce_eager", "batch_invariant"):
            setattr(s, k, _bool(src, key, v))
        elif k == "options":
            s.options = dict(_mapping(src, key, v))
        elif k == "cuda_graph_sizes":
            if not isinstance(v, list) or not v:
                raise _fail(src, key, f"must be a non-empty list of integers, got {v!r}")
            s.cuda_graph_sizes = sorted({_int(src, f"{key}[{i}]", x, 1) for i, x in enumerate(v)})
        elif k == "block_size":
            s.block_size = _int(src, key, v, 1)
        elif k == "gpu_memory_utilization":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise _fail(src, key, f"must be a number in (0, 1], got {v!r}")
            s.gpu_memory_utilization = float(v)
        else:
            setattr(s, k, _sampling(src, key, v))
    # Checks across keys, once the engine and device are known whatever the keys' order.
    for engine, keys in ENGINE_ONLY_KEYS.items():
        for k in keys:
            if k in raw and engine != s.engine:
                raise _fail(src, prefix + k, f"applies to engine: {engine} only; this stage runs engine: {s.engine}")
    if s.block_size is not None and s.block_size % (32 if s.device == "cpu" else 16):
        raise _fail(src, prefix + "block_size",
                    f"must be a multiple of {32 if s.device == 'cpu' else 16} on {s.device}, got {s.block_size}")
    if "gpu_memory_utilization" in raw and s.device == "cpu":
        raise _fail(src, prefix + "gpu_memory_utilization", "applies to a GPU device only; this stage runs on cpu")
    s.resolve()   # so the built repository states it
    return s


def parse_deploy(raw: Any, source: str = "<dict>") -> DeployConfig:
    """Validate a parsed YAML mapping into a DeployConfig."""
    raw = _mapping(source, "<top>", raw if raw is not None else {})
    _check_keys(source, "", raw, DeployConfig)
    if "pipeline" not in raw or not isinstance(raw["pipeline"], str):
        raise _fail(source, "pipeline", "required: the pipeline name")
    cfg = DeployConfig(pipeline=raw["pipeline"], source=source)
    if "model" in raw:
        if raw["model"] is not None and not isinstance(raw["model"], str):
            raise _fail(source, "model", f"must be a path string, got {raw['model']!r}")
        cfg.model = raw["model"]
    if "entry" in raw:
        e = _mapping(source, "entry", raw["entry"])
        _check_keys(source, "entry.", e, EntryDeploy)
        for k, v in e.items():
            setattr(cfg.entry, k, _int(source, f"entry.{k}", v, 1))
        if cfg.entry.bls_threads > MAX_BLS_THREADS:
            raise _fail(source, "entry.bls_threads",
                        f"must be at most {MAX_BLS_THREADS} (the Python backend's {PYTHON_BACKEND_THREADS} threads "
                        f"per model instance, less {RESPONSE_THREADS} kept for sending responses), "
                        f"got {cfg.entry.bls_threads}")
    if "async_chunk" in raw:
        a = _mapping(source, "async_chunk", raw["async_chunk"])
        _check_keys(source, "async_chunk.", a, AsyncChunk)
        for k, v in a.items():
            if k == "enabled":
                cfg.async_chunk.enabled = _bool(source, "async_chunk.enabled", v)
            elif k == "continuity_rtf":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                    raise _fail(source, "async_chunk.continuity_rtf", f"must be a number in [0, 1] (0: fixed "
                                                                      f"chunks), got {v!r}")
                cfg.async_chunk.continuity_rtf = float(v)
            else:
                setattr(cfg.async_chunk, k, _int(source, f"async_chunk.{k}", v,
                                                 0 if k == "left_context_frames" else 1))
    if "stages" in raw:
        if not isinstance(raw["stages"], list):
            raise _fail(source, "stages", "must be a list of stage mappings")
        cfg.stages = [_stage(source, f"stages[{i}].", s) for i, s in enumerate(raw["stages"])]
        ids = [s.stage_id for s in cfg.stages]
        if len(set(ids)) != len(ids):
            raise _fail(source, "stages", f"duplicate stage_id in {ids}")
    return cfg


def check_options(cfg: DeployConfig, pipeline: PipelineConfig) -> DeployConfig:
    """Each listed stage's `options` against the knobs its family declares (StageConfig.options,
    a tuple of omni_backend.adapters.base.Param): unknown keys and bad values are errors naming
    the key; missing ones take the declared default. A stage the pipeline lacks is an error, and
    so is an engine the stage does not list (StageConfig.engines): never silently run on another."""
    stages = {s.stage_id: s for s in pipeline.stages}
    for i, sd in enumerate(cfg.stages):
        stage = stages.get(sd.stage_id)
        if stage is None:
            raise _fail(cfg.source, f"stages[{i}].stage_id", f"pipeline {pipeline.name} has no stage {sd.stage_id}")
        if sd.engine not in stage.engines:
            raise _fail(cfg.source, f"stages[{i}].engine",
                        f"{stage.model_stage} runs on engine {', '.join(stage.engines)} only, got {sd.engine}")
        if sd.process == "entry":
            _check_in_entry(cfg, i, stage)
        declared = {p.name: p for p in stage.options}
        for key in sd.options:
            if key not in declared:
                allowed = ", ".join(sorted(declared)) or "none"
                raise _fail(cfg.source, f"stages[{i}].options.{key}",
                            f"unknown option of {stage.model_stage}; allowed: {allowed}")
        try:
            sd.options = {name: p.check(sd.options.get(name)) for name, p in declared.items()}
        except InvalidRequest as e:
            raise _fail(cfg.source, f"stages[{i}].options.{e.field}", e.reason) from None
    return cfg


def _check_in_entry(cfg: DeployConfig, i: int, stage: Any) -> None:
    """`process: entry` is for a stream stage (fed by the client's request, or by the stages before
    it through the entry), on the torch engine, in a pipeline served by one entry instance (each
    instance would load the stage's engine)."""
    key = f"stages[{i}].process"
    sd = cfg.stages[i]
    if stage.kind != "stream":
        raise _fail(cfg.source, key, f"entry runs only a stream stage; {stage.model_stage} is a batched one "
                                     "(called per window, batched across streams in its own process)")
    if sd.engine != "torch":
        raise _fail(cfg.source, key, f"entry runs only a stage on engine: torch; this stage runs engine: {sd.engine}")
    if sd.instances != 1:
        raise _fail(cfg.source, key, f"entry needs instances: 1 (the entry's process holds the stage), got {sd.instances}")
    if cfg.entry.instances != 1:
        raise _fail(cfg.source, key, f"entry needs entry.instances: 1 (each entry instance would load the stage), "
                                     f"got {cfg.entry.instances}")


def load_deploy(path: str | Path) -> DeployConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise DeployError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise DeployError(f"{path}: <yaml>: {e}") from None
    return parse_deploy(raw, str(path))


def default_deploy_path(name: str) -> Path:
    return DEPLOY_DIR / f"{name}.yaml"
