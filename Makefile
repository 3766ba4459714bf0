# Two commands do all set-up on a fresh machine (Python 3.11):
#   make demo   -- reproduce a paper figure, write its plot and results
#   make test   -- run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
export OMP_NUM_THREADS ?= 1
export DASK_TEMPORARY_DIRECTORY ?= $(CURDIR)/.dask-tmp

.PHONY: demo test test-slow bench install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of torch first, pinned: anything unpinned before it would pull a CUDA build
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[test,models]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attsvm reproduce local-convergence --out results/local-convergence

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) benchmarks/bench_svm.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_kv.py
	$(PY) benchmarks/bench_experiments.py --workers 2

clean:
	rm -rf $(VENV) results .dask-tmp .pytest_cache
