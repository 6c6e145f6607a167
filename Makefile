# SPDX-License-Identifier: Apache-2.0
# Two entry points (README quick start):  `make demo`  and  `make test`.
PY     ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.edgesdk-installed
# llama.cpp built natively on AMX-capable Xeons segfaults inside llama_decode: build portable kernels.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: an unpinned resolve pulls a multi-GB CUDA build (docs/versions.md)
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[all,dev]'
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/python examples/minilm/demo.py

test: setup
	$(BIN)/edgesdk check licenses . --summary
	$(BIN)/python -m pytest -q -ra

lint: setup
	$(BIN)/ruff check edgesdk tests tools examples

clean:
	rm -rf $(VENV) out build *.egg-info
