"""What each served pipeline accepts: its request fields, voices and native speed control.

Pipelines are discovered from Triton (its repository index: an entry model carries the parameter
`pipeline` naming itself). What a pipeline accepts is in the entry's parameter `catalog`, written
by the builder from the served checkpoint's adapter (ensemble_builder/build.py): its parameters
(type, range, choices), voices, clone support, sample rate. The shim never imports model code. An
entry without a catalog (built by something else) is served in pass-through mode: extension
fields go to Triton unchecked and its own validation answers with the field name.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from omni_backend.adapters.base import Param
from omni_backend.families import openai_default_pipeline

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
CLONE_FIELDS = ("ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding")
# Parameter types `Param` checks; a catalog may also list others (a list of messages).
_SCALAR_TYPES = ("int", "float", "str", "bool")


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
    params: tuple[dict, ...] = ()      # the catalog's parameter documentation
    clones: bool | None = None         # the catalog's word on voice cloning (None: from the fields)
    # The catalog's `chat`: the pipeline answers a conversation (POST /v1/chat/completions)
    # instead of reading its input aloud (POST /v1/audio/speech).
    chat: bool = False
    # The catalog's `default_voice`, for a model whose voice parameter has no default of its own.
    catalog_default_voice: str | None = None
    # The catalog's `speaks`: false for a chat model whose checkpoint answers in text only.
    speaks: bool = True
    # The catalog's `stage_sampling`: per stage, what a client's per-stage sampling list sets
    # (client/speech_api/stage_sampling.py); empty: the pipeline takes no such list.
    stage_sampling: tuple[dict, ...] = ()

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
        if spec is not None and spec.default:
            return str(spec.default)
        return self.catalog_default_voice if spec is not None else None

    @property
    def native_speed(self) -> tuple[float, float] | None:
        """(lo, hi) of the model's own speed control, or None when it has none."""
        spec = (self.fields or {}).get("speed")
        if spec is None:
            return None
        return (spec.lo if spec.lo is not None else 1.0, spec.hi if spec.hi is not None else 1.0)

    @property
    def clones_voices(self) -> bool:
        has_fields = bool(self.fields) and "ref_audio" in self.fields
        return has_fields if self.clones is None else (self.clones and has_fields)

    def accepts(self, name: str) -> bool:
        return self.fields is None or name in self.fields


def describe_pipeline(name: str, catalog: str | None = None) -> PipelineInfo:
    """A pipeline's fields from its entry's `catalog` parameter (JSON)."""
    described = None
    try:
        described = json.loads(catalog) if catalog else None
        if not isinstance(described, dict):
            raise ValueError("no catalog")
        chat = described.get("chat") is True
        fields: dict[str, FieldSpec] = {}
        for d in described["params"]:
            if d.get("type") not in _SCALAR_TYPES:   # a structured value (a chat's messages): Triton checks it
                fields[d["name"]] = FieldSpec(name=d["name"], default=d.get("default"))
                continue
            p = Param.from_dict(d)
            fields[p.name] = FieldSpec(name=p.name, default=p.default, lo=p.lo, hi=p.hi, choices=p.choices,
                                       check=p.check)
        voices = tuple(described.get("voices") or ())
    except (ValueError, KeyError, TypeError) as e:   # unknown here: Triton validates instead
        log.warning("pipeline %s: request fields unknown to the shim (%s); passing them through", name, e)
        return PipelineInfo(name=name, chat=isinstance(described, dict) and described.get("chat") is True)
    for n in VOICE_PARAM_NAMES:
        if voices and n in fields and fields[n].choices is None:
            fields[n] = FieldSpec(name=n, default=fields[n].default, choices=voices, check=fields[n].check)
            break
    return PipelineInfo(name=name, fields=fields, sample_rate=described.get("sample_rate"),
                        description=described.get("description", ""), params=tuple(described["params"]),
                        clones=bool(described.get("clones_voices")), chat=chat,
                        catalog_default_voice=described.get("default_voice") or None,
                        speaks=described.get("speaks") is not False,
                        stage_sampling=tuple(d for d in described.get("stage_sampling") or () if isinstance(d, dict)))


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

    def __init__(self, default_pipeline: str | None = None,
                 describe: Callable[[str, str | None], PipelineInfo] = describe_pipeline,
                 model_names: dict[str, str] | None = None):
        """`default_pipeline`: behind OpenAI's model names; None: the one a family declares.
        `model_names`: other names of pipelines (--served-model-name), listed while it is served."""
        self.default_pipeline = default_pipeline or openai_default_pipeline()
        self.model_names_given = dict(model_names or {})
        self._describe = describe
        self._pipelines: dict[str, PipelineInfo] = {}
        # Pipelines some endpoint serves, or served when it was last reachable (the pool keeps
        # this up to date); one that was unloaded everywhere drops out, so it answers 404.
        self.served: set[str] | None = None

    def _live(self, name: str) -> bool:
        return name in self._pipelines and (self.served is None or name in self.served)

    def learn(self, name: str, catalog: str | None) -> PipelineInfo:
        if name not in self._pipelines:
            self._pipelines[name] = self._describe(name, catalog)
        return self._pipelines[name]

    def pipelines(self) -> dict[str, PipelineInfo]:
        return {name: info for name, info in self._pipelines.items() if self._live(name)}

    def get(self, name: str) -> PipelineInfo | None:
        return self._pipelines.get(name)

    def resolve(self, model: str) -> str | None:
        """The pipeline a request's `model` names (a pipeline, a served model name, or an OpenAI
        alias)."""
        if self._live(model):
            return model
        named = self.model_names_given.get(model)
        if named is not None:
            return named if self._live(named) else None
        if model in OPENAI_MODEL_ALIASES and self._live(self.default_pipeline):
            return self.default_pipeline
        return None

    def default_model(self) -> str | None:
        """What a request without `model` means (vLLM-Omni's clients may send none): the
        pipeline behind OpenAI's model names while it is served, else the only pipeline served."""
        if self._live(self.default_pipeline):
            return self.default_pipeline
        live = sorted(self.pipelines())
        return live[0] if len(live) == 1 else None

    def model_names(self) -> list[str]:
        names = sorted(self.pipelines())
        names += sorted(n for n, p in self.model_names_given.items() if self._live(p) and n not in names)
        if self._live(self.default_pipeline):
            names += [n for n in OPENAI_MODEL_ALIASES if n not in self.model_names_given]
        return names


def parse_model_names(specs: list[str]) -> dict[str, str]:
    """`--served-model-name NAME=PIPELINE` values -> {name: pipeline}; ValueError names the bad one."""
    names: dict[str, str] = {}
    for spec in specs:
        name, sep, pipeline = spec.rpartition("=")
        name, pipeline = name.strip(), pipeline.strip()
        if not sep or not name or not pipeline:
            raise ValueError(f"--served-model-name {spec!r}: expected NAME=PIPELINE")
        if names.get(name, pipeline) != pipeline:
            raise ValueError(f"--served-model-name: {name!r} names both {names[name]!r} and {pipeline!r}")
        names[name] = pipeline
    return names
