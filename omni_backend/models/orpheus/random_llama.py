"""Random-weight Llama checkpoints in the Hugging Face layout, for tests and benchmarks of plain
causal-LM stages (Orpheus-style), on either engine.

    write_random_llama(out_dir, vocab_size=512, hidden_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=32, intermediate_size=256, ...)

Writes ``config.json`` (``model_type`` llama, ``architectures`` LlamaForCausalLM),
``model.safetensors`` (the names transformers' ``LlamaForCausalLM`` saves; no ``lm_head.weight``
when the embeddings are tied) and ``generation_config.json``. transformers and vLLM both load it
unchanged; writing it needs only torch and safetensors.

Weights: each tensor is drawn from its own generator seeded from ``seed`` and its name, so a
checkpoint is reproducible and one tensor does not depend on the others' shapes. They are scaled
so that a random model stays sensitive to its context: linear weights ``randn / sqrt(fan_in)``,
norm gains ``1 + 0.1 randn``, embeddings ``0.1 randn``. Embeddings of ``randn`` would dominate the
residual stream: with tied embeddings greedy decoding then repeats the prompt's last token
forever, untied it soon settles into a short cycle; at 0.1 the layers' outputs decide and greedy
tokens vary with the prompt and the position.

vLLM's CPU attention takes head_dim 32, 64, 80, 96, 112, 128, ... only (not 16).
"""
from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from safetensors.torch import save_file

__all__ = ["write_random_llama", "llama_config"]

WeightsHook = Callable[[dict[str, torch.Tensor]], None]


def llama_config(*, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate_size: int, tie_word_embeddings: bool, rope_theta: float,
                 rope_scaling: Optional[dict[str, Any]], max_position_embeddings: int,
                 bos_token_id: int = 0, eos_token_id: int = 1) -> dict[str, Any]:
    """``config.json`` as transformers 4.x writes it for Llama (transformers 5 and vLLM read it too)."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) != "llama3":
        raise ValueError(f"rope_scaling must be None or a llama3 dict, got {rope_scaling!r}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": float(rope_theta),
        "rope_scaling": rope_scaling,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "tie_word_embeddings": tie_word_embeddings,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }


def _randn(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    # crc32 of the name, not hash(): Python salts str hashes per process
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def _weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    h, v, ffn = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    d, nh, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (nh * d, h),
            p + "self_attn.k_proj.weight": (nkv * d, h),
            p + "self_attn.v_proj.weight": (nkv * d, h),
            p + "self_attn.o_proj.weight": (h, nh * d),
            p + "mlp.gate_proj.weight": (ffn, h),
            p + "mlp.up_proj.weight": (ffn, h),
            p + "mlp.down_proj.weight": (h, ffn),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
    shapes["model.norm.weight"] = (h,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    weights = {}
    for name, shape in shapes.items():
        w = _randn(seed, name, shape)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * w
        elif name == "model.embed_tokens.weight":
            w = 0.1 * w
        else:
            w = w / math.sqrt(shape[1])
        weights[name] = w.contiguous()
    return weights


def write_random_llama(out_dir: str | Path, *, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                       num_kv_heads: int, head_dim: int, intermediate_size: int, tie_word_embeddings: bool = False,
                       rope_theta: float = 500000.0, rope_scaling: Optional[dict[str, Any]] = None,
                       max_position_embeddings: int = 2048, seed: int = 0,
                       weights_hook: Optional[WeightsHook] = None, bos_token_id: int = 0,
                       eos_token_id: int = 1) -> Path:
    """Write a random Llama checkpoint into ``out_dir`` (created); returns its path.

    ``weights_hook`` gets the tensors by name before they are saved and may edit them in place
    (e.g. rig a token to follow another); with tied embeddings there is no ``lm_head.weight``.
    ``bos_token_id`` / ``eos_token_id`` go into both config files (the engines here stop on the
    ids a stage gives them, not on these)."""
    config = llama_config(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                          num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                          intermediate_size=intermediate_size, tie_word_embeddings=tie_word_embeddings,
                          rope_theta=rope_theta, rope_scaling=rope_scaling,
                          max_position_embeddings=max_position_embeddings, bos_token_id=bos_token_id,
                          eos_token_id=eos_token_id)
    weights = _weights(config, seed)
    if weights_hook is not None:
        weights_hook(weights)
        weights = {name: w.contiguous() for name, w in weights.items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
        indent=2) + "\n")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
