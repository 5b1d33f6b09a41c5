"""A pipeline's stage graph, declared as data.

A model family declares each pipeline it serves: its stages, the tensors each stage takes and
gives, which stages feed which (`input_sources`), and for every fed stage the family's transfer
hook (`transfer`): how the sources' streams become this stage's requests (a chunk schedule, codec
context frames, hidden states handed on). The final stage's AUDIO is what the client hears; any
stage may also name `client_outputs` (text deltas) that reach the client as they arrive, and a
request may skip stages (its adapter's `skipped_stages`). The entry model runs the graph from this
declaration (omni_backend/triton/entry.py) and the builder derives every config.pbtxt from it
(ensemble_builder/build.py); neither knows any family.

Placement (devices, instances, batching) is the deploy YAML (`omni_backend/deploy.py`). The names
follow vLLM-Omni's `StagePipelineConfig` where one exists, so its users recognise them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

# "stream": a decoupled stage that streams responses for each request (AR engines, generators);
# it takes REQUEST (the adapter's JSON request) and/or tensors, REQUEST_ID and CONTROL.
# "batched": a stateless stage, one response per request, batched across streams by Triton's
# dynamic batcher (codec decoders over windows).
StageKind = Literal["stream", "batched"]
_NUMPY = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32,
          "INT8": np.int8, "BOOL": np.bool_, "STRING": np.object_}
DTYPES = tuple(_NUMPY)
# The entry model's own outputs (the final stage's audio), and a stage's error as data
# (omni_backend/triton/bls.py): no stage's client output may take these names.
ENTRY_OUTPUTS = ("AUDIO", "SAMPLE_RATE")
ERROR_OUTPUT_NAME = "ERROR"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of a stage: name, Triton dtype (without TYPE_), dims (-1 = any)."""
    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"tensor {self.name}: dtype {self.dtype!r}; one of {', '.join(DTYPES)}")

    @property
    def numpy_dtype(self) -> type:
        return _NUMPY[self.dtype]

    def empty(self, batched: bool = False) -> np.ndarray:
        """No data: every variable dimension 0 (a batched stage's liveness ping, and its answer)."""
        return np.zeros(((1,) if batched else ()) + tuple(0 if d < 0 else d for d in self.dims), self.numpy_dtype)


@dataclass(frozen=True)
class StageConfig:
    stage_id: int
    model_stage: str                      # the stage's role; its Triton name is <pipeline>__<model_stage>
    kind: StageKind
    triton_class: str                     # import path of the Triton model class hosting the stage
    outputs: tuple[TensorSpec, ...]
    # Tensors the stage takes besides REQUEST / REQUEST_ID / CONTROL (stream stages) or all of
    # its inputs (batched stages).
    inputs: tuple[TensorSpec, ...] = ()
    input_sources: tuple[int, ...] = ()   # upstream stage ids; () = fed the client's request
    # Import path of the family's transfer hook class (omni_backend/triton/transfer.py) that turns
    # the sources' streams into this stage's requests; required when input_sources is set.
    transfer: str = ""
    final_output: bool = False            # its AUDIO is what the client hears
    # Names of this stage's `outputs` that the entry forwards to the client as they arrive,
    # interleaved with the final stage's AUDIO in arrival order (e.g. an LM stage's text deltas).
    client_outputs: tuple[str, ...] = ()
    # The family's own deploy knobs for this stage (`stages[i].options` in the deploy YAML), as
    # omni_backend.adapters.base.Param: checked at build and load, defaults filled in.
    options: tuple = ()
    # The AR engines that can run this stage (`stages[i].engine` in the deploy YAML): "vllm" only
    # for a plain causal LM over one token vocabulary (omni_backend/engine/vllm_engine.py).
    engines: tuple[str, ...] = ("torch",)

    @property
    def takes_request(self) -> bool:
        """A stage fed by the client's request gets the adapter's JSON REQUEST."""
        return not self.input_sources

    @property
    def answers_client(self) -> bool:
        """The entry reads this stage's stream for the client: its AUDIO or its client outputs."""
        return self.final_output or bool(self.client_outputs)


@dataclass(frozen=True)
class PipelineConfig:
    name: str                             # pipeline (= entry model) name
    family: str                           # the model family (folder omni_backend/models/<family>)
    adapter: str                          # import path of the family's request adapter class
    stages: tuple[StageConfig, ...]
    default_deploy: str                   # deploy/<default_deploy>.yaml
    description: str = ""
    sample_rate: int = 24000
    entry_class: str = "omni_backend.triton.entry.PipelineEntry"
    # A checkpoint the pipeline can run without one from the user (embedded or built at load).
    default_model: str | None = None
    # The pipeline behind OpenAI's model names (tts-1, ...) in the speech API, unless it is told
    # another (--default-pipeline); one pipeline of the registry at most declares it.
    openai_default: bool = False

    def stage_model_name(self, stage: StageConfig) -> str:
        """Triton model name of a stage: `<pipeline>__<model_stage>`."""
        return f"{self.name}__{stage.model_stage}"

    @property
    def final_stage(self) -> StageConfig:
        return next(s for s in self.stages if s.final_output)

    def consumers(self, stage_id: int) -> list[StageConfig]:
        return [s for s in self.stages if stage_id in s.input_sources]

    def client_output_specs(self) -> tuple[TensorSpec, ...]:
        """The entry model's outputs besides AUDIO / SAMPLE_RATE: every stage's client outputs,
        once per name, in stage order. Raises ValueError naming a clash: a reserved name, or one
        name declared by two stages with different dtype or dims (the entry has one spec per name)."""
        where = f"pipeline {self.name}"
        specs: dict[str, tuple[TensorSpec, StageConfig]] = {}
        for s in self.stages:
            declared = {t.name: t for t in s.outputs}
            twice = sorted({n for n in s.client_outputs if s.client_outputs.count(n) > 1})
            if twice:
                raise ValueError(f"{where}: stage {s.stage_id} ({s.model_stage}) lists client "
                                 f"output {twice[0]!r} twice")
            for name in s.client_outputs:
                if name in ENTRY_OUTPUTS or name == ERROR_OUTPUT_NAME:
                    raise ValueError(f"{where}: stage {s.stage_id} ({s.model_stage}) client output {name!r} "
                                     f"clashes with a reserved name ({', '.join(ENTRY_OUTPUTS)}, "
                                     f"{ERROR_OUTPUT_NAME})")
                if name not in declared:
                    raise ValueError(f"{where}: stage {s.stage_id} ({s.model_stage}) client output {name!r} "
                                     f"is not one of its outputs ({', '.join(declared) or 'none'})")
                spec = declared[name]
                if name in specs:
                    other, by = specs[name]
                    if (other.dtype, other.dims) != (spec.dtype, spec.dims):
                        raise ValueError(f"{where}: client output {name!r} is {other.dtype} {list(other.dims)} "
                                         f"in stage {by.stage_id} ({by.model_stage}) but {spec.dtype} "
                                         f"{list(spec.dims)} in stage {s.stage_id} ({s.model_stage})")
                    continue
                specs[name] = (spec, s)
        return tuple(spec for spec, _ in specs.values())

    def stages_run(self, skipped: frozenset[int] = frozenset()) -> frozenset[int]:
        """The stage ids one request runs when its adapter skips `skipped`: a skipped stage's
        consumers are skipped too, and a stage that would feed nobody (no client output, every
        consumer skipped) does not run either. Raises ValueError when the request would leave the
        client nothing to read, or names a stage that does not exist."""
        unknown = sorted(set(skipped) - set(range(len(self.stages))))
        if unknown:
            raise ValueError(f"pipeline {self.name}: skipped stages {unknown} do not exist")
        out: set[int] = set()
        for s in self.stages:   # ids are a topological order: sources come first
            if s.stage_id in skipped or any(i in out for i in s.input_sources):
                out.add(s.stage_id)
        run: set[int] = set()
        for s in reversed(self.stages):   # consumers come first
            read = s.answers_client or any(c.stage_id in run for c in self.consumers(s.stage_id))
            if s.stage_id not in out and read:
                run.add(s.stage_id)
        if not any(self.stages[i].answers_client for i in run):
            raise ValueError(f"pipeline {self.name}: skipping stages {sorted(skipped)} leaves nothing for the client")
        return frozenset(run)

    def validate(self) -> None:
        where = f"pipeline {self.name}"
        ids = [s.stage_id for s in self.stages]
        if ids != list(range(len(ids))):
            raise ValueError(f"{where}: stage ids must be 0..N-1, got {ids}")
        if len({s.model_stage for s in self.stages}) != len(self.stages):
            raise ValueError(f"{where}: model_stage names must differ")
        if sum(s.final_output for s in self.stages) != 1:
            raise ValueError(f"{where}: exactly one stage must be final_output")
        final = self.final_stage
        if not any(t.name == "AUDIO" and t.dtype == "FP32" for t in final.outputs):
            raise ValueError(f"{where}: final stage {final.model_stage} must output AUDIO (FP32)")
        for s in self.stages:
            bad = [i for i in s.input_sources if not 0 <= i < s.stage_id]
            if bad:   # sources come earlier: the ids are a topological order, so no cycles
                raise ValueError(f"{where}: stage {s.stage_id} reads from stages {bad} (not earlier stages)")
            if s.input_sources and not s.transfer:
                raise ValueError(f"{where}: stage {s.stage_id} has input_sources but no transfer hook")
            if not s.input_sources and s.transfer:
                raise ValueError(f"{where}: stage {s.stage_id} has a transfer hook but no input_sources")
            if s.takes_request and s.kind != "stream":
                raise ValueError(f"{where}: stage {s.stage_id} takes the client's request, so it must be "
                                 "a stream stage")
            names = [t.name for t in s.inputs]
            reserved = {"REQUEST", "REQUEST_ID", "CONTROL"} & set(names) if s.kind == "stream" else set()
            if reserved or len(set(names)) != len(names):
                raise ValueError(f"{where}: stage {s.stage_id} inputs {names}: duplicate or reserved names")
        for s in self.stages:
            if s is not final and not self.consumers(s.stage_id) and not s.client_outputs:
                raise ValueError(f"{where}: stage {s.stage_id}'s output goes nowhere")
        self.client_output_specs()
