"""`builtin:voxcpm2_tiny_random`: a tiny random-weight VoxCPM2 that runs out of the box.

It speaks noise (random weights); it exists so the lm -> vae path can be served, tested and
benchmarked without a user checkpoint. Written once, deterministically, in the released layout
(:mod:`.random_checkpoint`), and shared by the entry and stage processes (the first writer wins
under a file lock).
"""
from __future__ import annotations

from omni_backend.builtin_checkpoints import builtin_name, written_once

__all__ = ["BUILTIN", "resolve_checkpoint"]

BUILTIN = {"voxcpm2_tiny_random": ("tiny", 0)}    # name: (shape, seed)
_VERSION = "v2"  # bump when the writer changes what it writes


def resolve_checkpoint(model: str) -> str:
    """A checkpoint folder for `model`: a path as given, or a built-in written on first use."""
    name = builtin_name(model, BUILTIN)
    if name is None:
        return model
    shape, seed = BUILTIN[name]

    def write(folder) -> None:
        from .random_checkpoint import write_random_checkpoint

        write_random_checkpoint(str(folder), shape, seed)
    return written_once(name, _VERSION, write)
