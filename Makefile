# The two commands of the README:
#   make demo   installs everything and runs the main job (stop + restart from checkpoint)
#   make test   installs everything and runs the test suite (local[2], then the two-executor cluster tests)
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-cluster install shim bench bench-quick bench-rescale clean

demo: install
	$(PY) -m spark_state.demo

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)
	$(PY) -m pytest -q tests/cluster $(PYTEST_ARGS)

# The end-to-end tests on two executor JVMs (local-cluster), in a pytest process of their own.
test-cluster: install
	$(PY) -m pytest -q tests/cluster $(PYTEST_ARGS)

install: $(STAMP) shim

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=/path/to/python3.11 ...'"; exit 1; }
	@command -v javac >/dev/null || { echo "error: javac not found; install a JDK 17 (e.g. apt-get install openjdk-17-jdk-headless)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

# Compiles jvm-shim/ against the installed pyspark's jars (redone when the Spark version changes).
shim: $(STAMP)
	$(PY) -m spark_state.shim build

bench: install
	$(PY) -m benchmarks.run

bench-quick: install
	$(PY) -m benchmarks.run --quick

bench-rescale: install
	$(PY) -m benchmarks.rescale

clean:
	rm -rf $(VENV) jvm-shim/build .pytest_cache .hypothesis
