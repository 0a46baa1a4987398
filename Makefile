# Two commands for a fresh machine (see README):
#   make run   -- create .venv, install pinned dependencies and data, run the main job
#   make test  -- the same set-up, then the test suite
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
OUT     ?= out
STAMP   := $(VENV)/.installed

.PHONY: setup data run test clean

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "stateremat needs Python 3.11 (found " + sys.version.split()[0] + "); run make PY=python3.11 ...")'
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-nodeps.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP) data

# Real Fashion-MNIST images from the Debian package (no network at run time).
data:
	@if [ ! -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]; then \
	  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) || \
	  echo "warning: could not install dataset-fashion-mnist; the application falls back to scikit-learn digits"; \
	fi

run: setup
	$(BIN)/stateremat main --out $(OUT)

# Two pytest-xdist workers, one test file each at a time (module fixtures share spawns), one
# OpenMP thread each: the suite's wall time on 2 cores is about half of one process's.
test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests -n 2 --dist loadfile

clean:
	rm -rf $(VENV) $(OUT)
