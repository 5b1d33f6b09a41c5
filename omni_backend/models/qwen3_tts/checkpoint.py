"""Load a Qwen3-TTS checkpoint folder (the released Hugging Face layout) into our modules.

``model.safetensors`` (or sharded ``model-*.safetensors`` with an index) holds ``talker.*`` and,
for base checkpoints, ``speaker_encoder.*``. The ``talker.*`` tensors load strictly into
:class:`Talker` (missing or unexpected keys are errors); ``speaker_encoder.*`` is loaded by
:class:`~omni_backend.models.qwen3_tts.speaker_encoder.SpeakerEncoder` (voice cloning).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from omni_backend.models.qwen3_common.dtype import parse_dtype
from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer

from .config import GenerationDefaults, Qwen3TTSConfig, load_config, load_generation_defaults
from .prompt import PromptBuilder
from .talker import Talker

__all__ = ["Qwen3TTSCheckpoint", "load_checkpoint", "read_state_dict"]


@dataclass
class Qwen3TTSCheckpoint:
    path: str
    config: Qwen3TTSConfig
    generation: GenerationDefaults
    talker: Talker
    tokenizer: QwenTextTokenizer

    @property
    def dtype(self) -> torch.dtype:
        return self.talker.codec_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.talker.codec_head.weight.device

    def prompt_builder(self) -> PromptBuilder:
        return PromptBuilder(self.config, self.tokenizer)


def _weight_files(checkpoint_dir: str) -> list[str]:
    single = os.path.join(checkpoint_dir, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
        return [os.path.join(checkpoint_dir, f) for f in files]
    raise FileNotFoundError(f"{checkpoint_dir}: no model.safetensors (or model.safetensors.index.json)")


def read_state_dict(checkpoint_dir: str, prefix: str) -> dict[str, torch.Tensor]:
    """Tensors whose name starts with ``prefix``, with the prefix removed."""
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(checkpoint_dir):
        with safe_open(path, framework="pt") as handle:
            for name in handle.keys():
                if name.startswith(prefix):
                    tensors[name[len(prefix):]] = handle.get_tensor(name)
    return tensors


TEXT_TABLE = "model.text_embedding.weight"


def load_checkpoint(checkpoint_dir: str, dtype: torch.dtype | str = torch.float32,
                    device: torch.device | str = "cpu") -> Qwen3TTSCheckpoint:
    """Read config, generation defaults, text tokenizer and talker weights (strict)."""
    dtype = parse_dtype(dtype)
    config = load_config(checkpoint_dir)
    generation = load_generation_defaults(checkpoint_dir)
    tokenizer = QwenTextTokenizer(checkpoint_dir, dict(config.raw))
    with torch.device("meta"):
        talker = Talker(config.talker)
    state = read_state_dict(checkpoint_dir, "talker.")
    expected = set(talker.state_dict().keys())
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{checkpoint_dir}: talker weights do not match config.json; "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''} "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    for name, tensor in talker.state_dict().items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{checkpoint_dir}: talker.{name} has shape {tuple(state[name].shape)}, "
                             f"config.json implies {tuple(tensor.shape)}")
    # The text table (151k rows, a third of the 0.6B talker) is only read at prefill, a few hundred
    # rows per request: on an accelerator it stays in host memory.
    host = {TEXT_TABLE} if torch.device(device).type != "cpu" else set()
    for name in list(state):  # convert one tensor at a time (no second full copy)
        state[name] = state[name].to(device="cpu" if name in host else device, dtype=dtype)
    talker.load_state_dict(state, strict=True, assign=True)
    talker.eval().requires_grad_(False)
    return Qwen3TTSCheckpoint(checkpoint_dir, config, generation, talker, tokenizer)
