"""Request fields of the toy family."""
from __future__ import annotations

from omni_backend.adapters.base import Param, TTSAdapter


class ToyAdapter(TTSAdapter):
    params = (
        Param("gain", float, default=1.0, lo=0.0, hi=4.0, help="scales the audio"),
        Param("voice", str, default="plain", choices=("plain", "bright"), help="toy voices"),
    )
