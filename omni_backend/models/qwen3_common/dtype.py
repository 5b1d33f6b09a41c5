"""The dtype a Qwen3 checkpoint is loaded in, by name (``float32``, ``bf16`` ...) or as a torch dtype."""
from __future__ import annotations

import torch

__all__ = ["parse_dtype"]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype: unknown {dtype!r}; known: {', '.join(sorted(_DTYPES))}") from None
