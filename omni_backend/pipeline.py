"""Pipeline topology: which stages a model type has and how they connect.

Topology is code (this file); placement (devices, instances, batching) is the deploy YAML
(`omni_backend/deploy.py`). The names follow vLLM-Omni's `StagePipelineConfig` so its users
recognise them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ExecutionType = Literal["llm_ar", "llm_generation", "generator"]
OutputType = Literal["latent", "audio"]


@dataclass(frozen=True)
class StageConfig:
    stage_id: int
    model_stage: str                     # role key, e.g. "talker", "code2wav", "synthesizer"
    execution_type: ExecutionType
    engine_output_type: OutputType       # "latent" = codes for the next stage, "audio" = samples
    input_sources: tuple[int, ...] = ()  # upstream stage ids
    final_output: bool = False
    owns_tokenizer: bool = False
    decoupled: bool = True               # streams responses (AR stages, generators)
    stop_token_ids: tuple[int, ...] = ()
    # Import path of the Triton model class that hosts this stage.
    triton_class: str = ""


@dataclass(frozen=True)
class PipelineConfig:
    name: str                            # pipeline (= entry model) name
    model_type: str                      # adapter key
    stages: tuple[StageConfig, ...]
    default_deploy: str                  # deploy/<default_deploy>.yaml
    description: str = ""
    sample_rate: int = 24000
    entry_class: str = "omni_backend.triton.entry.PipelineEntry"
    # A checkpoint the pipeline can run without one from the user (embedded or built at load).
    default_model: str | None = None
    extras: dict = field(default_factory=dict, hash=False, compare=False)

    def stage_model_name(self, stage: StageConfig) -> str:
        """Triton model name of a stage: `<pipeline>__<model_stage>`."""
        return f"{self.name}__{stage.model_stage}"

    @property
    def final_stage(self) -> StageConfig:
        return next(s for s in self.stages if s.final_output)

    def validate(self) -> None:
        ids = [s.stage_id for s in self.stages]
        if ids != list(range(len(ids))):
            raise ValueError(f"pipeline {self.name}: stage ids must be 0..N-1, got {ids}")
        if sum(s.final_output for s in self.stages) != 1:
            raise ValueError(f"pipeline {self.name}: exactly one stage must be final_output")
        for s in self.stages:
            bad = [i for i in s.input_sources if i >= s.stage_id]
            if bad:
                raise ValueError(f"pipeline {self.name}: stage {s.stage_id} reads from later stages {bad}")


_REGISTRY: dict[str, PipelineConfig] = {}


def register(config: PipelineConfig) -> PipelineConfig:
    config.validate()
    if config.name in _REGISTRY:
        raise ValueError(f"pipeline {config.name!r} is already registered")
    _REGISTRY[config.name] = config
    return config


def get_pipeline(name: str) -> PipelineConfig:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown pipeline {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def pipelines() -> dict[str, PipelineConfig]:
    _load_builtin()
    return dict(_REGISTRY)


def _load_builtin() -> None:
    # Built-in pipelines register themselves on import; importing here keeps the registry lazy.
    from omni_backend import pipelines as _  # noqa: F401
