"""Random Qwen3-TTS 12 Hz speech-tokenizer checkpoints in the released folder layout.

:func:`write_speech_tokenizer` writes ``config.json`` (model_type ``qwen3_tts_tokenizer_12hz``,
with the Mimi ``encoder_config`` and the ``decoder_config``), ``preprocessor_config.json`` and
``model.safetensors`` holding every tensor the reference ``Qwen3TTSTokenizerV2Model`` has
(``decoder.*`` and ``encoder.*``), so that the reference package loads the folder with
``Qwen3TTSTokenizerV2Model.from_pretrained`` and our :class:`Code2Wav` loads its decoder part.

The tensor names and shapes are enumerated here from the configuration (no model is built);
``tests/unit/test_qwen3_code2wav.py`` checks them against the reference module.

Weights are random but scaled by fan-in (``randn / sqrt(fan_in)``), so that a random codec
depends strongly on its codes instead of ignoring them (the default initialisation leaves the
codebooks at zero and the layer scales at 1e-2 / 1e-6), and so that its output stays mostly
out of the ``[-1, 1]`` clamp (the residual units' second convolution and the last convolution
are damped). Each tensor is drawn from its own generator, seeded from ``seed`` and the tensor
name, so the output is deterministic for a seed.
"""

from __future__ import annotations

import json
import math
import os

from omni_backend.models.qwen3_common.random_weights import TensorSpec, draw, write_json

__all__ = [
    "SPEECH_TOKENIZER_SIZES",
    "TensorSpec",
    "speech_tokenizer_config",
    "speech_tokenizer_tensor_specs",
    "write_speech_tokenizer",
]

SPEECH_TOKENIZER_SIZES = ("tiny", "small", "0.6b", "1.7b")

# ---------------------------------------------------------------------------- configurations

_TOP_LEVEL = {
    "encoder_valid_num_quantizers": 16,
    "input_sample_rate": 24000,
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "encode_downsample_rate": 1920,
}

# The released Qwen3-TTS-Tokenizer-12Hz (shared by the 0.6B and 1.7B models).
_REAL_DECODER = {
    "codebook_size": 2048, "codebook_dim": 512, "hidden_size": 512, "latent_dim": 1024,
    "max_position_embeddings": 8000, "rope_theta": 10000, "num_attention_heads": 16, "num_key_value_heads": 16,
    "head_dim": 64, "attention_bias": False, "sliding_window": 72, "intermediate_size": 1024,
    "hidden_act": "silu", "layer_scale_initial_scale": 0.01, "rms_norm_eps": 1e-5, "num_hidden_layers": 8,
    "num_quantizers": 16, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
    "attention_dropout": 0.0,
}
_REAL_ENCODER = {  # MimiConfig of the released encoder (Mimi defaults at 12.5 Hz)
    "audio_channels": 1, "hidden_size": 512, "num_filters": 64, "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3,
    "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant", "compress": 2,
    "trim_right_ratio": 1.0, "codebook_size": 2048, "codebook_dim": 256, "num_quantizers": 32,
    "num_semantic_quantizers": 1, "vector_quantization_hidden_dimension": 256, "use_conv_shortcut": False,
    "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "gelu", "sliding_window": 250, "max_position_embeddings": 8000,
    "rope_theta": 10000.0, "norm_eps": 1e-5, "layer_scale_initial_scale": 0.01, "attention_bias": False,
    "sampling_rate": 24000, "frame_rate": 12.5, "upsample_groups": 512, "use_cache": False,
}


def _scaled(encoder: dict, decoder: dict) -> tuple[dict, dict]:
    return {**_REAL_ENCODER, **encoder}, {**_REAL_DECODER, **decoder}


_SIZES = {
    "tiny": _scaled(
        {"hidden_size": 32, "num_filters": 8, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
         "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
         "head_dim": 16, "upsample_groups": 32},
        {"codebook_dim": 16, "hidden_size": 32, "latent_dim": 32, "num_attention_heads": 2,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64, "num_hidden_layers": 2,
         "decoder_dim": 32},
    ),
    "small": _scaled(
        {"hidden_size": 64, "num_filters": 16, "codebook_dim": 32, "vector_quantization_hidden_dimension": 32,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
         "head_dim": 16, "upsample_groups": 64},
        {"codebook_dim": 64, "hidden_size": 64, "latent_dim": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "num_hidden_layers": 4,
         "decoder_dim": 128},
    ),
    "0.6b": (_REAL_ENCODER, _REAL_DECODER),
    "1.7b": (_REAL_ENCODER, _REAL_DECODER),
}


def speech_tokenizer_config(size: str) -> dict:
    """The ``config.json`` dictionary of a speech tokenizer of ``size`` (see SPEECH_TOKENIZER_SIZES)."""
    if size not in _SIZES:
        raise ValueError(f"unknown speech tokenizer size {size!r}; known: {', '.join(SPEECH_TOKENIZER_SIZES)}")
    encoder, decoder = _SIZES[size]
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        **_TOP_LEVEL,
        "encoder_config": json.loads(json.dumps(encoder)),
        "decoder_config": json.loads(json.dumps(decoder)),
    }


_PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
    "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000, "chunk_length_s": None,
    "overlap": None,
}

# ---------------------------------------------------------------------------- tensor enumeration


class _Specs(list):
    def linear(self, name: str, out_dim: int, in_dim: int, bias: bool = True, gain: float = 1.0) -> None:
        self.append(TensorSpec(f"{name}.weight", (out_dim, in_dim), "fan_in", in_dim, gain))
        if bias:
            self.append(TensorSpec(f"{name}.bias", (out_dim,), "bias"))

    def conv(self, name: str, out_ch: int, in_ch: int, kernel: int, groups: int = 1, bias: bool = True,
             gain: float = 1.0) -> None:
        self.append(TensorSpec(f"{name}.weight", (out_ch, in_ch // groups, kernel), "fan_in",
                               in_ch // groups * kernel, gain))
        if bias:
            self.append(TensorSpec(f"{name}.bias", (out_ch,), "bias"))

    def transposed_conv(self, name: str, in_ch: int, out_ch: int, kernel: int, stride: int) -> None:
        # each output sample sums in_ch * kernel / stride products
        self.append(TensorSpec(f"{name}.weight", (in_ch, out_ch, kernel), "fan_in", in_ch * kernel / stride))
        self.append(TensorSpec(f"{name}.bias", (out_ch,), "bias"))

    def vector(self, name: str, dim: int, init: str) -> None:
        self.append(TensorSpec(name, (dim,), init))

    def snake(self, name: str, dim: int) -> None:
        self.append(TensorSpec(f"{name}.alpha", (dim,), "log_scale", gain=0.3))
        self.append(TensorSpec(f"{name}.beta", (dim,), "log_scale", gain=0.3))


# Damping that keeps a random vocoder out of its [-1, 1] clamp: each residual unit would
# otherwise amplify its input about 3x.
_RESIDUAL_OUT_GAIN = 0.25
_FINAL_CONV_GAIN = 0.1


def _decoder_specs(cfg: dict) -> list[TensorSpec]:
    s = _Specs()
    p = "decoder."
    n_q, size, cb_dim = cfg["num_quantizers"], cfg["codebook_size"], cfg["codebook_dim"]
    latent, hidden = cfg["latent_dim"], cfg["hidden_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    bias = bool(cfg.get("attention_bias", False))
    for part, count in (("rvq_first", 1), ("rvq_rest", n_q - 1)):
        q = f"{p}quantizer.{part}."
        s.conv(q + "input_proj", cb_dim // 2, cb_dim, 1, bias=False)
        s.conv(q + "output_proj", cb_dim, cb_dim // 2, 1, bias=False)
        for i in range(count):
            s.vector(f"{q}vq.layers.{i}._codebook.cluster_usage", size, "ones")
            s.append(TensorSpec(f"{q}vq.layers.{i}._codebook.embedding_sum", (size, cb_dim // 2), "normal"))
    s.conv(p + "pre_conv.conv", latent, cb_dim, 3)
    t = p + "pre_transformer."
    s.linear(t + "input_proj", hidden, latent)
    for i in range(cfg["num_hidden_layers"]):
        layer = f"{t}layers.{i}."
        s.linear(layer + "self_attn.q_proj", heads * head_dim, hidden, bias)
        s.linear(layer + "self_attn.k_proj", kv_heads * head_dim, hidden, bias)
        s.linear(layer + "self_attn.v_proj", kv_heads * head_dim, hidden, bias)
        s.linear(layer + "self_attn.o_proj", hidden, heads * head_dim, bias)
        s.linear(layer + "mlp.gate_proj", cfg["intermediate_size"], hidden, False)
        s.linear(layer + "mlp.up_proj", cfg["intermediate_size"], hidden, False)
        s.linear(layer + "mlp.down_proj", hidden, cfg["intermediate_size"], False)
        s.vector(layer + "input_layernorm.weight", hidden, "norm")
        s.vector(layer + "post_attention_layernorm.weight", hidden, "norm")
        s.vector(layer + "self_attn_layer_scale.scale", hidden, "layer_scale")
        s.vector(layer + "mlp_layer_scale.scale", hidden, "layer_scale")
    s.vector(t + "norm.weight", hidden, "norm")
    s.linear(t + "output_proj", latent, hidden)
    for i, ratio in enumerate(cfg["upsampling_ratios"]):
        u = f"{p}upsample.{i}."
        s.transposed_conv(u + "0.conv", latent, latent, ratio, ratio)
        s.conv(u + "1.dwconv.conv", latent, latent, 7, groups=latent)
        s.vector(u + "1.norm.weight", latent, "norm")
        s.vector(u + "1.norm.bias", latent, "bias")
        s.linear(u + "1.pwconv1", 4 * latent, latent)
        s.linear(u + "1.pwconv2", latent, 4 * latent)
        s.vector(u + "1.gamma", latent, "layer_scale")
    dim = cfg["decoder_dim"]
    s.conv(p + "decoder.0.conv", dim, latent, 7)
    rates = cfg["upsample_rates"]
    for i, rate in enumerate(rates):
        b = f"{p}decoder.{i + 1}.block."
        in_dim, out_dim = dim // 2 ** i, dim // 2 ** (i + 1)
        s.snake(b + "0", in_dim)
        s.transposed_conv(b + "1.conv", in_dim, out_dim, 2 * rate, rate)
        for j in range(3):
            s.snake(f"{b}{j + 2}.act1", out_dim)
            s.conv(f"{b}{j + 2}.conv1.conv", out_dim, out_dim, 7)
            s.snake(f"{b}{j + 2}.act2", out_dim)
            s.conv(f"{b}{j + 2}.conv2.conv", out_dim, out_dim, 1, gain=_RESIDUAL_OUT_GAIN)
    out_dim = dim // 2 ** len(rates)
    s.snake(f"{p}decoder.{len(rates) + 1}", out_dim)
    s.conv(f"{p}decoder.{len(rates) + 2}.conv", 1, out_dim, 7, gain=_FINAL_CONV_GAIN)
    return list(s)


def _encoder_specs(cfg: dict) -> list[TensorSpec]:
    """The Mimi encoder half: SEANet encoder, encoder transformer, downsampling conv, split RVQ.
    (The reference drops Mimi's decoder, decoder transformer and upsampling conv.)"""
    s = _Specs()
    p = "encoder."
    filters, hidden = cfg["num_filters"], cfg["hidden_size"]
    s.conv(f"{p}encoder.layers.0.conv", filters, cfg["audio_channels"], cfg["kernel_size"])
    index, scaling = 1, 1
    for ratio in reversed(cfg["upsampling_ratios"]):
        channels = scaling * filters
        for _ in range(cfg["num_residual_layers"]):
            inner = channels // cfg["compress"]
            s.conv(f"{p}encoder.layers.{index}.block.1.conv", inner, channels, cfg["residual_kernel_size"])
            s.conv(f"{p}encoder.layers.{index}.block.3.conv", channels, inner, 1)
            if cfg.get("use_conv_shortcut", False):
                s.conv(f"{p}encoder.layers.{index}.shortcut.conv", channels, channels, 1)
            index += 1
        index += 1  # ELU
        s.conv(f"{p}encoder.layers.{index}.conv", channels * 2, channels, 2 * ratio)
        index += 1
        scaling *= 2
    index += 1  # ELU
    s.conv(f"{p}encoder.layers.{index}.conv", hidden, scaling * filters, cfg["last_kernel_size"])

    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    bias = bool(cfg.get("attention_bias", False))
    for i in range(cfg["num_hidden_layers"]):
        layer = f"{p}encoder_transformer.layers.{i}."
        s.linear(layer + "self_attn.q_proj", heads * head_dim, hidden, bias)
        s.linear(layer + "self_attn.k_proj", kv_heads * head_dim, hidden, bias)
        s.linear(layer + "self_attn.v_proj", kv_heads * head_dim, hidden, bias)
        s.linear(layer + "self_attn.o_proj", hidden, heads * head_dim, bias)
        s.linear(layer + "mlp.fc1", cfg["intermediate_size"], hidden, False)
        s.linear(layer + "mlp.fc2", hidden, cfg["intermediate_size"], False)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            s.vector(f"{layer}{norm}.weight", hidden, "norm")
            s.vector(f"{layer}{norm}.bias", hidden, "bias")
        s.vector(layer + "self_attn_layer_scale.scale", hidden, "layer_scale")
        s.vector(layer + "mlp_layer_scale.scale", hidden, "layer_scale")

    encoder_frame_rate = math.ceil(cfg["sampling_rate"] / math.prod(cfg["upsampling_ratios"]))
    if cfg["frame_rate"] != encoder_frame_rate:
        s.conv(f"{p}downsample.conv", hidden, hidden, 2 * int(encoder_frame_rate / cfg["frame_rate"]), bias=False)

    vq_dim = cfg["vector_quantization_hidden_dimension"]
    semantic = cfg["num_semantic_quantizers"]
    for part, count in (("semantic", semantic), ("acoustic", cfg["num_quantizers"] - semantic)):
        q = f"{p}quantizer.{part}_residual_vector_quantizer."
        for i in range(count):
            s.vector(f"{q}layers.{i}.codebook.initialized", 1, "ones")
            s.vector(f"{q}layers.{i}.codebook.cluster_usage", cfg["codebook_size"], "ones")
            s.append(TensorSpec(f"{q}layers.{i}.codebook.embed_sum", (cfg["codebook_size"], cfg["codebook_dim"]),
                                "normal"))
        if vq_dim != hidden:
            s.conv(q + "input_proj", vq_dim, hidden, 1, bias=False)
            s.conv(q + "output_proj", hidden, vq_dim, 1, bias=False)
    return list(s)


def speech_tokenizer_tensor_specs(config: dict) -> list[TensorSpec]:
    """Every tensor of a speech-tokenizer checkpoint with this ``config.json`` dictionary."""
    return _encoder_specs(config["encoder_config"]) + _decoder_specs(config["decoder_config"])


# ---------------------------------------------------------------------------- random weights


def write_speech_tokenizer(out_dir: str, size: str, seed: int) -> None:
    """Write a random speech tokenizer of ``size`` ('tiny', 'small', '0.6b', '1.7b') to ``out_dir``:
    ``config.json``, ``preprocessor_config.json`` and ``model.safetensors`` (Float32)."""
    from safetensors.torch import save_file

    config = speech_tokenizer_config(size)
    os.makedirs(out_dir, exist_ok=True)
    tensors = {spec.name: draw(spec, seed).contiguous() for spec in speech_tokenizer_tensor_specs(config)}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "preprocessor_config.json"), _PREPROCESSOR_CONFIG)
