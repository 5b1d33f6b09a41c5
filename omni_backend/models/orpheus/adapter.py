"""Request fields of Orpheus: a voice the checkpoint was finetuned on, and sampling."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omni_backend.adapters.base import Param, TTSAdapter

from .family import VOICES_OPTION
from .tokens import VOICES, voice_names

if TYPE_CHECKING:
    from omni_backend.deploy import DeployConfig

SAMPLING = (
    Param("seed", int, lo=0, hi=2**63 - 1, help="sampling seed; unset = random (the codec's noise: 0)"),
    Param("max_new_tokens", int, lo=7, hi=8192, help="token limit (7 tokens per 85 ms frame)"),
    Param("do_sample", bool),
    Param("temperature", float, lo=0.0, hi=5.0, help="0 = greedy"),
    Param("top_k", int, lo=0, hi=200000),
    Param("top_p", float, lo=1e-3, hi=1.0),
    Param("repetition_penalty", float, lo=1.0, hi=5.0),
    Param("ignore_eos", bool, help="generate up to max_new_tokens, eos never ends it (benchmarks)"),
)


def _params(voices: tuple[str, ...]) -> tuple[Param, ...]:
    if not voices:
        return SAMPLING
    return (Param("voice", str, default=voices[0], choices=voices, help="voice of the finetuned model"), *SAMPLING)


class OrpheusAdapter(TTSAdapter):
    """`voice` takes the deploy's voices (the lm stage's option `voices`; by default the released
    English finetune's); a checkpoint with none (the pretrained one) has no `voice` field."""
    params = _params(VOICES)

    def __init__(self, context: dict[str, Any] | None = None):
        super().__init__(context)
        if self.context.get("voices") is not None:
            self.params = _params(self.context["voices"])

    @classmethod
    def from_model(cls, model_path: str | None, deploy: "DeployConfig | None" = None) -> "OrpheusAdapter":
        if not model_path:
            raise ValueError("orpheus needs a checkpoint folder (--model PATH)")
        listed = deploy.stage(0).options.get(VOICES_OPTION.name) if deploy is not None else None
        try:
            voices = voice_names(VOICES_OPTION.default if listed is None else listed)
        except ValueError as e:   # only a deploy's own list can be wrong
            i = next(i for i, sd in enumerate(deploy.stages) if sd.stage_id == 0)
            raise ValueError(f"{deploy.source}: stages[{i}].options.voices: {e}") from None
        return cls({"model_path": model_path, "voices": voices})
