# The tested torch; override with e.g. `make test TORCH='torch==2.4.1'`.
TORCH ?= torch==2.13.0
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint docs docs-check demo bench bench-gpu package clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned, so that resolving vlret's loose `torch>=2.1` installs nothing more.
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# lint-imports checks the layering contracts of pyproject.toml ([tool.importlinter]): the core
# imports no harness, a package only the layers below it, no import cycles. mypy type-checks
# the package (mypy.ini; the package ships py.typed).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy src/vlret

test: lint
	$(PY) -m pytest -q

# The API reference site (mkdocs.yml) into build/site/; --strict makes every warning an error
# (a broken link, a docstring parameter missing from the signature).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# Documentation that runs (scripts/check_docs.py): every shell block of README.md and docs/ as
# written, page by page in a fresh folder outside the tree with the installed vlret first on
# PATH; a block marked <!-- docs-check: skip REASON: why --> is checked without running (its
# vlret commands parsed, its configs validated). One line per block and per command with its
# time, then a table per page; the same in build/docs-check.json. Apart from `make test` (its
# 15-minute budget); .ci/run calls it after the tests. Options, e.g.
# make docs-check DOCS_CHECK='--page README.md --keep' (or --budget SECONDS, --dry-run).
DOCS_CHECK ?=
docs-check: $(STAMP)
	$(PY) scripts/check_docs.py --json build/docs-check.json $(DOCS_CHECK)

# The six-loss comparison on the synthetic "small" world (docs/results.md); `vlret demo` alone
# is the few-second tour of the losses on one batch.
demo: $(STAMP)
	$(VENV)/bin/vlret demo --preset small

# CI's packaging check (scripts/check_package.sh): build the sdist and the wheel, twine check,
# every tracked file of src/vlret in the wheel, then the wheel in a fresh venv outside the tree
# ($(TORCH) installed first and pinned): the core without extras, then with [train,vsl] the
# version, configs, the quick demo and a short training run (~3 min on 2 cores).
package: $(STAMP)
	TORCH="$(TORCH)" PYTHON="$(PYTHON)" BUILD_PYTHON="$(PY)" scripts/check_package.sh

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The set a lent GPU runs first (benchmarks/run_gpu_set.py, benchmarks/README.md): tiled losses
# to B = 1,048,576, COCO-5K SCAN exact scoring, the pixel pipeline's samples/s, gradient caching
# at B=65536, collected into one JSON: $(OUT) (a file, or a folder for bench-gpu.json), default
# build/bench-gpu.json. Without CUDA it says so in one line and fails (exit status 2).
OUT ?= build/bench-gpu.json
bench-gpu: $(STAMP)
	$(PY) benchmarks/run_gpu_set.py --out "$(OUT)"

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
