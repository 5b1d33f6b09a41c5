"""Request fields of the embedded hibari voice."""
from __future__ import annotations

from omni_backend.adapters.base import Param, TTSAdapter

# Only voices whose weights ship inside the wheel: the others download on first use, and a
# server must never fetch at run time.
OFFLINE_VOICES = ("heart",)


class HibariAdapter(TTSAdapter):
    params = (
        Param("voice", str, default="heart", choices=OFFLINE_VOICES, help="voice name"),
        Param("speed", float, default=1.0, lo=0.5, hi=2.0, help="speaking rate"),
        Param("seed", int, default=0, lo=0, hi=2**63 - 1, help="noise seed; same seed, same audio"),
    )
