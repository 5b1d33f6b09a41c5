"""The speech-tokenizer encoder of Qwen3-TTS 12 Hz (voice cloning): 24 kHz audio -> codes
``[frames, 16]``, the same codes the talker produces, so that a reference recording can be put
into an in-context (ICL) prompt.

The released tokenizer's encoder is a Mimi encoder (``encoder.*`` of
``speech_tokenizer/model.safetensors``, configured by ``encoder_config``) of which the first
``encoder_valid_num_quantizers`` (16) of its quantizers are kept. Reimplemented here in plain
torch, step by step as Mimi computes it:

1. SEANet encoder: causal convolutions (left padding ``kernel - stride``, plus right padding so the
   last window is complete; zero padding), residual blocks ``x + conv1x1(elu(conv_k(elu(x))))``, and
   ELU + strided convolutions by 4, 5, 6, 8 (960 samples per 25 Hz step), ELU, last convolution.
2. Encoder transformer: pre-LayerNorm layers with RoPE self-attention (causal over the whole
   input, as the reference's attention mask makes it), GELU MLP and per-channel layer scales.
3. Downsampling to 12.5 Hz: a causal stride-2 convolution (kernel 4, replicate padding).
4. Split residual vector quantisation: the semantic quantizer (1 codebook) and the acoustic one
   (the next codebooks, residual among themselves) each project the same embedding (1x1 conv)
   and pick, per codebook, the nearest centroid (``embed_sum / max(cluster_usage, 1e-5)``) by
   euclidean distance, subtracting it from the residual.

Codes are cut to ``ceil(samples / 1920)`` frames. Weights are used as stored (no copy), like the
reference's loader does: on CPU a convolution's rounding depends on its weight's memory alignment.
"""
from __future__ import annotations

import json
import math
import os
from typing import Mapping

import numpy as np
import torch
from torch.nn import functional as F

__all__ = ["SpeechEncoder"]


class _CausalConv:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, stride: int = 1, dilation: int = 1,
                 pad_mode: str = "constant") -> None:
        self.weight, self.bias = weight, bias
        self.stride, self.dilation, self.pad_mode = stride, dilation, pad_mode
        self.kernel = (weight.shape[-1] - 1) * dilation + 1
        self.padding_total = self.kernel - stride

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = math.ceil((length - self.kernel + self.padding_total) / self.stride + 1) - 1
        extra = frames * self.stride + self.kernel - self.padding_total - length
        x = F.pad(x, (self.padding_total, extra), self.pad_mode, 0.0) if self.pad_mode == "constant" \
            else F.pad(x, (self.padding_total, extra), self.pad_mode)
        return F.conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation)


# transformers' MimiConfig defaults for what this encoder reads
MIMI_DEFAULTS: Mapping = {"upsampling_ratios": [8, 6, 5, 4], "num_residual_layers": 1, "dilation_growth_rate": 2,
                          "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
                          "hidden_size": 512, "num_quantizers": 32, "num_semantic_quantizers": 1,
                          "norm_eps": 1e-5, "rope_theta": 10000.0}


class SpeechEncoder:
    """Mimi encoder + the first ``num_quantizers`` quantizers (module doc). ``encode(audio_24k)``
    returns int64 codes ``[frames, num_quantizers]``."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], config: Mapping, num_quantizers: int = 16,
                 downsample_rate: int = 1920, sample_rate: int = 24000) -> None:
        # a key the checkpoint leaves out takes MimiConfig's default, as the reference's MimiModel
        self.config = {**MIMI_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        self.num_quantizers = int(num_quantizers)
        self.downsample_rate = int(downsample_rate)
        self.sample_rate = int(sample_rate)
        c = self.config
        t = dict(tensors)

        def conv(name: str, **kwargs) -> _CausalConv:
            return _CausalConv(t[f"{name}.weight"], t.get(f"{name}.bias"), **kwargs)

        # SEANet encoder, as a list of steps
        self.seanet: list = [("conv", conv("encoder.layers.0.conv"))]
        index = 1
        for ratio in reversed(c["upsampling_ratios"]):
            for j in range(c["num_residual_layers"]):
                block = f"encoder.layers.{index}"
                shortcut = conv(f"{block}.shortcut.conv") if f"{block}.shortcut.conv.weight" in t else None
                self.seanet.append(("residual", (conv(f"{block}.block.1.conv", dilation=c["dilation_growth_rate"] ** j),
                                                 conv(f"{block}.block.3.conv"), shortcut)))
                index += 1
            self.seanet.append(("elu", None))
            index += 1
            self.seanet.append(("conv", conv(f"encoder.layers.{index}.conv", stride=ratio)))
            index += 1
        self.seanet.append(("elu", None))
        index += 1
        self.seanet.append(("conv", conv(f"encoder.layers.{index}.conv")))

        self.layers = []
        for i in range(c["num_hidden_layers"]):
            p = f"encoder_transformer.layers.{i}."
            self.layers.append({name[len(p):]: value for name, value in t.items() if name.startswith(p)})
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = float(c.get("norm_eps", 1e-5))
        self.inv_freq = 1.0 / (float(c.get("rope_theta", 10000.0)) ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))

        self.downsample = conv("downsample.conv", stride=2, pad_mode="replicate") \
            if "downsample.conv.weight" in t else None

        self.quantizers = []
        for part in ("semantic", "acoustic"):
            q = f"quantizer.{part}_residual_vector_quantizer."
            count = c["num_semantic_quantizers"] if part == "semantic" else c["num_quantizers"] - c["num_semantic_quantizers"]
            codebooks = [t[f"{q}layers.{i}.codebook.embed_sum"]
                         / t[f"{q}layers.{i}.codebook.cluster_usage"].clamp(min=1e-5)[:, None] for i in range(count)]
            self.quantizers.append((t.get(f"{q}input_proj.weight"), codebooks))

    # -- loading
    @classmethod
    def from_checkpoint(cls, speech_tokenizer_dir: str, device: str | torch.device = "cpu") -> "SpeechEncoder":
        from safetensors import safe_open

        with open(os.path.join(speech_tokenizer_dir, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
        tensors = {}
        with safe_open(os.path.join(speech_tokenizer_dir, "model.safetensors"), framework="pt") as handle:
            for name in handle.keys():
                if name.startswith("encoder."):
                    tensors[name[len("encoder."):]] = handle.get_tensor(name).to(device=device, dtype=torch.float32)
        if not tensors:
            raise ValueError(f"{speech_tokenizer_dir}: no encoder.* weights in model.safetensors")
        return cls(tensors, config["encoder_config"], config.get("encoder_valid_num_quantizers", 16),
                   config.get("encode_downsample_rate", 1920), config.get("input_sample_rate", 24000))

    # -- the four parts
    def _seanet(self, x: torch.Tensor) -> torch.Tensor:
        for kind, step in self.seanet:
            if kind == "conv":
                x = step(x)
            elif kind == "elu":
                x = F.elu(x)
            else:
                first, second, shortcut = step
                y = second(F.elu(first(F.elu(x))))
                x = (shortcut(x) if shortcut is not None else x) + y
        return x

    def _attention(self, w: Mapping[str, torch.Tensor], h: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor) -> torch.Tensor:
        b, n, _ = h.shape
        q = F.linear(h, w["self_attn.q_proj.weight"], w.get("self_attn.q_proj.bias"))
        k = F.linear(h, w["self_attn.k_proj.weight"], w.get("self_attn.k_proj.bias"))
        v = F.linear(h, w["self_attn.v_proj.weight"], w.get("self_attn.v_proj.bias"))
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        group = self.heads // self.kv_heads
        if group > 1:
            k = k[:, :, None].expand(b, self.kv_heads, group, n, self.head_dim).reshape(b, self.heads, n, self.head_dim)
            v = v[:, :, None].expand(b, self.kv_heads, group, n, self.head_dim).reshape(b, self.heads, n, self.head_dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=n > 1)
        out = out.transpose(1, 2).contiguous().view(b, n, -1)
        return F.linear(out, w["self_attn.o_proj.weight"], w.get("self_attn.o_proj.bias"))

    def _transformer(self, h: torch.Tensor) -> torch.Tensor:
        n = h.shape[1]
        positions = torch.arange(n, device=h.device).unsqueeze(0)
        freqs = (self.inv_freq.to(h.device)[None, :, None].float() @ positions[:, None, :].float()).transpose(1, 2)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(h.dtype), angles.sin().to(h.dtype)
        hidden = h.shape[-1]
        for w in self.layers:
            x = F.layer_norm(h, (hidden,), w["input_layernorm.weight"], w["input_layernorm.bias"], self.eps)
            h = h + w["self_attn_layer_scale.scale"] * self._attention(w, x, cos, sin)
            x = F.layer_norm(h, (hidden,), w["post_attention_layernorm.weight"], w["post_attention_layernorm.bias"],
                             self.eps)
            x = F.linear(F.gelu(F.linear(x, w["mlp.fc1.weight"])), w["mlp.fc2.weight"])
            h = h + w["mlp_layer_scale.scale"] * x
        return h

    def _quantize(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, hidden, frames]`` -> codes ``[B, num_quantizers, frames]``."""
        codes = []
        remaining = self.num_quantizers
        for projection, codebooks in self.quantizers:
            residual = F.conv1d(embeddings, projection) if projection is not None else embeddings
            for codebook in codebooks[:remaining]:
                vectors = residual.permute(0, 2, 1)
                flat = vectors.reshape(-1, vectors.shape[-1])
                index = torch.cdist(flat[None].float(), codebook[None].float(), p=2)[0].argmin(dim=-1)
                index = index.view(*vectors.shape[:-1])
                residual = residual - F.embedding(index, codebook).permute(0, 2, 1)
                codes.append(index)
            remaining -= min(remaining, len(codebooks))
            if remaining == 0:
                break
        return torch.stack(codes, dim=1)

    @torch.inference_mode()
    def encode(self, audio_24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Codes ``[ceil(samples / 1920), num_quantizers]`` (int64, CPU) of one mono 24 kHz recording."""
        device = self.quantizers[0][1][0].device
        audio = torch.as_tensor(np.asarray(audio_24k, dtype=np.float32), device=device)
        if audio.ndim != 1 or audio.shape[0] == 0:
            raise ValueError("expected a non-empty mono waveform")
        x = self._seanet(audio.view(1, 1, -1))
        x = self._transformer(x.transpose(1, 2)).transpose(1, 2)
        if self.downsample is not None:
            x = self.downsample(x)
        codes = self._quantize(x)[0]
        frames = -(-audio.shape[0] // self.downsample_rate)
        return codes[:, :frames].transpose(0, 1).contiguous().cpu()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
