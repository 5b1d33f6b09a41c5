"""Random-weight VoxCPM2 checkpoints in the released folder layout, for tests, benchmarks and the
built-in ``voxcpm2_tiny_random`` pipeline.

    python -m omni_backend.models.voxcpm2.random_checkpoint --out DIR [--shape tiny] [--seed N]

Writes what ``openbmb/VoxCPM2`` ships, shrunk: ``config.json`` (``voxcpm`` 2.0.3's ``VoxCPMConfig``
fields: ``lm_config``, ``encoder_config``, ``dit_config`` with ``cfm_config``,
``audio_vae_config``, patch size, residual layers, scalar quantizer), ``model.safetensors`` (the
backbone ``base_lm``, ``residual_lm``, the local encoder ``feat_encoder``, the diffusion transformer
``feat_decoder.estimator``, ``fsq_layer``, the projections and the stop head),
``audiovae.pth`` (the AudioVAE's ``{"state_dict": ...}``, weight-normed convolutions as
``weight_g`` / ``weight_v``) and a Llama-style byte-fallback BPE tokenizer (``tokenizer.json``) of this project's
own, with multi-character Chinese tokens so that the reference's per-character split matters.
Our loader takes every shape with no missing or unexpected key, and the reference's
``VoxCPM2Model.from_local`` (which loads leniently) computes from the same weights what ours does
(tests/unit/test_voxcpm2_checkpoint.py, test_voxcpm2_parity.py).

Shapes (:data:`SHAPES`) differ in backbone and residual depth, widths, heads, patch size, latent
width and the VAE's rates. The dtype is ``float32`` (the released one is ``bfloat16``) so that the
reference's CPU run is the float32 computation parity tests compare against.

Weights: each tensor from its own generator seeded from ``seed`` and its name: linear weights
``randn / sqrt(fan_in)``, biases ``0.01 randn``, embeddings ``randn``, norm gains ``1 + 0.1 randn``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import zlib
from dataclasses import dataclass

import torch

__all__ = ["SHAPES", "Shape", "checkpoint_config", "released_scale_config", "tensor_specs", "write_random_checkpoint", "main"]

AUDIO_START, AUDIO_END, REF_AUDIO_START, REF_AUDIO_END = 101, 102, 103, 104


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    layers: int
    residual_layers: int
    enc_hidden: int
    enc_heads: int
    enc_layers: int
    dit_hidden: int
    dit_heads: int
    dit_layers: int
    patch_size: int
    feat_dim: int
    fsq_dim: int
    vae_encoder_dim: int
    vae_encoder_rates: tuple[int, ...]
    vae_decoder_dim: int
    vae_decoder_rates: tuple[int, ...]
    vae_sample_rate: int
    residual_no_rope: bool = False


# the local stacks' head counts are multiples of the backbone's kv heads (they inherit them); head
# dims are equal across the backbone and the local stacks: they share the backbone's LongRoPE
# factors, whose length is head_dim / 2 (as in the released checkpoint)
SHAPES: dict[str, Shape] = {
    "tiny": Shape(hidden=64, heads=4, kv_heads=2, ffn=128, layers=2, residual_layers=1,
                  enc_hidden=32, enc_heads=2, enc_layers=1, dit_hidden=32, dit_heads=2, dit_layers=2,
                  patch_size=2, feat_dim=16, fsq_dim=16, vae_encoder_dim=8, vae_encoder_rates=(2, 4),
                  vae_decoder_dim=32, vae_decoder_rates=(4, 3, 2), vae_sample_rate=16000),
    "tiny2": Shape(hidden=96, heads=6, kv_heads=2, ffn=160, layers=3, residual_layers=2,
                   enc_hidden=64, enc_heads=4, enc_layers=2, dit_hidden=32, dit_heads=2, dit_layers=1,
                   patch_size=4, feat_dim=8, fsq_dim=12, vae_encoder_dim=4, vae_encoder_rates=(2, 2, 2),
                   vae_decoder_dim=16, vae_decoder_rates=(2, 3, 2, 2), vae_sample_rate=16000,
                   residual_no_rope=True),
    "tiny3": Shape(hidden=64, heads=2, kv_heads=1, ffn=96, layers=1, residual_layers=3,
                   enc_hidden=64, enc_heads=2, enc_layers=1, dit_hidden=64, dit_heads=2, dit_layers=3,
                   patch_size=3, feat_dim=12, fsq_dim=8, vae_encoder_dim=8, vae_encoder_rates=(4, 2),
                   vae_decoder_dim=24, vae_decoder_rates=(3, 8), vae_sample_rate=16000),
}

# ----------------------------------------------------------------------------- tokenizer

_SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>", AUDIO_START: "<|audio_start|>", AUDIO_END: "<|audio_end|>",
             REF_AUDIO_START: "<|ref_audio_start|>", REF_AUDIO_END: "<|ref_audio_end|>"}
# "▁大人": a Chinese token whose text without "▁" is no token, which the reference does not split
_ENGLISH_WORDS = ["▁the", "▁hello", "ing", "er", "an", "on", "re", "en", "▁a", "▁s", "▁w", "ou", "is",
                  "▁i", "ll", "or", "▁this", "▁speech", "▁大人"]
_CHINESE_WORDS = ["你好", "世界", "今天", "天气", "我们", "语音", "合成", "中国"]
_CHINESE_CHARS = sorted(set("".join(_CHINESE_WORDS) + "的是一个不了在人有这上大来说"))


def tokenizer_json() -> dict:
    """A Llama-style byte-fallback BPE (``▁`` for spaces, prepended to the text) with the four
    audio tokens at the ids the reference hard-codes (101..104)."""
    vocab: dict[str, int] = {}
    for i in range(105):
        vocab[_SPECIALS.get(i, f"<reserved_{i}>")] = i
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    symbols = ["▁"] + [chr(c) for c in range(33, 127)] + _CHINESE_CHARS
    for s in symbols:
        vocab.setdefault(s, len(vocab))
    merges = []
    for word in _ENGLISH_WORDS + _CHINESE_WORDS:
        # merged left to right: each prefix is a token
        for end in range(2, len(word) + 1):
            if word[:end] not in vocab:
                merges.append(f"{word[:end - 1]} {word[end - 1]}")
                vocab[word[:end]] = len(vocab)
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in sorted(_SPECIALS.items())]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


TOKENIZER_CONFIG = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                    "unk_token": "<unk>", "add_bos_token": False, "add_eos_token": False,
                    "legacy": True, "model_max_length": 8192}

# ----------------------------------------------------------------------------- config


def checkpoint_config(shape: str = "tiny") -> dict:
    s = SHAPES[shape]
    vocab = len(tokenizer_json()["model"]["vocab"])
    head_dim = s.hidden // s.heads
    rope_half = head_dim // 2
    lm = {"bos_token_id": 1, "eos_token_id": 2, "hidden_size": s.hidden, "intermediate_size": s.ffn,
          "max_position_embeddings": 32768, "num_attention_heads": s.heads, "num_hidden_layers": s.layers,
          "num_key_value_heads": s.kv_heads, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "rope_scaling": {"type": "longrope",
                           "long_factor": [round(1.0 + 0.05 * i, 4) for i in range(rope_half)],
                           "short_factor": [round(1.0 + 0.05 * i, 4) for i in range(rope_half)],
                           "original_max_position_embeddings": 32768},
          "vocab_size": vocab, "use_mup": False, "scale_emb": 12, "dim_model_base": 256,
          "scale_depth": 1.4}
    return {
        "architecture": "voxcpm2",
        "lm_config": lm,
        "patch_size": s.patch_size,
        "feat_dim": s.feat_dim,
        "residual_lm_num_layers": s.residual_layers,
        "residual_lm_no_rope": s.residual_no_rope,
        "scalar_quantization_latent_dim": s.fsq_dim,
        "scalar_quantization_scale": 9,
        "encoder_config": {"hidden_dim": s.enc_hidden, "ffn_dim": 2 * s.enc_hidden, "num_heads": s.enc_heads,
                           "num_layers": s.enc_layers},
        "dit_config": {"hidden_dim": s.dit_hidden, "ffn_dim": 2 * s.dit_hidden, "num_heads": s.dit_heads,
                       "num_layers": s.dit_layers, "dit_mean_mode": False,
                       "cfm_config": {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm",
                                      "training_cfg_rate": 0.1, "inference_cfg_rate": 1.0, "reg_loss_type": "l1",
                                      "ratio_r_neq_t_range": [0.25, 0.75], "noise_cond_prob_range": [0.0, 0.0],
                                      "noise_cond_scale": 0.0}},
        "audio_vae_config": {"encoder_dim": s.vae_encoder_dim, "encoder_rates": list(s.vae_encoder_rates),
                             "latent_dim": s.feat_dim, "decoder_dim": s.vae_decoder_dim,
                             "decoder_rates": list(s.vae_decoder_rates), "depthwise": True,
                             "sample_rate": s.vae_sample_rate,
                             "out_sample_rate": s.vae_sample_rate * math.prod(s.vae_decoder_rates)
                             // math.prod(s.vae_encoder_rates),
                             "use_noise_block": False, "sr_bin_boundaries": [20000, 30000, 40000],
                             "cond_type": "scale_bias", "cond_dim": 128, "cond_out_layer": False},
        "max_length": 4096,
        "device": "cpu",
        "dtype": "float32",
    }

# ----------------------------------------------------------------------------- tensors


def _linear(out: list, name: str, out_dim: int, in_dim: int, bias: bool = True) -> None:
    out.append((f"{name}.weight", (out_dim, in_dim), "linear"))
    if bias:
        out.append((f"{name}.bias", (out_dim,), "bias"))


def _minicpm(out: list, prefix: str, hidden: int, ffn: int, heads: int, kv_heads: int, layers: int,
             vocab: int) -> None:
    head_dim = hidden // heads
    if vocab:
        out.append((f"{prefix}.embed_tokens.weight", (vocab, hidden), "embedding"))
    for i in range(layers):
        p = f"{prefix}.layers.{i}"
        _linear(out, f"{p}.self_attn.q_proj", heads * head_dim, hidden, bias=False)
        _linear(out, f"{p}.self_attn.k_proj", kv_heads * head_dim, hidden, bias=False)
        _linear(out, f"{p}.self_attn.v_proj", kv_heads * head_dim, hidden, bias=False)
        _linear(out, f"{p}.self_attn.o_proj", hidden, heads * head_dim, bias=False)
        _linear(out, f"{p}.mlp.gate_proj", ffn, hidden, bias=False)
        _linear(out, f"{p}.mlp.up_proj", ffn, hidden, bias=False)
        _linear(out, f"{p}.mlp.down_proj", hidden, ffn, bias=False)
        out.append((f"{p}.input_layernorm.weight", (hidden,), "norm"))
        out.append((f"{p}.post_attention_layernorm.weight", (hidden,), "norm"))
    out.append((f"{prefix}.norm.weight", (hidden,), "norm"))


def _model_tensors(cfg: dict) -> list:
    lm, enc, dit = cfg["lm_config"], cfg["encoder_config"], cfg["dit_config"]
    h, feat, kv = lm["hidden_size"], cfg["feat_dim"], lm["num_key_value_heads"]
    out: list = []
    _minicpm(out, "base_lm", h, lm["intermediate_size"], lm["num_attention_heads"], kv,
             lm["num_hidden_layers"], lm["vocab_size"])
    _minicpm(out, "residual_lm", h, lm["intermediate_size"], lm["num_attention_heads"], kv,
             cfg["residual_lm_num_layers"], 0)
    out.append(("feat_encoder.special_token", (1, 1, 1, enc["hidden_dim"]), "embedding"))
    _linear(out, "feat_encoder.in_proj", enc["hidden_dim"], feat)
    _minicpm(out, "feat_encoder.encoder", enc["hidden_dim"], enc["ffn_dim"], enc["num_heads"], kv,
             enc["num_layers"], 0)
    e = "feat_decoder.estimator"
    hd = dit["hidden_dim"]
    _linear(out, f"{e}.in_proj", hd, feat)
    _linear(out, f"{e}.cond_proj", hd, feat)
    _linear(out, f"{e}.out_proj", feat, hd)
    for mlp in ("time_mlp", "delta_time_mlp"):
        _linear(out, f"{e}.{mlp}.linear_1", hd, hd)
        _linear(out, f"{e}.{mlp}.linear_2", hd, hd)
    _minicpm(out, f"{e}.decoder", hd, dit["ffn_dim"], dit["num_heads"], kv, dit["num_layers"], 0)
    _linear(out, "fsq_layer.in_proj", cfg["scalar_quantization_latent_dim"], h)
    _linear(out, "fsq_layer.out_proj", h, cfg["scalar_quantization_latent_dim"])
    _linear(out, "enc_to_lm_proj", h, enc["hidden_dim"])
    _linear(out, "lm_to_dit_proj", hd, h)
    _linear(out, "res_to_dit_proj", hd, h)
    _linear(out, "fusion_concat_proj", h, 2 * h)
    _linear(out, "stop_proj", h, h)
    _linear(out, "stop_head", 2, h, bias=False)
    return out


def _wn_conv(out: list, name: str, c_out: int, c_in: int, kernel: int, transpose: bool = False,
             bias: bool = True, gain: str = "gain") -> None:
    # weight_norm over dim 0: g is [out, 1, 1] for Conv1d, [in, 1, 1] for ConvTranspose1d (dim 0 = in)
    shape = (c_in, c_out, kernel) if transpose else (c_out, c_in, kernel)
    out.append((f"{name}.weight_g", (shape[0], 1, 1), gain))
    out.append((f"{name}.weight_v", shape, "conv"))
    if bias:
        out.append((f"{name}.bias", (c_out,), "bias"))


def _residual_unit(out: list, p: str, dim: int, groups: int) -> None:
    out.append((f"{p}.block.0.alpha", (1, dim, 1), "alpha"))
    _wn_conv(out, f"{p}.block.1", dim, dim // groups, 7)
    out.append((f"{p}.block.2.alpha", (1, dim, 1), "alpha"))
    _wn_conv(out, f"{p}.block.3", dim, dim, 1)


def _vae_tensors(v: dict) -> list:
    out: list = []
    depthwise = v["depthwise"]
    d = v["encoder_dim"]
    _wn_conv(out, "encoder.block.0", d, 1, 7)
    for i, stride in enumerate(v["encoder_rates"]):
        d_in, d = d, d * 2
        groups = d_in if depthwise else 1     # the block's input width is output_dim // 2
        p = f"encoder.block.{i + 1}.block"
        for j in range(3):
            _residual_unit(out, f"{p}.{j}", d_in, groups)
        out.append((f"{p}.3.alpha", (1, d_in, 1), "alpha"))
        _wn_conv(out, f"{p}.4", d, d_in, 2 * stride)
    _wn_conv(out, "encoder.fc_mu", v["latent_dim"], d, 3)
    _wn_conv(out, "encoder.fc_logvar", v["latent_dim"], d, 3)
    latent, channels = v["latent_dim"], v["decoder_dim"]
    idx = 0
    if depthwise:
        _wn_conv(out, "decoder.model.0", latent, 1, 7)
        _wn_conv(out, "decoder.model.1", channels, latent, 1)
        idx = 2
    else:
        _wn_conv(out, "decoder.model.0", channels, latent, 7)
        idx = 1
    buckets = len(v["sr_bin_boundaries"]) + 1 if v["sr_bin_boundaries"] is not None else 0
    for i, stride in enumerate(v["decoder_rates"]):
        d_in, d_out = channels // 2 ** i, channels // 2 ** (i + 1)
        groups = d_out if depthwise else 1
        p = f"decoder.model.{idx}.block"
        out.append((f"{p}.0.alpha", (1, d_in, 1), "alpha"))
        _wn_conv(out, f"{p}.1", d_out, d_in, 2 * stride, transpose=True)
        for j in range(3):
            _residual_unit(out, f"{p}.{j + 2}", d_out, groups)
        if buckets:
            out.append((f"decoder.sr_cond_model.{idx}.scale_embed.weight", (buckets, d_in), "scale"))
            out.append((f"decoder.sr_cond_model.{idx}.bias_embed.weight", (buckets, d_in), "bias"))
        idx += 1
    d_out = channels // 2 ** len(v["decoder_rates"])
    out.append((f"decoder.model.{idx}.alpha", (1, d_out, 1), "alpha"))
    _wn_conv(out, f"decoder.model.{idx + 1}", 1, d_out, 7, gain="out_gain")
    if buckets:
        out.append(("decoder.sr_bin_boundaries", (buckets - 1,), "boundaries"))
    return out


def released_scale_config() -> dict:
    """The language model's sizes of the released VoxCPM2 (backbone 2048 x 28 layers, 73448-token
    vocabulary, residual LM 8 layers, local encoder and DiT 1024 x 4, patch 4, 64 latent
    channels) on the tiny shape's config: for the meta-device graph-safety test and the GPU check,
    which build the model without weights on disk."""
    cfg = checkpoint_config("tiny")
    head_dim = 64
    cfg["lm_config"].update(hidden_size=2048, intermediate_size=6144, num_attention_heads=32,
                            num_key_value_heads=2, num_hidden_layers=28, vocab_size=73448, use_mup=True)
    cfg["lm_config"]["rope_scaling"].update(long_factor=[1.0] * (head_dim // 2), short_factor=[1.0] * (head_dim // 2))
    cfg.update(patch_size=4, feat_dim=64, residual_lm_num_layers=8, scalar_quantization_latent_dim=512)
    cfg["encoder_config"].update(hidden_dim=1024, ffn_dim=4096, num_heads=16, num_layers=4)
    cfg["dit_config"].update(hidden_dim=1024, ffn_dim=4096, num_heads=16, num_layers=4)
    return cfg


def tensor_specs(shape: str = "tiny") -> tuple[list, list]:
    """(model tensors, AudioVAE tensors): ``(name, shape, kind)`` in the released names."""
    cfg = checkpoint_config(shape)
    return _model_tensors(cfg), _vae_tensors(cfg["audio_vae_config"])


def _draw(name: str, shape: tuple, kind: str, seed: int, vae: dict) -> torch.Tensor:
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 63))
    r = torch.randn(shape, generator=g)
    if kind == "linear":
        return r / math.sqrt(shape[1])
    if kind == "conv":
        return r
    if kind == "gain":
        # weight norm: each output's weight has norm g, as a randn / sqrt(fan_in) row has about 1
        return 1.0 + 0.1 * r
    if kind == "out_gain":
        # the waveform's last convolution, before tanh: small, so that the audio is mostly unclipped
        return 0.05 * (1.0 + 0.1 * r)
    if kind == "bias":
        return 0.01 * r
    if kind == "embedding":
        return r
    if kind == "norm":
        return 1.0 + 0.1 * r
    if kind == "alpha":
        return 1.0 + 0.1 * r.abs()
    if kind == "scale":
        return 1.0 + 0.1 * r
    if kind == "boundaries":
        return torch.tensor(vae["sr_bin_boundaries"], dtype=torch.int32)
    raise ValueError(kind)


def write_random_checkpoint(out: str, shape: str = "tiny", seed: int = 0) -> str:
    """Write a random checkpoint of ``shape`` into ``out`` (created); returns ``out``."""
    from safetensors.torch import save_file

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    os.makedirs(out, exist_ok=True)
    cfg = checkpoint_config(shape)
    model_specs, vae_specs = tensor_specs(shape)
    vae = cfg["audio_vae_config"]
    model = {n: _draw(n, s, k, seed, vae).contiguous() for n, s, k in model_specs}
    audio_vae = {n: _draw(n, s, k, seed, vae).contiguous() for n, s, k in vae_specs}
    save_file(model, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    # as released: the language model in safetensors, the AudioVAE a PyTorch file holding
    # {"state_dict": ...}
    torch.save({"state_dict": audio_vae}, os.path.join(out, "audiovae.pth"))
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(TOKENIZER_CONFIG, f, indent=2)
    with open(os.path.join(out, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f, indent=2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(write_random_checkpoint(args.out, args.shape, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
