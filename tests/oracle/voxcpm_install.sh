#!/usr/bin/env bash
# The reference VoxCPM2 (voxcpm==2.0.3) in its own venv, used only as a test oracle.
# --no-deps: voxcpm's own requirements pull its web UI (gradio), ASR (funasr), modelscope and
# datasets; inference imports only torch, torchaudio, transformers (the tokenizer class),
# huggingface_hub (its package __init__), pydantic, einops, librosa, tqdm and safetensors.
# Bump the stamp whenever a package is added, so that existing venvs get the addition.
set -euo pipefail
cd "$(dirname "$0")/../.."
V=.venv-voxcpm-oracle
STAMP=$V/.installed-v1
[ -f "$STAMP" ] && exit 0
PY=${PYTHON:-python3}
[ -x $V/bin/python ] || $PY -m venv $V
$V/bin/pip install -q --upgrade "pip==25.3"
$V/bin/pip install -q torch==2.13.0 numpy==1.26.4 transformers==4.57.3 pydantic==2.14.4 \
  einops==0.8.1 librosa==0.11.0 tqdm==4.70.1 safetensors==0.8.0 soundfile==0.14.0 soxr==1.1.0
$V/bin/pip install -q --no-deps voxcpm==2.0.3 torchaudio==2.11.1
# torchaudio's compiled parts link CUDA; the reference only needs its pure-Python pieces
rm -f $V/lib/python3*/site-packages/torchaudio/lib/*.so
$V/bin/python -c "from voxcpm.model.voxcpm2 import VoxCPM2Model; import voxcpm
print('[voxcpm-oracle] voxcpm', voxcpm.__file__)"
touch "$STAMP"
