# Two commands a new user needs: `make demo` and `make test`. CI calls `make test` too.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: demo test lint typecheck bench docs clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PIP) install -q -e '.[dev]'
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(VENV)/bin/fairgate demo

test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(MAKE) docs
	bash scripts/ensure_chromium.sh
	bash scripts/ensure_clients.sh
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/with_redis.sh $(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

bench: $(VENV)/.installed-dev
	bash scripts/with_redis.sh $(PY) benchmarks/admission.py

# the docs site, built offline into site/ (--strict: a broken link or a missing page fails)
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
