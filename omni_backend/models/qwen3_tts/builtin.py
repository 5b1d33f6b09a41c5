"""`builtin:qwen3_tts_tiny_random` (CustomVoice) and `builtin:qwen3_tts_tiny_random_base` (Base,
voice cloning): tiny random-weight Qwen3-TTS checkpoints that run out of the box.

It speaks noise (random weights); it exists so the two-stage path (AR engine -> code2wav) can be
served and tested without a user checkpoint. The folder is written once, deterministically, in
the released layout, and shared by the entry, talker and code2wav processes: the first writer
wins under a file lock, the others reuse it.
"""
from __future__ import annotations

from omni_backend.builtin_checkpoints import builtin_name, cache_root, written_once

__all__ = ["BUILTIN", "cache_root", "resolve_checkpoint"]

BUILTIN = {
    # name: (size, model type, seed)
    "qwen3_tts_tiny_random": ("tiny", "custom_voice", 0),
    "qwen3_tts_tiny_random_base": ("tiny", "base", 0),
}
_VERSION = "v2"  # bump when the writer changes what it writes


def resolve_checkpoint(model: str) -> str:
    """A checkpoint folder for `model`: a path as given, or a built-in written on first use."""
    name = builtin_name(model, BUILTIN)
    if name is None:
        return model
    size, model_type, seed = BUILTIN[name]

    def write(folder) -> None:
        from .random_checkpoint import write_random_checkpoint

        write_random_checkpoint(str(folder), size, model_type, seed)
    return written_once(name, _VERSION, write)
