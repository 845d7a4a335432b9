# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs what it needs into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint plan-example bench-planner chaos clean

# setup.py and the .pyx: an edit of a compiled extension rebuilds it (pip install -e).
$(STAMP): pyproject.toml setup.py tables/operators/_bigendian.h tables/operators/_fastjoin.pyx tables/operators/_fastwindow.pyx tables/records/_fastcheck.pyx
	@command -v java >/dev/null 2>&1 || { echo "installing Java 17 for PySpark"; \
	  (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless) >/dev/null; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[broker,spark,test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m app.demo

# Two test processes, each a whole file at a time (its fixtures, brokers and workers its own):
# most tests wait on real worker processes, so two halve the wall time on 2 cores.
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy  # tables/, assignor/, pipeline/: pyproject.toml [tool.mypy]

bench-planner: $(STAMP)
	$(BIN)/python -m benchmarks.bench_planner --quick

chaos: $(STAMP)
	$(BIN)/python -m app.chaos --kills 20 --pauses 4 --deduped-reconcile

plan-example: $(STAMP)
	$(BIN)/python -m assignor plan --summary docs/examples/scenario.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache
