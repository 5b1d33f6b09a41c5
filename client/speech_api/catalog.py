"""What each served pipeline accepts: its request fields, voices and native speed control.

Pipelines are discovered from Triton (its repository index: an entry model carries the parameter
`pipeline` naming itself). What a pipeline accepts comes from its adapter's `param_specs()`, read
here under a guard that refuses `torch` (and `transformers`): the shim never loads a model, it
only reads field names, ranges and choices. A pipeline whose adapter is not importable here (a
remote Triton serving something this checkout does not know) is served in pass-through mode:
extension fields go to Triton unchecked and its own validation answers with the field name.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

log = logging.getLogger("omni.speech_api")

# OpenAI's model names; they all resolve to the default pipeline.
OPENAI_MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# OpenAI's stock voice names: a pipeline that does not know one speaks with its default voice,
# so clients with a hard-coded "alloy" (Open WebUI, SDK examples) still get audio.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage",
                 "shimmer", "verse", "marin", "cedar")
# Request field names a pipeline may use for the speaker, first match wins.
VOICE_PARAM_NAMES = ("voice", "speaker")
# Fields that only make sense for pipelines that clone a voice from reference audio.
CLONE_FIELDS = ("ref_audio", "ref_text", "x_vector_only_mode")
_HEAVY_MODULES = ("torch", "transformers", "torchaudio")


class _RefuseHeavyImports(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in _HEAVY_MODULES:
            raise ImportError(f"the speech shim does not import {name}")
        return None


@contextlib.contextmanager
def heavy_imports_refused() -> Iterator[None]:
    """Inside this block `import torch` fails instead of loading a deep-learning runtime."""
    guard = _RefuseHeavyImports()
    sys.meta_path.insert(0, guard)
    try:
        yield
    finally:
        sys.meta_path.remove(guard)


@dataclass(frozen=True)
class FieldSpec:
    """One request field a pipeline accepts; `check` is the adapter's own validator."""
    name: str
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PipelineInfo:
    name: str
    # None: unknown here (pass-through mode, Triton validates everything).
    fields: dict[str, FieldSpec] | None = None
    sample_rate: int | None = None
    description: str = ""

    @property
    def known(self) -> bool:
        return self.fields is not None

    @property
    def voice_field(self) -> FieldSpec | None:
        for name in VOICE_PARAM_NAMES:
            if self.fields and name in self.fields:
                return self.fields[name]
        return None

    @property
    def voices(self) -> list[str]:
        spec = self.voice_field
        return list(spec.choices) if spec and spec.choices else []

    @property
    def default_voice(self) -> str | None:
        """The voice the model uses when none is named (None: the model decides)."""
        spec = self.voice_field
        return str(spec.default) if spec is not None and spec.default else None

    @property
    def native_speed(self) -> tuple[float, float] | None:
        """(lo, hi) of the model's own speed control, or None when it has none."""
        spec = (self.fields or {}).get("speed")
        if spec is None:
            return None
        return (spec.lo if spec.lo is not None else 1.0, spec.hi if spec.hi is not None else 1.0)

    @property
    def clones_voices(self) -> bool:
        return bool(self.fields) and "ref_audio" in self.fields

    def accepts(self, name: str) -> bool:
        return self.fields is None or name in self.fields


def _qwen3_tts_speakers(model_path: str) -> tuple[str, ...]:
    """Preset speakers from the checkpoint's config.json (a built-in one only if already written)."""
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.config import load_config

    return tuple(load_config(resolve_checkpoint(model_path)).speakers)


# model type -> how to list its voices without loading it, for adapters whose choices depend on
# the checkpoint (their `from_model` needs more than the shim may import).
VOICE_LISTS: dict[str, Callable[[str], tuple[str, ...]]] = {"qwen3_tts": _qwen3_tts_speakers}


def _qwen3_tts_clones(model_path: str) -> bool:
    """Only Base checkpoints clone voices (the adapter's fields are those of every checkpoint)."""
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.config import load_config

    return load_config(resolve_checkpoint(model_path)).tts_model_type == "base"


# model type -> whether the served checkpoint clones voices, for adapters whose clone fields
# depend on the checkpoint; when it does not, the clone fields are dropped.
CLONE_CHECKS: dict[str, Callable[[str], bool]] = {"qwen3_tts": _qwen3_tts_clones}


def describe_pipeline(name: str, model_path: str | None = None) -> PipelineInfo:
    """Read a pipeline's request fields from its adapter, never importing torch."""
    try:
        with heavy_imports_refused():
            from omni_backend.adapters import adapter_class
            from omni_backend.pipeline import get_pipeline

            config = get_pipeline(name)
            cls = adapter_class(config.model_type)
            try:
                adapter = cls.from_model(model_path) if model_path else cls()
            except Exception as e:  # noqa: BLE001 - the checkpoint may live on the Triton host only
                log.info("pipeline %s: adapter metadata without the checkpoint (%s)", name, e)
                adapter = cls()
            specs = adapter.param_specs()
            voices: tuple[str, ...] | None = None
            lister = VOICE_LISTS.get(config.model_type)
            if lister and model_path:
                try:
                    voices = lister(model_path)
                except Exception as e:  # noqa: BLE001
                    log.info("pipeline %s: voices unknown to the shim (%s)", name, e)
            clones = None
            clone_check = CLONE_CHECKS.get(config.model_type)
            if clone_check and model_path:
                try:
                    clones = clone_check(model_path)
                except Exception as e:  # noqa: BLE001
                    log.info("pipeline %s: whether it clones voices is unknown to the shim (%s)", name, e)
    except Exception as e:  # noqa: BLE001 - unknown here: Triton validates instead
        log.warning("pipeline %s: request fields unknown to the shim (%s); passing them through", name, e)
        return PipelineInfo(name=name)
    fields = {n: FieldSpec(name=n, default=p.default, lo=p.lo, hi=p.hi,
                           choices=tuple(p.choices) if p.choices else None, check=p.check)
              for n, p in specs.items() if not (clones is False and n in CLONE_FIELDS)}
    for n in VOICE_PARAM_NAMES:
        if voices and n in fields and fields[n].choices is None:
            fields[n] = FieldSpec(name=n, default=fields[n].default, choices=voices, check=fields[n].check)
            break
    return PipelineInfo(name=name, fields=fields, sample_rate=config.sample_rate,
                        description=config.description)


def entry_pipeline_name(model_name: str, config: dict[str, Any]) -> str | None:
    """The pipeline an entry model serves, from its Triton config (None for stage models)."""
    params = config.get("parameters") or {}
    pipeline = (params.get("pipeline") or {}).get("string_value")
    outputs = {o.get("name") for o in config.get("output") or []}
    if pipeline == model_name and "AUDIO" in outputs:
        return pipeline
    return None


class Catalog:
    """Pipelines seen on any Triton endpoint, plus the OpenAI model aliases."""

    def __init__(self, default_pipeline: str = "hibari",
                 describe: Callable[[str, str | None], PipelineInfo] = describe_pipeline):
        self.default_pipeline = default_pipeline
        self._describe = describe
        self._pipelines: dict[str, PipelineInfo] = {}
        # Pipelines some endpoint serves, or served when it was last reachable (the pool keeps
        # this up to date); one that was unloaded everywhere drops out, so it answers 404.
        self.served: set[str] | None = None

    def _live(self, name: str) -> bool:
        return name in self._pipelines and (self.served is None or name in self.served)

    def learn(self, name: str, model_path: str | None) -> PipelineInfo:
        if name not in self._pipelines:
            self._pipelines[name] = self._describe(name, model_path)
        return self._pipelines[name]

    def pipelines(self) -> dict[str, PipelineInfo]:
        return {name: info for name, info in self._pipelines.items() if self._live(name)}

    def get(self, name: str) -> PipelineInfo | None:
        return self._pipelines.get(name)

    def resolve(self, model: str) -> str | None:
        """The pipeline a request's `model` names (a pipeline, or an OpenAI alias)."""
        if self._live(model):
            return model
        if model in OPENAI_MODEL_ALIASES and self._live(self.default_pipeline):
            return self.default_pipeline
        return None

    def model_names(self) -> list[str]:
        names = sorted(self.pipelines())
        if self._live(self.default_pipeline):
            names += list(OPENAI_MODEL_ALIASES)
        return names
