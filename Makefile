# The two commands of the README:
#   make demo   installs spark_state alone (no extras) and runs the main job (stop + restart from checkpoint)
#   make test   installs everything, runs the test suite (local[2]; on two pytest-xdist workers, the SparkSession's
#               tests on one), the two-executor cluster tests,
#               then the compat matrix (CI: .ci/run)
#   make test-fast  the tests that need neither Spark nor a JVM (tests/unit, chain, worker; ~3 min)
#   make wheel  builds dist/spark_state-*.whl (with the JVM shim jar inside)
#   make dist   builds the sdist, then the wheel from that sdist (what an index serves), and checks both with twine
#   make docs   builds the user guide (docs/, mkdocs.yml) into build/site with warnings as errors
#   make docs-sync  rewrites the generated blocks of docs/*.md (options table, format specs) from the code
#   make test-compat  the compat matrix alone: the wheel on Python 3.10, 3.12 and 3.13 beside pyspark
#               4.0, 4.1 and 4.2 (~3 min with pip's cache warm); make test COMPAT=0 skips it
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
BASE   := $(VENV)/.installed-base
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-cluster install shim docs-sync bench bench-quick bench-rescale bench-typed bench-large clean wheel dist docs test-compat soak

# The demo needs spark_state and its dependencies, not the extras of tests, benchmarks, docs and releases.
demo: $(BASE)
	$(PY) -m spark_state.spark.shim build
	$(PY) -m spark_state.demo

COMPAT ?= 1

# The suite on two processes (tests/conftest.py groups the tests that use the SparkSession on one): XDIST= runs it in one.
XDIST ?= -n 2 --dist loadgroup

test: install
	$(PY) -m pytest -q --durations=15 $(XDIST) $(PYTEST_ARGS)
	$(PY) -m pytest -q --durations=5 tests/cluster $(PYTEST_ARGS)
ifneq ($(COMPAT),0)
	$(PY) -m tests.compat.run $(COMPAT_ARGS)
endif

# No SparkSession, no JVM: the markers come from tests/conftest.py (tests/spark, packaging, jvm, cluster).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not spark and not jvm" $(XDIST) $(PYTEST_ARGS)

# The end-to-end tests on two executors (a standalone master + two workers), in a pytest process of their own.
test-cluster: install
	$(PY) -m pytest -q tests/cluster $(PYTEST_ARGS)

install: $(STAMP) shim

$(BASE): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run 'make PYTHON=/path/to/python3.11 ...'"; exit 1; }
	@command -v javac >/dev/null || { echo "error: javac not found; install a JDK 17 (e.g. apt-get install openjdk-17-jdk-headless)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	@# The source tree as a sys.path entry too: setuptools' editable finder runs after Python's path finder,
	@# so from the parent of a clone named spark_state/ (a script there, python -m spark_state) the clone
	@# would be imported as an empty namespace package (tests/unit/test_source_checkout_import.py).
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'spark_state-source.pth').write_text('$(CURDIR)\n')"
	touch $(BASE)

$(STAMP): $(BASE)
	$(PY) -m pip install -q -e '.[test,bench,docs,release]'
	touch $(STAMP)

# Compiles jvm-shim/ against the installed pyspark's jars (redone when the Spark version changes).
shim: $(BASE)
	$(PY) -m spark_state.spark.shim build

# PEP 517 build (isolated: installs pyspark 4.3 into the build environment and compiles the shim).
wheel: $(STAMP)
	$(PY) -m pip wheel --no-deps -w dist .

# The sdist, then the wheel built from the unpacked sdist (python -m build does both), checked by twine.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir build/site

# Rewrites the generated blocks of docs/*.md (options table, format specs; docs/hooks.py), committed so GitHub shows them.
docs-sync: $(BASE)
	$(PY) docs/hooks.py

test-compat: install
	$(PY) -m tests.compat.run $(COMPAT_ARGS)

bench: install
	$(PY) -m benchmarks.run

bench-quick: install
	$(PY) -m benchmarks.run --quick

bench-rescale: install
	$(PY) -m benchmarks.rescale

bench-typed: install
	$(PY) -m benchmarks.typed_files

# State ten times the heap (issue 35): 10M and 30M keys in a 1 GiB heap, spark_state beside RocksDB (and HDFS's
# outcome), each phase a new application; results.md and ratios.png in benchmarks/results/large-1g/ (~40 min).
bench-large: install
	$(PY) -m benchmarks.large run --keys 10000000 --hdfs --out benchmarks/results/large-1g
	$(PY) -m benchmarks.large run --keys 30000000 --phases build,restart --out benchmarks/results/large-1g

# The chaos soak (issue 27; benchmarks/soak): MINUTES of faults on two executors with state on S3 behind a
# fault-injecting proxy, then the end checks; report in benchmarks/results/soak/. Not part of make test
# (tests/cluster/test_soak_smoke.py runs a short one there).
MINUTES ?= 60
# MEMORY_LIMIT=256k: a memoryLimit small enough that every store spills into sorted runs (results in soak-spill/)
MEMORY_LIMIT ?=
# RANGE_READS=1: a row image beside every snapshot, read by range from S3 on every restore (results in soak-range/)
RANGE_READS ?=
SOAK_OUT ?= benchmarks/results/soak$(if $(MEMORY_LIMIT),-spill)$(if $(RANGE_READS),-range)
soak: install
	$(PY) -m benchmarks.soak --minutes $(MINUTES) --out $(SOAK_OUT) $(if $(MEMORY_LIMIT),--memory-limit $(MEMORY_LIMIT)) $(if $(RANGE_READS),--range-reads)

clean:
	rm -rf $(VENV) jvm-shim/build build dist .pytest_cache .hypothesis
