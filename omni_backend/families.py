"""The model families this project serves, and the pipelines they declare.

A family is a folder `omni_backend/models/<family>/` whose `family` module declares
`PIPELINES: tuple[PipelineConfig, ...]`. Adding a family is one line in BUILTIN_FAMILIES. A
family kept elsewhere (a test's, a user's) is loaded by its module path: the builder records that
path in the generated repository (config parameter `family`) so Triton's stubs load it too.

Nothing here imports a family until a pipeline is asked for.
"""
from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass

from omni_backend.deploy import DeployConfig, check_options, parse_deploy
from omni_backend.pipeline import PipelineConfig

BUILTIN_FAMILIES = (
    "omni_backend.models.hibari.family",
    "omni_backend.models.qwen3_tts.family",
    "omni_backend.models.orpheus.family",
    "omni_backend.models.qwen3_omni.family",
    "omni_backend.models.voxcpm2.family",
)

_PIPELINES: dict[str, PipelineConfig] = {}
_FAMILY_OF: dict[str, str] = {}     # pipeline name -> module that declared it
_LOADED: set[str] = set()


def load_family(module: str, root: str | None = None) -> list[PipelineConfig]:
    """Import a family module (from `root` too, when it lives outside the installed packages) and
    register its pipelines."""
    if module in _LOADED:
        return [p for n, p in _PIPELINES.items() if _FAMILY_OF[n] == module]
    if root and root not in sys.path:
        sys.path.insert(0, root)
    declared = tuple(getattr(importlib.import_module(module), "PIPELINES", ()))
    if not declared:
        raise ValueError(f"family module {module} declares no PIPELINES")
    for p in declared:
        p.validate()
        if p.name in _PIPELINES:
            raise ValueError(f"pipeline {p.name!r} is declared by {_FAMILY_OF[p.name]} and {module}")
    for p in declared:
        _PIPELINES[p.name] = p
        _FAMILY_OF[p.name] = module
    _LOADED.add(module)
    return list(declared)


def openai_default_pipeline() -> str | None:
    """The built-in pipeline declared the default behind OpenAI's model names (None: none is)."""
    names = sorted(n for n, p in pipelines().items() if p.openai_default)
    if len(names) > 1:
        raise ValueError(f"pipelines {names} all declare openai_default; one may")
    return names[0] if names else None


def _load_builtin() -> None:
    for module in BUILTIN_FAMILIES:
        load_family(module)


def get_pipeline(name: str) -> PipelineConfig:
    _load_builtin()
    try:
        return _PIPELINES[name]
    except KeyError:
        raise KeyError(f"unknown pipeline {name!r}; known: {', '.join(sorted(_PIPELINES))}") from None


def pipelines() -> dict[str, PipelineConfig]:
    _load_builtin()
    return dict(_PIPELINES)


def family_module(pipeline: str) -> str:
    """The module that declared a pipeline (what a built repository records)."""
    get_pipeline(pipeline)
    return _FAMILY_OF[pipeline]


def import_path(path: str) -> type:
    """`package.module.Name` -> the object (adapters, stage classes, transfer hooks)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class BuiltModel:
    """What a model of a built repository serves, read from its config.pbtxt parameters."""
    pipeline: PipelineConfig
    deploy: DeployConfig
    model_path: str | None        # the checkpoint (a folder or builtin:NAME)


def built_model(parameters: dict[str, str], model_name: str) -> BuiltModel:
    """From the parameters the builder wrote: `pipeline` (and `family` / `family_root` for a
    family outside BUILTIN_FAMILIES), `deploy` (checked again, options included), `model`."""
    if parameters.get("family") and parameters["family"] not in BUILTIN_FAMILIES:
        load_family(parameters["family"], parameters.get("family_root") or None)
    pipeline = get_pipeline(parameters["pipeline"])
    deploy = check_options(parse_deploy(json.loads(parameters["deploy"]), f"{model_name}/config.pbtxt"), pipeline)
    return BuiltModel(pipeline, deploy, parameters.get("model") or pipeline.default_model)
