"""A model repository for tests and benchmarks that kill or stop a server under streams: the
committed models of the pipelines asked for, with the tiny Qwen3-TTS built anew from its deploy
YAML so that eos is held back (``min_new_tokens``) for its first ``eos_after`` frames.

Random weights do emit eos now and then, sampled or greedy, so a stream that must still be running
when something is killed needs eos held back; a request's own ``max_new_tokens`` still ends it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

__all__ = ["QWEN", "repository"]

ROOT = Path(__file__).resolve().parents[2]
QWEN = "qwen3_tts_tiny_random"


def repository(out: Path, pipelines: list[str], eos_after: int, talker: dict | None = None) -> Path:
    """Write the models of `pipelines` under `out` (a new folder; the tiny model's deploy YAML goes
    beside it: the repository folder holds models only; `talker`: deploy keys for its stage 0);
    returns `out`."""
    from ensemble_builder.build import build

    out.mkdir(parents=True)
    for model in (ROOT / "model_repository").iterdir():
        pipeline = model.name.split("__")[0]
        if pipeline in pipelines and pipeline != QWEN:
            shutil.copytree(model, out / model.name, ignore=shutil.ignore_patterns("__pycache__"))
    if QWEN in pipelines:
        deploy = yaml.safe_load((ROOT / "deploy" / f"{QWEN}.yaml").read_text())
        deploy["stages"][0].setdefault("default_sampling_params", {})["min_new_tokens"] = eos_after
        deploy["stages"][0].update(talker or {})
        path = out.parent / f"{QWEN}.long_streams.yaml"
        path.write_text(yaml.safe_dump(deploy))
        build(QWEN, out, path)
    return out
