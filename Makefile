# Every routine command of the project. The README names two: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install migrate lint typecheck bench evidence clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The load harness's compiled modules (evaluator/harness/native.py): rebuilt when a compiled
# module's source changes. Without a C compiler the harness runs the same modules as Python.
NATIVE := build/native/stamp.json
NATIVE_SOURCES := $(wildcard admission/core/*.py) evaluator/harness/arrivals.py evaluator/harness/native.py

$(NATIVE): $(STAMP) $(NATIVE_SOURCES)
	$(BIN)/python -m evaluator.harness.native build || echo "the load harness will run its modules as Python"

install: $(STAMP) $(NATIVE)

migrate: install
	$(BIN)/python manage.py migrate --noinput

run: install
	$(BIN)/python -m config.cli run

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	# No private name imported from another package (a preview rule, so asked for alone);
	# tests/test_layout.py checks the modules of one package.
	$(BIN)/ruff check --preview --select PLC2701 .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layout.py

typecheck: install
	# django-stubs loads the settings, which need a key; this one signs nothing.
	DJANGO_SECRET_KEY=$${DJANGO_SECRET_KEY:-typecheck-only} $(BIN)/mypy admission evaluator console config

bench: install
	$(BIN)/python benchmarks/layout.py
	$(BIN)/python benchmarks/admission.py
	$(BIN)/python benchmarks/evaluator.py
	$(BIN)/python benchmarks/load_harness.py
	$(BIN)/python benchmarks/history_api.py
	$(BIN)/python benchmarks/service.py
	$(BIN)/python benchmarks/telemetry.py
	$(BIN)/python benchmarks/shadow.py
	$(BIN)/python benchmarks/run_progress.py
	$(BIN)/python benchmarks/request_bounds.py
	$(BIN)/python benchmarks/durable_parallel.py
	$(BIN)/python benchmarks/usage.py
	$(BIN)/python benchmarks/outages.py

evidence: install
	$(BIN)/python -m evaluator.harness --manifest manifests/load-manifest.v2.json --target admission-controller --write-evidence
	$(BIN)/python -m evaluator.harness --manifest manifests/load-manifest.v2.json --target evaluator --write-evidence
	$(BIN)/python -m evaluator.harness --manifest manifests/load-manifest.v1.json --target evaluator --write-evidence

clean:
	rm -rf $(VENV) var build .pytest_cache .mypy_cache .ruff_cache .hypothesis
