"""`builtin:qwen3_omni_tiny_random`: a tiny random-weight Qwen3-Omni checkpoint that runs out of the box.

It writes and speaks nonsense (random weights); it exists so the three-stage path (thinker ->
talker -> code2wav) can be served and tested without a user checkpoint. Its thinker is rigged to
end its answer with ``<|im_end|>`` as answer token 48 and its talker to end after 64 frames (5 s),
so every request ends by itself. Written once, deterministically, in the released layout, and
shared by the entry and stage processes (the first writer wins under a file lock).
"""
from __future__ import annotations

from omni_backend.builtin_checkpoints import builtin_name, written_once

__all__ = ["BUILTIN", "resolve_checkpoint"]

BUILTIN = {
    # name: (shape, seed, thinker_eos_after, talker_eos_after)
    "qwen3_omni_tiny_random": ("tiny", 0, 48, 64),
}
_VERSION = "v2"  # bump when the writer changes what it writes


def resolve_checkpoint(model: str) -> str:
    """A checkpoint folder for `model`: a path as given, or a built-in written on first use."""
    name = builtin_name(model, BUILTIN)
    if name is None:
        return model
    shape, seed, thinker_eos_after, talker_eos_after = BUILTIN[name]

    def write(folder) -> None:
        from .random_checkpoint import write_random_checkpoint

        write_random_checkpoint(str(folder), shape, seed, thinker_eos_after, talker_eos_after)
    return written_once(name, _VERSION, write)
