"""Reference SNAC decodes for the parity tests, from the ``snac==1.2.1`` package itself.

Runs in the oracle venv (``tests/oracle/install.sh``)::

    .venv-oracle/bin/python tests/oracle/snac_reference.py CHECKPOINT_DIR INPUT OUTPUT.npz \
        [CHECKPOINT_DIR INPUT OUTPUT.npz ...] [--threads N]

Several triples share one start of the interpreter (importing torch is most of a run's time).
Each ``CHECKPOINT_DIR`` is loaded with ``SNAC.from_pretrained`` (strict ``load_state_dict``, so it
also proves a folder's tensor names and shapes). ``INPUT`` holds named cases, each a list of
code levels ``[B, T_i]`` and one seed per row:

* JSON: ``{"cases": {"NAME": {"codes": [level0, level1, ...], "seeds": [s0, ...]}}}``
* .npz: arrays ``NAME/codes_0``, ``NAME/codes_1``, ... and ``NAME/seeds``.

``OUTPUT`` gets one array per case, ``NAME``: ``SNAC.decode`` output, float32 ``[B, 1, samples]``.

The package's NoiseBlock draws ``torch.randn((B, 1, T))`` from the global generator. Here the
name ``torch`` inside ``snac.layers`` is swapped for a proxy whose ``randn`` draws row ``b`` from
``torch.Generator().manual_seed(seeds[b])``, one generator per row and decode call, used by the
NoiseBlocks in forward order: the noise our decoder draws for that row. Nothing else of the
package changes (its jit-scripted Snake was compiled at import and does not see the proxy).
Do not import ``orpheus_tts`` here: its package ``__init__`` imports vllm and downloads SNAC.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch


class _SeededTorch:
    """Stands in for ``torch`` inside ``snac.layers``: ``randn`` of shape ``(B, 1, T)`` draws
    each row from that row's generator; every other attribute is torch's own."""

    def __init__(self) -> None:
        self.generators: list[torch.Generator] | None = None

    def randn(self, *size: Any, device: Any = None, dtype: Any = None, **kwargs: Any) -> torch.Tensor:
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        if kwargs or len(shape) != 3 or shape[1] != 1:
            raise AssertionError(f"unexpected randn call in snac.layers: {size} {kwargs}")
        if self.generators is None or len(self.generators) != shape[0]:
            raise AssertionError(f"randn for {shape[0]} rows outside a seeded decode")
        rows = [torch.randn((1, 1, shape[2]), generator=g) for g in self.generators]
        return torch.cat(rows).to(device=device, dtype=dtype)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _read_cases(path: Path) -> dict[str, dict[str, Any]]:
    if path.suffix == ".json":
        raw = json.loads(path.read_text(encoding="utf-8"))["cases"]
        return {name: {"codes": [np.asarray(level, dtype=np.int64) for level in case["codes"]],
                       "seeds": [int(s) for s in case["seeds"]]} for name, case in raw.items()}
    cases: dict[str, dict[str, Any]] = {}
    with np.load(path) as data:
        for key in data.files:
            name, field = key.rsplit("/", 1)
            case = cases.setdefault(name, {"levels": {}, "seeds": None})
            if field == "seeds":
                case["seeds"] = [int(s) for s in data[key]]
            else:
                case["levels"][int(field.removeprefix("codes_"))] = data[key].astype(np.int64)
    return {name: {"codes": [case["levels"][i] for i in sorted(case["levels"])], "seeds": case["seeds"]}
            for name, case in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description="reference SNAC decodes with seeded NoiseBlock noise")
    parser.add_argument("jobs", nargs="+", metavar="CHECKPOINT_DIR INPUT OUTPUT",
                        help="one or more triples: a SNAC folder, its .json / .npz cases, the .npz to write")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if len(args.jobs) % 3:
        parser.error("arguments come in triples: CHECKPOINT_DIR INPUT OUTPUT")
    torch.set_num_threads(args.threads)

    import snac.layers
    from snac import SNAC

    seeded = _SeededTorch()
    snac.layers.torch = seeded
    for checkpoint, input_path, output_path in zip(*[iter(args.jobs)] * 3):
        model = SNAC.from_pretrained(checkpoint).eval()
        outputs: dict[str, np.ndarray] = {}
        for name, case in _read_cases(Path(input_path)).items():
            codes = [torch.from_numpy(level) for level in case["codes"]]
            seeded.generators = [torch.Generator().manual_seed(seed) for seed in case["seeds"]]
            with torch.inference_mode():
                outputs[name] = model.decode(codes).numpy().astype(np.float32)
            seeded.generators = None
        np.savez(output_path, **outputs)
        print(f"[snac oracle] {len(outputs)} cases from {checkpoint}", file=sys.stderr)


if __name__ == "__main__":
    main()
