# The verbs people type. Everything installs into .venv on first use (idempotent).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MLREG := $(VENV)/bin/mlreg
STAMP := $(VENV)/.mlreg-installed
export TF_CPP_MIN_LOG_LEVEL := 3

.PHONY: install system-deps static test unit component integration demo lint bench clean mutants

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	bash .ci/install.sh $(VENV)
	$(PY) .ci/bytecode.py  # what mlreg needs imports; the bytecode of what its processes import, written once
	touch $(STAMP)

# Debian packages the tests need (PostgreSQL, kubectl, Chromium, gcc): installed when missing.
system-deps:
	bash .ci/system-deps.sh

# The suite on three pytest-xdist workers, a test module per worker at a time (its module-scoped stack
# stays on one worker; the session's template build is shared through a lock: tests/conftest.py).
# Three on CI's two cores: a module waits on its servers (loads, lease expiries, restarts) a quarter
# of its time, and two workers left the cores ~25 % idle (the clean-clone run of fbc220c: 35.6 min of
# CPU in 23.5 min); measured on 2 cores: 13.0 min with two workers against 22.7 min in one process.
# PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
# mypy's cache lives outside the clone, so a clean clone (CI) does not re-check every dependency: measured
# on 2 cores, a fresh clone with a fresh .venv: 63 s cold against 6.7 s with this cache (mypy re-hashes
# every source, so a stale entry is never trusted).
MYPY_CACHE ?= $(HOME)/.cache/mlreg-mypy
MYPY := $(VENV)/bin/mypy --cache-dir $(MYPY_CACHE)

# The static checks run beside the suite, not before it: they use one core for about a minute
# (mypy cold ~63 s) while the suite's workers wait on their servers a quarter of the time; their
# output is printed after the suite's, and either failing fails `make test`.  No test reads what
# they write.  PYTEST_ARGS: a subset (say, tests/unit/test_docs.py) when trying this recipe.
PYTEST_ARGS ?=
test: install system-deps
	@static=$$(mktemp); \
	$(MAKE) --no-print-directory static > "$$static" 2>&1 & checks=$$!; \
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS); suite=$$?; \
	wait $$checks; lint=$$?; \
	echo "== static checks (ruff, mypy, mkdocs): exit $$lint"; cat "$$static"; rm -f "$$static"; \
	if [ $$suite -ne 0 ] || [ $$lint -ne 0 ]; then echo "make test: pytest exit $$suite, static checks exit $$lint"; exit 1; fi

static: install
	$(VENV)/bin/ruff format --check mlreg registry pipelines tests benchmarks model_repository_template infra
	$(VENV)/bin/ruff check mlreg registry pipelines tests benchmarks model_repository_template infra
	$(MYPY)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -f docs/mkdocs.yml  # docs/build/site; the CLI reference made from the commands

# The in-process tier: a test that starts a process fails (tests/unit/conftest.py); ~9 s here, idle.
unit: install
	$(VENV)/bin/pytest tests/unit

# The tests that start local processes or wait for seconds (tests/component/conftest.py), on two
# pytest-xdist workers (~2 min here; COMPONENT_WORKERS=0: one process).  `make test` runs them on
# its three.  d39b954 saw `pytest -n 2 tests/unit` (these modules then) fail 68 tests at load ~25
# on a clone where one process failed 8; not seen since, at the loads of this machine and CI.
COMPONENT_WORKERS ?= 2
component: install
	$(VENV)/bin/pytest $(if $(filter 0,$(COMPONENT_WORKERS)),,-n $(COMPONENT_WORKERS) --dist loadfile) tests/component

integration: install
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) tests/integration

# The guarantee mutants (tests/mutants/mutants.toml), each applied to a copy of the tree (never this
# one) with the tests that must kill it: prints guarantee, mutant, killed by, seconds; fails on a
# survivor or a stale mutant.  Weekly and on demand in CI (.github/workflows/mutants.yml).
mutants: install
	$(PY) tests/mutants/run.py

lint: install
	$(VENV)/bin/ruff format --check mlreg registry pipelines tests benchmarks model_repository_template infra
	$(VENV)/bin/ruff check mlreg registry pipelines tests benchmarks model_repository_template infra
	$(MYPY)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -f docs/mkdocs.yml  # docs/build/site; the CLI reference made from the commands
	bash tests/act/lint-workflows.sh

# The whole story on embedded defaults: stack, export + register, promote, request, swap, status.
demo: install
	bash infra/demo.sh

bench: install
	$(PY) benchmarks/serve_ensemble.py
	$(PY) benchmarks/validate.py
	$(PY) benchmarks/storage.py
	$(PY) benchmarks/registry.py
	$(PY) benchmarks/promote.py
	$(PY) benchmarks/startup.py
	$(PY) benchmarks/verify.py
	$(PY) benchmarks/quality.py
	$(PY) benchmarks/fleet.py
	$(PY) benchmarks/workflows.py

clean:
	-$(MLREG) stack down
	-MLREG_HOME=$(CURDIR)/.mlreg/demo $(MLREG) stack down
	rm -rf .mlreg
