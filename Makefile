# The verbs people type. Everything installs into .venv on first use (idempotent).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MLREG := $(VENV)/bin/mlreg
STAMP := $(VENV)/.mlreg-installed
export TF_CPP_MIN_LOG_LEVEL := 3

.PHONY: install test unit integration demo lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	set -o pipefail; $(PY) -m pip install --quiet --disable-pip-version-check -e '.[all,dev]' 2>&1 \
		| { grep -v '^WARNING: Location' || true; }
	$(PY) -c "import registry, pipelines, tensorflow, tf2onnx, onnxruntime, pytriton, tritonclient.grpc"
	touch $(STAMP)

test: install
	$(VENV)/bin/ruff check registry pipelines tests benchmarks model_repository_template infra
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

unit: install
	$(VENV)/bin/pytest tests/unit

integration: install
	$(VENV)/bin/pytest tests/integration

lint: install
	$(VENV)/bin/ruff check registry pipelines tests benchmarks model_repository_template infra
	$(VENV)/bin/mypy

# Export the template's models, serve the ensemble on the local Triton, send the seed's request.
demo: install
	@set -e; \
	$(MLREG) stack down >/dev/null; \
	trap '$(MLREG) stack down' EXIT; \
	echo "== exporting the template into .mlreg/model_repository"; \
	$(MLREG) template build .mlreg/model_repository --force; \
	echo "== starting the local Triton and loading the ensemble"; \
	$(MLREG) stack up --load ensemble_multi_modal_model; \
	url=$$($(MLREG) stack status --json | $(PY) -c "import json,sys; print(json.load(sys.stdin)['grpc_url'])"); \
	echo "== the seed's request (table 1, 2 + the golden JPEG) to ensemble_multi_modal_model"; \
	$(PY) model_repository_template/multi_modal_client.py --url $$url

bench: install
	$(PY) benchmarks/serve_ensemble.py

clean:
	-$(MLREG) stack down
	rm -rf .mlreg
