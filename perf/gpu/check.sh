#!/usr/bin/env bash
# GPU check of the Qwen3-TTS pipeline, after the Orpheus vLLM, Qwen3-Omni and VoxCPM2 checks (see perf/gpu/README.md).
# Run from anywhere:
#   perf/gpu/check.sh              # NVIDIA GPU + torch: parity, memory, in-process (+ served) benchmark
#   perf/gpu/check.sh --dry-run    # CPU, tiny shapes: checks the script logic
# Extra arguments go to perf/gpu/check.py. Python: $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x .venv/bin/python ]] && .venv/bin/python -c 'import torch' 2>/dev/null; then PY=.venv/bin/python
else PY=python3; fi
if [[ " $* " != *" --dry-run "* ]]; then
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The Orpheus vLLM check first (seconds when vLLM is not importable: it says so), bounded so the
# Qwen3-TTS check keeps most of the time. --dry-run / --no-results / --results FILE apply to both.
orpheus_args=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --dry-run|--no-results) orpheus_args+=("${args[i]}") ;;
    --results) orpheus_args+=("--results" "${args[i+1]:-}") ;;
  esac
done
start=$SECONDS
if [[ "${ORPHEUS_CHECK:-1}" != 0 ]]; then
  timeout "${ORPHEUS_TIMEOUT:-150}" "$PY" perf/gpu/orpheus_check.py "${orpheus_args[@]}" || echo "orpheus check: exit $?"
fi
# The Qwen3-Omni check (released 30B-A3B shape made in GPU memory; throughput mode, CUDA graphs), bounded
# like the Orpheus one; it takes the same report arguments.
if [[ "${OMNI_CHECK:-1}" != 0 ]]; then
  timeout "${OMNI_TIMEOUT:-180}" "$PY" perf/gpu/omni_check.py "${orpheus_args[@]}" || echo "omni check: exit $?"
fi
# The VoxCPM2 check (released LM sizes made in GPU memory; the step with its side module on CUDA
# graphs vs eager, and its throughput), bounded like the others; it takes the same report arguments.
if [[ "${VOXCPM2_CHECK:-1}" != 0 ]]; then
  timeout "${VOXCPM2_TIMEOUT:-120}" "$PY" perf/gpu/voxcpm2_check.py "${orpheus_args[@]}" || echo "voxcpm2 check: exit $?"
fi
# The frame step's profile (torch.profiler over the 1.7B-shaped step at c = 1: kernels per frame, time per
# kernel; perf/gpu/frame_profile.py), bounded like the others; it takes the same report arguments.
if [[ "${FRAME_PROFILE:-1}" != 0 ]]; then
  timeout "${FRAME_PROFILE_TIMEOUT:-120}" "$PY" perf/gpu/frame_profile.py "${orpheus_args[@]}" || echo "frame profile: exit $?"
fi
# The torch.compile'd frame step's time beside the uncompiled one's (talker option compile): opt in with
# FRAME_COMPILE=default (or max-autotune-no-cudagraphs); its 4 variants compile at load (minutes at 1.7B).
if [[ -n "${FRAME_COMPILE:-}" ]]; then
  compile_args=(--compile "$FRAME_COMPILE")
  [[ " $* " == *" --dry-run "* ]] && compile_args+=(--compile-backend aot_eager)   # no inductor C++ build on CPU
  timeout "${FRAME_COMPILE_TIMEOUT:-300}" "$PY" perf/gpu/frame_profile.py "${compile_args[@]}" "${orpheus_args[@]}" \
    || echo "compiled frame step: exit $?"
fi
# sized for < 8 minutes on an H200; the guard (SIGTERM at 540 s in all, under a 600 s command
# limit) still lets check.py write the report of what it measured
left=$(( ${CHECK_TIMEOUT:-540} - (SECONDS - start) ))
if (( left < 60 )); then
  # the parts above took the budget: say so rather than start a check that cannot finish
  echo "qwen3-tts check: not run, ${left} s left of CHECK_TIMEOUT (skip parts above with ORPHEUS_CHECK=0, OMNI_CHECK=0, VOXCPM2_CHECK=0, FRAME_PROFILE=0)"
  exit 3
fi
exec timeout "$left" "$PY" perf/gpu/check.py "$@"
