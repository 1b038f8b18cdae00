# The template repository's tasks. `make demo` and `make test` are all a newcomer needs.

VENV := .venv
PYTHON := $(VENV)/bin/python
DEMO := build/demo

.PHONY: venv demo test lint docs bench

venv: $(VENV)/.installed

# Redone only when pyproject.toml (which lists the dev group) changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --upgrade pip
	$(PYTHON) -m pip install --group dev
	touch $@

# Render the default project, install it, train it offline, report where the run went.
demo: venv
	rm -rf $(DEMO)
	$(PYTHON) -m cookiecutter --no-input --output-dir $(DEMO) .
	$(PYTHON) -m pip install --no-deps --no-build-isolation -e $(DEMO)/*/
	cd $(DEMO)/*/ && $(CURDIR)/$(PYTHON) train.py
	@$(PYTHON) -c 'import json, pathlib; \
	path = max(pathlib.Path("$(DEMO)").glob("*/runs/*/*/test_metrics.json"), key=lambda p: p.stat().st_mtime); \
	print("test/acc = %.4f (run folder: %s)" % (json.loads(path.read_text())["test/acc"], path.parent))'

test: venv
	$(PYTHON) -m pytest tests -raP --durations=40

lint: venv
	$(VENV)/bin/ruff check tests hooks docs benchmarks
	$(VENV)/bin/ruff format --check tests hooks docs benchmarks

# The documentation site, into build/site; --strict turns a broken link into an error.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Side by side: the generated project against a plain PyTorch loop, start-up, loaders, and
# the test accuracy of the default runs (real MNIST from ../shared when it is there).
# The table goes to the terminal, everything to build/bench/full/results.json;
# BENCH_ARGS adds options, e.g. BENCH_ARGS="--accelerator gpu" (see benchmarks/README.md).
BENCH_ARGS ?= --mnist-batches 20 --loader-batches 50
bench: venv
	$(PYTHON) benchmarks/bench.py $(BENCH_ARGS)
