"""JVM options for the tests' own JVMs: most live seconds, where the C2 compiler costs more than it saves.

With ``-XX:TieredStopAtLevel=1`` (the C1 compiler alone) a short Spark application uses about half the CPU
(a local session, a small job and a streaming batch: 18-20 s of JVM CPU -> 10-12 s), and the suite is
CPU-bound on two cores. Semantics do not change: only how hot code is compiled. Benchmarks never use it
(they measure the JVM users run), so it is set only where the tests start:

- ``install()`` (tests/conftest.py, tests/compat/run.py) puts it in ``SPARK_SUBMIT_OPTS`` (driver JVMs that
  ``spark-submit`` starts, pyspark's own included, in this process and every child that inherits the
  environment), ``SPARK_DAEMON_JAVA_OPTS`` (masters and workers that ``spark-class`` starts) and ``ENV``;
- ``flags()`` is what ``ENV`` holds, for JVMs a test starts itself (JVM probes, the cluster tests' standalone
  master, workers and executors);
- ``long_lived()`` leaves it out of a driver that runs the whole suite (the shared SparkSession), where C2's
  faster code pays for its compiles.
"""

from __future__ import annotations

import contextlib
import os

FLAGS = "-XX:TieredStopAtLevel=1"
ENV = "SPARK_STATE_TEST_JVM_OPTS"


def install(environ=os.environ) -> None:
    """Sets the options for every JVM started from now on with ``environ``, keeping any the caller set."""
    for var in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS", ENV):
        if FLAGS not in environ.get(var, ""):
            environ[var] = f"{environ.get(var, '')} {FLAGS}".strip()


def flags() -> list[str]:
    """The options for a JVM the test starts itself (none outside the tests: ``ENV`` unset)."""
    return os.environ.get(ENV, "").split()


@contextlib.contextmanager
def long_lived(environ=os.environ):
    """Starts the JVMs of the ``with`` block (a driver that lives as long as the test run) without the options."""
    saved = environ.get("SPARK_SUBMIT_OPTS")
    if saved is not None:
        rest = " ".join(f for f in saved.split() if f not in FLAGS.split())
        if rest:
            environ["SPARK_SUBMIT_OPTS"] = rest
        else:
            del environ["SPARK_SUBMIT_OPTS"]
    try:
        yield
    finally:
        if saved is not None:
            environ["SPARK_SUBMIT_OPTS"] = saved
