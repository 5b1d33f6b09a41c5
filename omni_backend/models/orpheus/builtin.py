"""`builtin:orpheus_tiny_random`: a tiny random-weight Orpheus LM + SNAC that runs out of the box.

It speaks noise (random weights); it exists so the LM -> SNAC path (on vLLM or the torch engine)
can be served and tested without a user checkpoint. The folder (LM at its root, SNAC in
``snac_24khz/``) is written once, deterministically, and shared by every process that needs it:
the first writer wins under a file lock, the others reuse it.
"""
from __future__ import annotations

import os

from omni_backend.builtin_checkpoints import builtin_name, written_once

__all__ = ["BUILTIN", "SNAC_FOLDER", "resolve_checkpoint", "snac_folder"]

BUILTIN = {"orpheus_tiny_random": ("tiny", 0)}    # name: (shape, seed)
SNAC_FOLDER = "snac_24khz"
_VERSION = "v2"  # bump when a writer changes what it writes


def resolve_checkpoint(model: str) -> str:
    """A checkpoint folder for `model`: a path as given, or a built-in written on first use."""
    name = builtin_name(model, BUILTIN)
    if name is None:
        return model
    shape, seed = BUILTIN[name]

    def write(folder) -> None:
        from omni_backend.models.orpheus.random_checkpoint import write_random_orpheus
        from omni_backend.models.orpheus.random_snac import write_random_snac

        write_random_orpheus(folder, shape, seed)
        write_random_snac(folder / SNAC_FOLDER, seed=seed)
    return written_once(name, _VERSION, write)


def snac_folder(model_path: str, snac_path: str | None) -> str:
    """The SNAC checkpoint of a served model: the deploy's `snac_path`, else <model>/snac_24khz."""
    folder = snac_path or os.path.join(model_path, SNAC_FOLDER)
    if not os.path.exists(os.path.join(folder, "config.json")):
        raise ValueError(f"no SNAC 24 kHz checkpoint at {folder} (config.json + pytorch_model.bin); set the snac "
                         f"stage's options.snac_path in the deploy YAML")
    return folder
