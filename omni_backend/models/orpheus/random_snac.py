"""Random SNAC codec checkpoints in the released ``hubertsiuzdak/snac_24khz`` folder layout.

:func:`write_random_snac` writes ``config.json`` and ``pytorch_model.bin`` holding every tensor
of the reference ``snac.SNAC(**config).state_dict()`` (encoder, quantizer and decoder), keyed
and shaped as ``snac==1.2.1`` keys them under current torch: weight-normed convolutions as
``parametrizations.weight.original0`` (magnitude, ``[dim0, 1, 1]``) and ``original1``
(direction), or, with ``legacy_weight_norm=True``, as ``weight_g`` / ``weight_v`` (torch's older
``nn.utils.weight_norm``, the form of older saved files). So the reference package loads the
folder with ``SNAC.from_pretrained(folder)`` and :func:`~omni_backend.models.orpheus.snac.load_snac`
loads its decoder part. No ``snac`` import: the names and shapes are enumerated here from the
configuration, and ``tests/unit/test_snac.py`` proves them through the reference's strict load.

The released model's time structure is kept (``encoder_rates`` [2, 4, 8, 8], ``decoder_rates``
[8, 8, 4, 2], ``vq_strides`` [4, 2, 1], 4096 codes per level: 2048 samples per coarse code, the
Orpheus frame) and only the widths shrink, so decoding four frames takes milliseconds.

Weights are random with fan-in scaling: each weight-normed conv gets a magnitude that makes its
effective weight about ``randn / sqrt(fan_in)``, the residual units' closing 1x1 conv is damped
so that the stacked residual units do not blow up, the quantizer's ``out_proj`` and the last
conv are damped so that the output stays mostly inside tanh's linear range (std ~0.3, not
clipped at +-1, where differences would vanish), and Snake's ``alpha`` stays near 1. Each
tensor is drawn from its own generator seeded from ``seed`` and the tensor name, so a folder is
a pure function of its arguments.

CLI: ``python -m omni_backend.models.orpheus.random_snac OUT [--seed N] [--size tiny|small]``.
"""

from __future__ import annotations

import argparse
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "SNAC_SIZES",
    "SNACTensorSpec",
    "random_snac_state_dict",
    "snac_config",
    "snac_tensor_specs",
    "write_random_snac",
]

# Widths per size; everything else follows the released 24 kHz model.
SNAC_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"encoder_dim": 2, "decoder_dim": 32},   # latent_dim 32
    "small": {"encoder_dim": 4, "decoder_dim": 64},  # latent_dim 64
}

_RESIDUAL_OUT_GAIN = 0.3  # damping of each residual unit's closing 1x1 conv
_NOISE_GAIN = 0.5         # NoiseBlock's 1x1 conv: audible in the output, not dominant
_LATENT_GAIN = 0.3        # quantizer out_proj: three levels summed give latents of std ~0.5
_OUTPUT_GAIN = 0.1        # last conv: the decoder grows its input ~4x; keep tanh out of saturation


def snac_config(*, encoder_dim: int = 2, decoder_dim: int = 32, codebook_dim: int = 8,
                depthwise: bool = True, noise: bool = True) -> dict:
    """A ``config.json`` with the released 24 kHz time structure and the given widths."""
    if decoder_dim % 16:
        raise ValueError(f"decoder_dim={decoder_dim} must be divisible by 16 (four upsampling blocks halve it)")
    return {
        "sampling_rate": 24000,
        "encoder_dim": encoder_dim,
        "encoder_rates": [2, 4, 8, 8],
        "decoder_dim": decoder_dim,
        "decoder_rates": [8, 8, 4, 2],
        "attn_window_size": None,
        "codebook_size": 4096,
        "codebook_dim": codebook_dim,
        "vq_strides": [4, 2, 1],
        "noise": noise,
        "depthwise": depthwise,
    }


@dataclass(frozen=True)
class SNACTensorSpec:
    """One state-dict entry. ``kind``: ``wn_g`` / ``wn_v`` (weight norm magnitude / direction),
    ``bias``, ``alpha`` (Snake) or ``codebook``; ``magnitude`` is the typical value of a ``wn_g``
    entry (the norm of one dim-0 slice of the effective weight)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    magnitude: float = 1.0


class _Specs:
    """Collects specs in the reference's module order (the order of its state_dict)."""

    def __init__(self, legacy_weight_norm: bool) -> None:
        self.specs: list[SNACTensorSpec] = []
        self.legacy = legacy_weight_norm

    def conv(self, name: str, c_in: int, c_out: int, kernel: int, *, groups: int = 1, bias: bool = True,
             gain: float = 1.0) -> None:
        if bias:
            self.specs.append(SNACTensorSpec(f"{name}.bias", (c_out,), "bias"))
        self._weight_norm(name, (c_out, c_in // groups, kernel), fan_in=c_in // groups * kernel, gain=gain)

    def conv_transpose(self, name: str, c_in: int, c_out: int, stride: int) -> None:
        self.specs.append(SNACTensorSpec(f"{name}.bias", (c_out,), "bias"))
        # each output sample sums c_in channels times kernel / stride taps
        self._weight_norm(name, (c_in, c_out, 2 * stride), fan_in=c_in * 2, gain=1.0)

    def _weight_norm(self, name: str, shape: tuple[int, ...], *, fan_in: int, gain: float) -> None:
        # g and v are registered in this order by both torch weight-norm implementations
        g_key, v_key = (("weight_g", "weight_v") if self.legacy
                        else ("parametrizations.weight.original0", "parametrizations.weight.original1"))
        # effective elements ~ gain / sqrt(fan_in); a dim-0 slice holds prod(shape[1:]) of them
        magnitude = gain * math.sqrt(math.prod(shape[1:]) / fan_in)
        self.specs.append(SNACTensorSpec(f"{name}.{g_key}", (shape[0], 1, 1), "wn_g", magnitude))
        self.specs.append(SNACTensorSpec(f"{name}.{v_key}", shape, "wn_v"))

    def snake(self, name: str, channels: int) -> None:
        self.specs.append(SNACTensorSpec(f"{name}.alpha", (1, channels, 1), "alpha"))

    def residual_unit(self, name: str, dim: int, groups: int) -> None:
        self.snake(f"{name}.block.0", dim)
        self.conv(f"{name}.block.1", dim, dim, 7, groups=groups)
        self.snake(f"{name}.block.2", dim)
        self.conv(f"{name}.block.3", dim, dim, 1, gain=_RESIDUAL_OUT_GAIN)


def snac_tensor_specs(config: dict, *, legacy_weight_norm: bool = False) -> list[SNACTensorSpec]:
    """Every tensor of ``snac.SNAC(**config).state_dict()`` (attention-free configs only)."""
    if config.get("attn_window_size") is not None:
        raise ValueError("attn_window_size must be null: the LocalMHA tensors are not enumerated here")
    depthwise, d = config["depthwise"], config["encoder_dim"]
    s = _Specs(legacy_weight_norm)

    s.conv("encoder.block.0", 1, d, 7)
    for i, stride in enumerate(config["encoder_rates"], start=1):
        c_in, d = d, d * 2
        groups = d // 2 if depthwise else 1
        for j in range(3):
            s.residual_unit(f"encoder.block.{i}.block.{j}", c_in, groups)
        s.snake(f"encoder.block.{i}.block.3", c_in)
        s.conv(f"encoder.block.{i}.block.4", c_in, d, 2 * stride)
    s.conv(f"encoder.block.{len(config['encoder_rates']) + 1}", d, d, 7, groups=d if depthwise else 1)

    latent = config.get("latent_dim") or d
    for i in range(len(config["vq_strides"])):
        q = f"quantizer.quantizers.{i}"
        s.conv(f"{q}.in_proj", latent, config["codebook_dim"], 1)
        s.conv(f"{q}.out_proj", config["codebook_dim"], latent, 1, gain=_LATENT_GAIN)
        s.specs.append(SNACTensorSpec(f"{q}.codebook.weight", (config["codebook_size"], config["codebook_dim"]),
                                      "codebook"))

    channels = config["decoder_dim"]
    if depthwise:
        s.conv("decoder.model.0", latent, latent, 7, groups=latent)
        s.conv("decoder.model.1", latent, channels, 1)
        index = 2
    else:
        s.conv("decoder.model.0", latent, channels, 7)
        index = 1
    out_dim = channels
    for i, stride in enumerate(config["decoder_rates"]):
        in_dim, out_dim = channels // 2 ** i, channels // 2 ** (i + 1)
        block = f"decoder.model.{index}.block"
        s.snake(f"{block}.0", in_dim)
        s.conv_transpose(f"{block}.1", in_dim, out_dim, stride)
        j = 2
        if config["noise"]:
            s.conv(f"{block}.2.linear", out_dim, out_dim, 1, bias=False, gain=_NOISE_GAIN)
            j = 3
        for k in range(3):
            s.residual_unit(f"{block}.{j + k}", out_dim, out_dim if depthwise else 1)
        index += 1
    s.snake(f"decoder.model.{index}", out_dim)
    s.conv(f"decoder.model.{index + 1}", out_dim, 1, 7, gain=_OUTPUT_GAIN)
    return s.specs


def _random_tensor(spec: SNACTensorSpec, seed: int) -> torch.Tensor:
    # seeded by the parametrizations-form name, so both weight-norm key forms hold the same values
    canonical = (spec.name.replace(".weight_g", ".parametrizations.weight.original0")
                 .replace(".weight_v", ".parametrizations.weight.original1"))
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(canonical.encode())) % 2**63)
    if spec.kind == "wn_v":
        return torch.randn(spec.shape, generator=generator)
    if spec.kind == "wn_g":
        return torch.empty(spec.shape).uniform_(0.8, 1.2, generator=generator) * spec.magnitude
    if spec.kind == "bias":
        return 0.05 * torch.randn(spec.shape, generator=generator)
    if spec.kind == "alpha":
        return torch.empty(spec.shape).uniform_(0.7, 1.3, generator=generator)
    if spec.kind == "codebook":
        return torch.randn(spec.shape, generator=generator)
    raise AssertionError(spec.kind)


def random_snac_state_dict(config: dict, *, seed: int = 0, legacy_weight_norm: bool = False
                           ) -> dict[str, torch.Tensor]:
    """The random tensors of :func:`write_random_snac`, in the reference's key order."""
    specs = snac_tensor_specs(config, legacy_weight_norm=legacy_weight_norm)
    return {spec.name: _random_tensor(spec, seed) for spec in specs}


def write_random_snac(out_dir: str | Path, *, encoder_dim: int = 2, decoder_dim: int = 32,
                      codebook_dim: int = 8, depthwise: bool = True, noise: bool = True, seed: int = 0,
                      legacy_weight_norm: bool = False) -> Path:
    """Write ``config.json`` and ``pytorch_model.bin`` of a random SNAC into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = snac_config(encoder_dim=encoder_dim, decoder_dim=decoder_dim, codebook_dim=codebook_dim,
                         depthwise=depthwise, noise=noise)
    state = random_snac_state_dict(config, seed=seed, legacy_weight_norm=legacy_weight_norm)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    torch.save(state, out / "pytorch_model.bin")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to write config.json and pytorch_model.bin into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(SNAC_SIZES), default="tiny")
    parser.add_argument("--legacy-weight-norm", action="store_true",
                        help="key weight norm as weight_g / weight_v instead of parametrizations.weight.*")
    args = parser.parse_args(argv)
    path = write_random_snac(args.out, seed=args.seed, legacy_weight_norm=args.legacy_weight_norm,
                             **SNAC_SIZES[args.size])
    print(path)


if __name__ == "__main__":
    main()
