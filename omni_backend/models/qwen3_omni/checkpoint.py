"""Load a Qwen3-Omni checkpoint folder (the released ``Qwen3-Omni-30B-A3B-Instruct`` layout) into
our modules: ``config.json``, ``model.safetensors`` or sharded ``model-*.safetensors`` with
``model.safetensors.index.json``, and the text tokenizer and chat template.

Each part is read strictly (a missing or unexpected tensor is an error naming it): ``thinker``
(``thinker.model.*`` + ``thinker.lm_head``), ``audio_tower`` (``thinker.audio_tower.*``, with the
processor's ``preprocessor_config.json``), ``visual`` (``thinker.visual.*``, with the image
processor's settings of the same file), ``talker.*`` and ``code2wav.*``. With a sharded checkpoint only the shards that hold a wanted tensor are opened.
code2wav is always Float32.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from omni_backend.models.qwen3_common.dtype import parse_dtype
from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer

from .audio_features import AudioFeatureExtractor
from .audio_tower import AudioTower
from .code2wav import Code2Wav
from .image_processor import ImageProcessor
from .vision_encoder import VisionEncoder
from .config import SPEECHLESS, Qwen3OmniConfig, load_config
from .moe import SparseMoeBlock
from .prompt import ChatTemplate, PromptBuilder
from .talker import Talker
from .thinker import Thinker

__all__ = ["Qwen3OmniCheckpoint", "load_checkpoint", "load_thinker_embedding", "ThinkerEmbedding", "PARTS"]

PARTS = ("thinker", "audio_tower", "visual", "talker", "code2wav")
# thinker tensors the thinker's text model does not hold (its encoders are parts of their own)
_SKIPPED_THINKER = ("thinker.audio_tower.", "thinker.visual.")


@dataclass
class Qwen3OmniCheckpoint:
    path: str
    config: Qwen3OmniConfig
    tokenizer: QwenTextTokenizer | None  # None: the folder has no tokenizer files (prompt ids only)
    chat_template: ChatTemplate
    features: AudioFeatureExtractor = AudioFeatureExtractor()
    image_processor: ImageProcessor = ImageProcessor()
    thinker: Thinker | None = None
    audio_tower: AudioTower | None = None
    visual: VisionEncoder | None = None
    talker: Talker | None = None
    code2wav: Code2Wav | None = None

    def prompt_builder(self) -> PromptBuilder:
        if self.tokenizer is None:
            raise FileNotFoundError(f"{self.path}: no tokenizer.json (or vocab.json + merges.txt)")
        return PromptBuilder(self.config, self.tokenizer, self.chat_template, self.features,
                             images=self.image_processor)


def _weight_map(checkpoint_dir: str) -> dict[str, str]:
    """Tensor name -> file holding it."""
    from safetensors import safe_open

    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as handle:
            mapping = json.load(handle)["weight_map"]
        return {name: os.path.join(checkpoint_dir, file) for name, file in mapping.items()}
    single = os.path.join(checkpoint_dir, "model.safetensors")
    if not os.path.isfile(single):
        raise FileNotFoundError(f"{checkpoint_dir}: no model.safetensors (or model.safetensors.index.json)")
    with safe_open(single, framework="pt") as handle:
        return {name: single for name in handle.keys()}


def _read(weights: dict[str, str], prefix: str, skip: Iterable[str] = ()) -> dict[str, torch.Tensor]:
    """Tensors named ``prefix*`` (not ``skip*``), with the prefix removed."""
    from safetensors import safe_open

    skip = tuple(skip)
    by_file: dict[str, list[str]] = {}
    for name, file in weights.items():
        if name.startswith(prefix) and not name.startswith(skip):
            by_file.setdefault(file, []).append(name)
    out: dict[str, torch.Tensor] = {}
    for file, names in sorted(by_file.items()):
        with safe_open(file, framework="pt") as handle:
            for name in names:
                out[name[len(prefix):]] = handle.get_tensor(name)
    return out


def _load_into(module: nn.Module, state: dict[str, torch.Tensor], prefix: str, checkpoint_dir: str,
               dtype: torch.dtype, device: torch.device | str) -> None:
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{checkpoint_dir}: {prefix}* weights do not match config.json; "
                         f"missing {[prefix + k for k in missing[:5]]}{'...' if len(missing) > 5 else ''} "
                         f"unexpected {[prefix + k for k in unexpected[:5]]}{'...' if len(unexpected) > 5 else ''}")
    for name, tensor in expected.items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{checkpoint_dir}: {prefix}{name} has shape {tuple(state[name].shape)}, "
                             f"config.json implies {tuple(tensor.shape)}")
    for name in list(state):  # one tensor at a time: no second full copy
        state[name] = state[name].to(device=device, dtype=dtype)
    module.load_state_dict(state, strict=True, assign=True)
    module.eval().requires_grad_(False)
    for sub in module.modules():
        if isinstance(sub, SparseMoeBlock):
            sub.fuse_experts()


def load_checkpoint(checkpoint_dir: str, dtype: torch.dtype | str = torch.float32,
                    device: torch.device | str = "cpu", parts: Iterable[str] = PARTS) -> Qwen3OmniCheckpoint:
    """Config, tokenizer, chat template and the weights of ``parts`` (any of ``PARTS``)."""
    dtype = parse_dtype(dtype)
    parts = tuple(parts)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"parts: unknown {unknown}; known: {', '.join(PARTS)}")
    config = load_config(checkpoint_dir)
    if config.talker is None and {"talker", "code2wav"} & set(parts):
        raise ValueError(f"{checkpoint_dir}: {SPEECHLESS}; it has no talker or code2wav")
    try:
        tokenizer: QwenTextTokenizer | None = QwenTextTokenizer(checkpoint_dir, dict(config.raw))
    except FileNotFoundError:
        tokenizer = None
    checkpoint = Qwen3OmniCheckpoint(checkpoint_dir, config, tokenizer, ChatTemplate.from_checkpoint(checkpoint_dir),
                                     AudioFeatureExtractor.from_checkpoint(checkpoint_dir),
                                     ImageProcessor.from_checkpoint(checkpoint_dir))
    weights = _weight_map(checkpoint_dir)
    if "thinker" in parts:
        with torch.device("meta"):
            thinker = Thinker(config.thinker)
        _load_into(thinker, _read(weights, "thinker.", _SKIPPED_THINKER), "thinker.", checkpoint_dir, dtype, device)
        checkpoint.thinker = thinker
    if "audio_tower" in parts and config.audio is not None:
        with torch.device("meta"):
            audio_tower = AudioTower(config.audio)
        _load_into(audio_tower, _read(weights, "thinker.audio_tower."), "thinker.audio_tower.", checkpoint_dir,
                   dtype, device)
        checkpoint.audio_tower = audio_tower
    if "visual" in parts and config.vision is not None:
        with torch.device("meta"):
            visual = VisionEncoder(config.vision)
        _load_into(visual, _read(weights, "thinker.visual."), "thinker.visual.", checkpoint_dir, dtype, device)
        checkpoint.visual = visual
    if "talker" in parts:
        with torch.device("meta"):
            talker = Talker(config.talker)
        _load_into(talker, _read(weights, "talker."), "talker.", checkpoint_dir, dtype, device)
        checkpoint.talker = talker
    if "code2wav" in parts:
        with torch.device("meta"):
            code2wav = Code2Wav(config.code2wav)
        state = _read(weights, "code2wav.")
        _load_into(code2wav, state, "code2wav.", checkpoint_dir, torch.float32, device)
        # a non-persistent buffer: made again on the device (meta tensors have no values)
        c = config.code2wav
        code2wav.code_offset = torch.arange(c.num_quantizers, device=device).view(1, -1, 1) * c.codebook_size
        checkpoint.code2wav = code2wav
    return checkpoint


class ThinkerEmbedding(nn.Module):
    """The thinker's token embedding table alone (``thinker.model.embed_tokens``): all the talker
    reads of the thinker for text, without the thinker's weights."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding.from_pretrained(weight, freeze=True)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


def load_thinker_embedding(checkpoint_dir: str, dtype: torch.dtype | str = torch.float32,
                           device: torch.device | str = "cpu") -> ThinkerEmbedding:
    config = load_config(checkpoint_dir)
    state = _read(_weight_map(checkpoint_dir), "thinker.model.embed_tokens.")
    weight = state.get("weight")
    expected = (config.thinker.vocab_size, config.thinker.hidden_size)
    if weight is None or tuple(weight.shape) != expected:
        raise ValueError(f"{checkpoint_dir}: thinker.model.embed_tokens.weight missing or not {expected}")
    return ThinkerEmbedding(weight.to(device=device, dtype=parse_dtype(dtype))).eval()
