# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv and install the project into it on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

# The main job: the extraction workbench on the sample corpus (docs/extraction.md).
demo: $(STAMP)
	$(VENV)/bin/shoal-extract demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy shoal
	$(VENV)/bin/mypy apps/extraction/shoal_extract
	$(VENV)/bin/mypy apps/polling/shoal_polling
	$(VENV)/bin/mypy tests

test: lint
	$(VENV)/bin/pytest

bench: $(STAMP)
	$(VENV)/bin/python bench/queue_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
