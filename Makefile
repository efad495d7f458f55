# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv and install the project into it on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test stress-test lint bench clean system-packages

# Debian packages the project uses beyond Python: Tesseract's English model for
# the extraction workbench's OCR of scanned pages (the library comes with the
# tesserocr wheel; the program is what bench/parse_bench.py --ocr compares
# against), Chromium for the browser tests. Optional: without the model a
# scanned PDF ends in an error naming the package, and the browser tests are
# skipped.
SYSTEM_PACKAGES := tesseract-ocr tesseract-ocr-eng chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Three distributions, editable, in one pip run (so the apps' `shoal[...]`
# requirement is this checkout, never a download): the core with every extra,
# and the two reference apps. editable_mode=compat installs each as a path in a
# .pth file, which mypy follows (the default finder hook it cannot).
APPS := apps/extraction apps/polling
$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(APPS))
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet --config-settings editable_mode=compat \
		-e '.[all,test,bench]' $(addprefix -e ,$(APPS))
	touch $(STAMP)

# The main job: the extraction workbench on the sample corpus (apps/extraction/README.md).
demo: $(STAMP)
	$(VENV)/bin/shoal-extract demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy shoal
	$(VENV)/bin/mypy apps/extraction/shoal_extract
	$(VENV)/bin/mypy apps/polling/shoal_polling
	$(VENV)/bin/mypy tests
	$(VENV)/bin/lint-imports

# Two processes: most tests wait on servers and subprocesses, and each test
# has a database of its own. A file's tests stay together (a module's fixtures,
# such as the development set's parse, are made once).
test: lint
	$(VENV)/bin/pytest -n 2 --dist loadfile

# `make test` while busy processes keep every core loaded (docs/testing.md).
stress-test: $(STAMP)
	scripts/stress-test

bench: $(STAMP)
	$(VENV)/bin/python bench/queue_bench.py

system-packages:
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(SYSTEM_PACKAGES)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache .grimp_cache
