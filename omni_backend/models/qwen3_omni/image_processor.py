"""Images -> the vision encoder's patches, as the checkpoint's image processor makes them
(``preprocessor_config.json``: ``patch_size``, ``merge_size``, ``temporal_patch_size``,
``min_pixels`` / ``max_pixels``, ``image_mean`` / ``image_std``, ``rescale_factor``, ``resample``).

The steps are transformers 5's ``Qwen2VLImageProcessorPil`` (the processor's PIL backend): RGB
(transparency composited onto white), resized with PIL to the nearest multiple of
``patch_size * merge_size`` on each side whose area lies within ``[min_pixels, max_pixels]``
(``smart_resize``), rescaled in float64 then cast to float32, normalised per channel, and cut into
``patch_size`` squares in merge-block order, each repeated over ``temporal_patch_size`` frames.
One image is grid ``(1, h / patch, w / patch)`` and ``h * w / patch^2 / merge^2`` placeholder tokens.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

__all__ = ["ImageProcessor", "ProcessedImage", "smart_resize"]


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The processor's target size: both sides multiples of ``factor``, area within the bounds,
    aspect ratio kept as closely as possible. A ratio over 200 is a ValueError."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ProcessedImage:
    pixels: np.ndarray          # float32 [patches, C * temporal * patch * patch]
    grid: tuple[int, int, int]  # (t, h, w) in patches

    def tokens(self, merge_size: int) -> int:
        t, h, w = self.grid
        return t * h * w // (merge_size * merge_size)


@dataclass(frozen=True)
class ImageProcessor:
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 3   # PIL's BICUBIC

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "preprocessor_config.json: ") -> "ImageProcessor":
        d = cls
        size = raw.get("size") or {}
        for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
            if raw.get(key, True) is not True:
                raise ValueError(f"{where}{key}: only true is supported (the released processor's setting)")
        return cls(patch_size=int(raw.get("patch_size", d.patch_size)),
                   merge_size=int(raw.get("merge_size", d.merge_size)),
                   temporal_patch_size=int(raw.get("temporal_patch_size", d.temporal_patch_size)),
                   min_pixels=int(raw.get("min_pixels", size.get("shortest_edge", d.min_pixels))),
                   max_pixels=int(raw.get("max_pixels", size.get("longest_edge", d.max_pixels))),
                   image_mean=tuple(float(x) for x in raw.get("image_mean", d.image_mean)),
                   image_std=tuple(float(x) for x in raw.get("image_std", d.image_std)),
                   rescale_factor=float(raw.get("rescale_factor", d.rescale_factor)),
                   resample=int(raw.get("resample", d.resample)))

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str) -> "ImageProcessor":
        path = os.path.join(checkpoint_dir, "preprocessor_config.json")
        if not os.path.isfile(path):
            return cls()
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        return smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)

    def __call__(self, image) -> ProcessedImage:
        """A PIL image -> its patches and grid."""
        from PIL import Image

        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, rgba).convert("RGB")
        else:
            image = image.convert("RGB")
        height, width = self.target_size(image.height, image.width)
        resized = np.array(image.resize((width, height), resample=self.resample))      # [H, W, C] uint8
        x = (np.moveaxis(resized, -1, 0).astype(np.float64) * self.rescale_factor).astype(np.float32)
        mean = np.array(self.image_mean, dtype=np.float32)
        std = np.array(self.image_std, dtype=np.float32)
        x = ((x.T - mean) / std).T
        return ProcessedImage(*self._patchify(x))

    def _patchify(self, image: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        channels, height, width = image.shape
        gh, gw = height // p, width // p
        patches = image.reshape(channels, gh // m, m, p, gw // m, m, p)
        patches = np.transpose(patches, (1, 4, 2, 5, 0, 3, 6))
        patches = np.broadcast_to(patches[:, :, :, :, :, None, :, :], (*patches.shape[:5], t, *patches.shape[5:]))
        return np.ascontiguousarray(patches.reshape(gh * gw, channels * t * p * p), dtype=np.float32), (1, gh, gw)
