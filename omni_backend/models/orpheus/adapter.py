"""Request fields of Orpheus: a voice of the released finetuned model and sampling."""
from __future__ import annotations

from typing import Any

from omni_backend.adapters.base import Param, TTSAdapter

from .tokens import VOICES


class OrpheusAdapter(TTSAdapter):
    params = (
        Param("voice", str, default="tara", choices=VOICES, help="voice of the finetuned model"),
        Param("seed", int, lo=0, hi=2**63 - 1, help="sampling seed; unset = random (the codec's noise: 0)"),
        Param("max_new_tokens", int, lo=7, hi=8192, help="token limit (7 tokens per 85 ms frame)"),
        Param("do_sample", bool),
        Param("temperature", float, lo=1e-3, hi=5.0),
        Param("top_k", int, lo=0, hi=200000),
        Param("top_p", float, lo=1e-3, hi=1.0),
        Param("repetition_penalty", float, lo=1.0, hi=5.0),
    )

    @classmethod
    def from_model(cls, model_path: str | None) -> "OrpheusAdapter":
        if not model_path:
            raise ValueError("orpheus needs a checkpoint folder (--model PATH)")
        return cls({"model_path": model_path})
