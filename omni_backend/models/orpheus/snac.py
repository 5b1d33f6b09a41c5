"""The SNAC codec decoder (``hubertsiuzdak/snac_24khz``) that turns Orpheus' codes into audio.

Decoder only, in plain torch, Float32, inference mode. It loads the released folder unchanged
(``config.json`` + ``pytorch_model.bin``, the whole SNAC state dict): the module attribute
names below equal the checkpoint keys, the encoder and the quantizers' ``in_proj`` tensors are
accepted and ignored, and weight norm is folded into plain weights at load. The maths follows
the reference package ``snac==1.2.1`` operation for operation.

Decoding is ``quantizer.from_codes(codes)`` then ``decoder(z_q)``. The reference decoder's
NoiseBlocks draw ``torch.randn((B, 1, T))`` from the global generator on every call, which would
make served audio depend on the process's history and on the other rows of a batch. Here each
row has its own generator seeded by the caller: row ``b`` draws
``torch.randn((1, 1, T), generator=torch.Generator().manual_seed(seeds[b]))`` for each
NoiseBlock in forward order, so a row decodes to the same audio alone or in any batch.
:func:`window_noise_seed` derives such a seed per request and window.

    decoder = load_snac("snac_24khz/")
    audio = decoder.decode([codes0, codes1, codes2], seeds=[window_noise_seed(seed, 0)])
    # codes_i: int64 [B, T_i] with T_i * vq_strides[i] equal; audio: [B, 1, T_0 * frame_samples]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "SNACConfig",
    "SNACDecoder",
    "load_snac",
    "window_noise_seed",
]

# ----------------------------------------------------------------------------- configuration

# The reference constructor's defaults (snac.SNAC.__init__): its from_config fills missing keys
# from them, so a config.json that omits a key means these values.
_REFERENCE_DEFAULTS: dict[str, Any] = {
    "sampling_rate": 44100,
    "encoder_dim": 64,
    "encoder_rates": [3, 3, 7, 7],
    "latent_dim": None,
    "decoder_dim": 1536,
    "decoder_rates": [7, 7, 3, 3],
    "attn_window_size": 32,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [8, 4, 2, 1],
    "noise": True,
    "depthwise": True,
}


def _positive_int(raw: dict[str, Any], key: str) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"SNAC config: {key} must be a positive integer, got {value!r}")
    return value


def _positive_ints(raw: dict[str, Any], key: str) -> tuple[int, ...]:
    value = raw[key]
    if (not isinstance(value, (list, tuple)) or not value
            or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in value)):
        raise ValueError(f"SNAC config: {key} must be a non-empty list of positive integers, got {value!r}")
    return tuple(value)


def _flag(raw: dict[str, Any], key: str) -> bool:
    value = raw[key]
    if not isinstance(value, bool):
        raise ValueError(f"SNAC config: {key} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class SNACConfig:
    """The SNAC ``config.json``, restricted to what this decoder can run.

    Rejected with a ``ValueError`` naming the key: unknown keys (the reference constructor would
    reject them too), ``attn_window_size`` other than null (the decoder here has no local
    attention), ``decoder_dim`` not divisible by ``2 ** len(decoder_rates)``, and
    ``decoder_rates`` whose product differs from ``hop_length`` (the reference derives the hop
    from ``encoder_rates``; decoded audio would not be ``hop_length`` samples per latent step).
    """

    sampling_rate: int
    encoder_dim: int
    encoder_rates: tuple[int, ...]
    latent_dim: int
    decoder_dim: int
    decoder_rates: tuple[int, ...]
    codebook_size: int
    codebook_dim: int
    vq_strides: tuple[int, ...]
    noise: bool
    depthwise: bool

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> SNACConfig:
        unknown = sorted(set(config) - set(_REFERENCE_DEFAULTS))
        if unknown:
            raise ValueError(f"SNAC config: unknown key {unknown[0]!r} (known: {sorted(_REFERENCE_DEFAULTS)})")
        raw = {**_REFERENCE_DEFAULTS, **config}
        if raw["attn_window_size"] is not None:
            raise ValueError(
                f"SNAC config: attn_window_size={raw['attn_window_size']!r} is not supported "
                "(this decoder has no local attention; only null is; a missing key means the reference default 32)")
        encoder_dim = _positive_int(raw, "encoder_dim")
        encoder_rates = _positive_ints(raw, "encoder_rates")
        latent_dim = (encoder_dim * 2 ** len(encoder_rates) if raw["latent_dim"] is None
                      else _positive_int(raw, "latent_dim"))
        decoder_dim = _positive_int(raw, "decoder_dim")
        decoder_rates = _positive_ints(raw, "decoder_rates")
        if decoder_dim % 2 ** len(decoder_rates):
            raise ValueError(f"SNAC config: decoder_dim={decoder_dim} must be divisible by "
                             f"2 ** len(decoder_rates) = {2 ** len(decoder_rates)}")
        if math.prod(decoder_rates) != math.prod(encoder_rates):
            raise ValueError(f"SNAC config: decoder_rates {list(decoder_rates)} upsample by "
                             f"{math.prod(decoder_rates)}, but hop_length (product of encoder_rates "
                             f"{list(encoder_rates)}) is {math.prod(encoder_rates)}")
        return cls(
            sampling_rate=_positive_int(raw, "sampling_rate"),
            encoder_dim=encoder_dim,
            encoder_rates=encoder_rates,
            latent_dim=latent_dim,
            decoder_dim=decoder_dim,
            decoder_rates=decoder_rates,
            codebook_size=_positive_int(raw, "codebook_size"),
            codebook_dim=_positive_int(raw, "codebook_dim"),
            vq_strides=_positive_ints(raw, "vq_strides"),
            noise=_flag(raw, "noise"),
            depthwise=_flag(raw, "depthwise"),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> SNACConfig:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
        if not isinstance(config, dict):
            raise ValueError(f"SNAC config {path}: expected a JSON object")
        return cls.from_dict(config)

    @property
    def hop_length(self) -> int:
        """Audio samples per latent step (the reference's ``hop_length``)."""
        return math.prod(self.encoder_rates)


# ----------------------------------------------------------------------------- building blocks


class Snake1d(nn.Module):
    """``x + sin(alpha * x) ** 2 / alpha`` per channel, written as the reference writes it
    (``(alpha + 1e-9).reciprocal()``) so that the bits agree."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    """Snake, dilated conv (kernel 7), Snake, 1x1 conv, plus the input.

    The dilated conv is padded to keep the length, so the reference's crop of the skip path
    never removes anything and is left out."""

    def __init__(self, dim: int, dilation: int, groups: int, kernel: int = 7) -> None:
        super().__init__()
        padding = (kernel - 1) * dilation // 2
        self.block = nn.ModuleList([
            Snake1d(dim),
            nn.Conv1d(dim, dim, kernel, dilation=dilation, padding=padding, groups=groups),
            Snake1d(dim),
            nn.Conv1d(dim, dim, 1),
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.block:
            y = layer(y)
        return x + y


class NoiseBlock(nn.Module):
    """Adds ``noise * linear(x)``; the noise comes from the caller (one generator per row)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        steps = x.shape[-1]
        # drawn on the CPU, one row at a time, so a row's noise depends only on its own seed
        # (and not on the device or on its position in the batch)
        noise = torch.cat([torch.randn((1, 1, steps), generator=g) for g in generators])
        noise = noise.to(device=x.device, dtype=x.dtype)
        return x + noise * self.linear(x)


class DecoderBlock(nn.Module):
    """Snake, transposed conv upsampling by ``stride``, optional NoiseBlock, three residual
    units with dilations 1, 3, 9."""

    def __init__(self, input_dim: int, output_dim: int, stride: int, noise: bool, groups: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            Snake1d(input_dim),
            nn.ConvTranspose1d(input_dim, output_dim, 2 * stride, stride=stride,
                               padding=math.ceil(stride / 2), output_padding=stride % 2),
        ]
        if noise:
            layers.append(NoiseBlock(output_dim))
        layers += [ResidualUnit(output_dim, dilation, groups) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, generators) if isinstance(layer, NoiseBlock) else layer(x)
        return x


class Decoder(nn.Module):
    """Latents ``[B, latent_dim, T]`` to audio ``[B, 1, T * prod(decoder_rates)]`` in [-1, 1].

    ``model`` is a list whose indices are those of the reference's ``nn.Sequential`` (the
    checkpoint keys ``decoder.model.{i}``), ending in a parameterless Tanh."""

    def __init__(self, config: SNACConfig) -> None:
        super().__init__()
        latent, channels = config.latent_dim, config.decoder_dim
        if config.depthwise:
            layers: list[nn.Module] = [
                nn.Conv1d(latent, latent, 7, padding=3, groups=latent),
                nn.Conv1d(latent, channels, 1),
            ]
        else:
            layers = [nn.Conv1d(latent, channels, 7, padding=3)]
        output_dim = channels
        for i, stride in enumerate(config.decoder_rates):
            input_dim, output_dim = channels // 2 ** i, channels // 2 ** (i + 1)
            groups = output_dim if config.depthwise else 1
            layers.append(DecoderBlock(input_dim, output_dim, stride, config.noise, groups))
        layers += [Snake1d(output_dim), nn.Conv1d(output_dim, 1, 7, padding=3), nn.Tanh()]
        self.model = nn.ModuleList(layers)

    def forward(self, z_q: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        x = z_q
        for layer in self.model:
            x = layer(x, generators) if isinstance(layer, DecoderBlock) else layer(x)
        return x


class VectorQuantizer(nn.Module):
    """One codebook level: code lookup, 1x1 ``out_proj`` to the latent width, and repetition
    by ``stride`` in time (coarse levels hold one code per ``stride`` latent steps)."""

    def __init__(self, latent_dim: int, codebook_size: int, codebook_dim: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.codebook = nn.Embedding(codebook_size, codebook_dim)
        self.out_proj = nn.Conv1d(codebook_dim, latent_dim, 1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z_p = F.embedding(codes, self.codebook.weight).transpose(1, 2)
        return self.out_proj(z_p).repeat_interleave(self.stride, dim=-1)


class ResidualVectorQuantizer(nn.Module):
    """The decoding half of SNAC's residual VQ: the sum of every level's projected codes."""

    def __init__(self, config: SNACConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList([
            VectorQuantizer(config.latent_dim, config.codebook_size, config.codebook_dim, stride)
            for stride in config.vq_strides
        ])

    def from_codes(self, codes: list[torch.Tensor]) -> torch.Tensor:
        z_q = self.quantizers[0](codes[0])
        for quantizer, level_codes in zip(self.quantizers[1:], codes[1:]):
            z_q = z_q + quantizer(level_codes)
        return z_q


# ----------------------------------------------------------------------------- the decoder


class SNACDecoder(nn.Module):
    """SNAC codes to audio; attribute names equal the checkpoint's (``quantizer.*``, ``decoder.*``)."""

    def __init__(self, config: SNACConfig) -> None:
        super().__init__()
        self.config = config
        self.quantizer = ResidualVectorQuantizer(config)
        self.decoder = Decoder(config)
        self.requires_grad_(False)
        self.eval()

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @property
    def vq_strides(self) -> tuple[int, ...]:
        return self.config.vq_strides

    @property
    def sampling_rate(self) -> int:
        return self.config.sampling_rate

    @property
    def frame_samples(self) -> int:
        """Audio samples per code of the coarsest level (2048 for snac_24khz: one Orpheus frame)."""
        return self.hop_length * self.vq_strides[0]

    def _check_codes(self, codes: list[torch.Tensor], seeds: list[int]) -> None:
        levels = len(self.vq_strides)
        if len(codes) != levels:
            raise ValueError(f"SNAC decode: expected {levels} code levels, got {len(codes)}")
        batch = codes[0].shape[0] if codes[0].dim() == 2 else None
        latent_steps = None
        for i, (level, stride) in enumerate(zip(codes, self.vq_strides)):
            if level.dim() != 2 or level.dtype != torch.int64 or level.shape[0] != batch:
                raise ValueError(f"SNAC decode: codes[{i}] must be int64 [B, T] with the B of codes[0], "
                                 f"got {level.dtype} {list(level.shape)}")
            steps = level.shape[1] * stride
            if latent_steps is None:
                latent_steps = steps
            elif steps != latent_steps:
                raise ValueError(f"SNAC decode: codes[{i}] has {level.shape[1]} steps; with stride {stride} "
                                 f"that is {steps} latent steps, codes[0] gives {latent_steps}")
            # an out-of-range index on CUDA is a device-side assert that kills the context
            if level.numel() and (int(level.min()) < 0 or int(level.max()) >= self.config.codebook_size):
                raise ValueError(f"SNAC decode: codes[{i}] outside [0, {self.config.codebook_size})")
        if len(seeds) != batch:
            raise ValueError(f"SNAC decode: {len(seeds)} seeds for {batch} rows")

    @torch.inference_mode()
    def decode(self, codes: list[torch.Tensor], seeds: list[int]) -> torch.Tensor:
        """Codes ``[B, T_i]`` (int64, one tensor per level) to audio ``[B, 1, samples]``.

        ``seeds[b]`` seeds row ``b``'s NoiseBlock noise (see the module docstring)."""
        self._check_codes(codes, seeds)
        generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        z_q = self.quantizer.from_codes(codes)
        return self.decoder(z_q, generators)


# ----------------------------------------------------------------------------- loading

_PARAMETRIZED = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
_LEGACY = (".weight_g", ".weight_v")


def _fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace each weight-normed pair (magnitude g, direction v) by the plain ``weight``.

    Both forms of the released files are accepted: ``weight_g``/``weight_v`` (torch's older
    ``nn.utils.weight_norm``) and ``parametrizations.weight.original0``/``original1`` (what
    ``snac`` itself saves under current torch). ``torch._weight_norm`` is the op the reference's
    parametrization calls, ``v * (g / ||v||)`` with the norm over all dims but 0; the fused CPU
    kernel differs from the same formula spelled in tensor ops by about one ulp, so calling it
    keeps the folded weights bit-equal to the reference's."""
    folded: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        for g_suffix, v_suffix in (_PARAMETRIZED, _LEGACY):
            if key.endswith(g_suffix) or key.endswith(v_suffix):
                suffix = g_suffix if key.endswith(g_suffix) else v_suffix
                module = key[: -len(suffix)]
                pair = pairs.setdefault(module, {})
                role = "g" if suffix == g_suffix else "v"
                if role in pair or f"{module}.weight" in state:
                    raise ValueError(f"SNAC checkpoint: {module} holds its weight in more than one form")
                pair[role] = tensor
                break
        else:
            folded[key] = tensor
    for module, pair in pairs.items():
        if set(pair) != {"g", "v"}:
            missing = "magnitude (weight_g / original0)" if "g" not in pair else "direction (weight_v / original1)"
            raise ValueError(f"SNAC checkpoint: {module} lacks its weight-norm {missing}")
        g, v = pair["g"].float(), pair["v"].float()
        if g.shape != (v.shape[0],) + (1,) * (v.dim() - 1):
            raise ValueError(f"SNAC checkpoint: {module} weight-norm magnitude has shape {list(g.shape)}, "
                             f"expected {[v.shape[0]] + [1] * (v.dim() - 1)} for direction {list(v.shape)}")
        folded[f"{module}.weight"] = torch._weight_norm(v, g, 0)
    return folded


def _is_ignored(key: str) -> bool:
    """The encoder and the quantizers' input projections only serve encoding."""
    if key.startswith("encoder."):
        return True
    parts = key.split(".")
    return key.startswith("quantizer.quantizers.") and len(parts) > 3 and parts[3] == "in_proj"


def load_snac(path: str | Path, device: str | torch.device = "cpu") -> SNACDecoder:
    """Load a SNAC folder (``config.json`` + ``pytorch_model.bin``) as a Float32 decoder.

    Missing or unexpected decoder / quantizer tensors and shape mismatches are ``ValueError``s
    that name the tensor."""
    folder = Path(path)
    config = SNACConfig.from_json(folder / "config.json")
    state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"SNAC checkpoint {folder / 'pytorch_model.bin'}: expected a state dict")
    state = {key: tensor for key, tensor in _fold_weight_norm(state).items() if not _is_ignored(key)}

    model = SNACDecoder(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"SNAC checkpoint {folder}: missing tensor {missing[0]}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise ValueError(f"SNAC checkpoint {folder}: unexpected tensor {unexpected[0]}"
                         + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(f"SNAC checkpoint {folder}: {key} has shape {list(tensor.shape)}, "
                             f"the config implies {list(expected[key].shape)}")
    model.load_state_dict({key: tensor.float() for key, tensor in state.items()})
    return model.to(device)


# ----------------------------------------------------------------------------- noise seeds

_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def window_noise_seed(request_seed: int, window_index: int) -> int:
    """The NoiseBlock seed of one codec window of one request, in ``[0, 2**63)``.

    Two rounds of splitmix64 (request seed, then window index) so that neighbouring requests and
    windows get unrelated seeds; the top bit is dropped so that a seed fits a signed int64 (a
    Triton INT64 tensor, a numpy int64) unchanged."""
    mixed = _splitmix64(_splitmix64(request_seed & _MASK64) ^ (window_index & _MASK64))
    return mixed >> 1
