"""VoxCPM2 checkpoint files: the released layout (``model.safetensors`` beside ``audiovae.pth``)
and the other files the reference also loads (``audiovae.safetensors``, ``pytorch_model.bin``, a
PyTorch file with or without its ``{"state_dict": ...}`` wrapper) give the same weights; a folder
with neither file, or a file that holds no state dict, is a clear error."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from omni_backend.models.voxcpm2.model import load_audio_vae, load_model
from omni_backend.models.voxcpm2.random_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    return Path(write_random_checkpoint(str(tmp_path_factory.mktemp("voxcpm2") / "tiny"), "tiny", 0))


def _states(path: Path) -> tuple[dict, dict]:
    model, vae = load_model(str(path), dtype=torch.float32)
    return model.state_dict(), vae.state_dict()


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_writer_writes_the_released_layout(released):
    names = set(os.listdir(released))
    assert {"config.json", "model.safetensors", "audiovae.pth", "tokenizer.json"} <= names
    assert "audiovae.safetensors" not in names
    held = torch.load(released / "audiovae.pth", map_location="cpu", weights_only=True)
    assert set(held) == {"state_dict"}


def test_every_file_form_the_reference_loads_gives_the_same_weights(released, tmp_path):
    model, vae = _states(released)
    vae_state = torch.load(released / "audiovae.pth", weights_only=True)["state_dict"]

    other = tmp_path / "other"
    shutil.copytree(released, other)
    os.remove(other / "audiovae.pth")
    save_file(vae_state, str(other / "audiovae.safetensors"))
    lm_state = load_file(str(other / "model.safetensors"))
    os.remove(other / "model.safetensors")
    torch.save(lm_state, other / "pytorch_model.bin")          # no wrapper
    model2, vae2 = _states(other)
    assert _equal(model, model2) and _equal(vae, vae2)
    assert _equal(vae, load_audio_vae(str(other)).state_dict())


def test_missing_or_wrong_weight_files_are_named(released, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(released, broken)
    os.remove(broken / "audiovae.pth")
    with pytest.raises(FileNotFoundError, match="audiovae.safetensors or audiovae.pth"):
        load_audio_vae(str(broken))
    torch.save({"state_dict": [1, 2, 3]}, broken / "audiovae.pth")
    with pytest.raises(ValueError, match="audiovae.pth: expected a state dict"):
        load_audio_vae(str(broken))
    state = torch.load(released / "audiovae.pth", weights_only=True)["state_dict"]
    state.pop(sorted(state)[0])
    torch.save(state, broken / "audiovae.pth")
    with pytest.raises(ValueError, match="audiovae.pth: missing"):
        load_audio_vae(str(broken))
