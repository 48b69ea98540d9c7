"""Wheel builds compile the JVM shim and package it as spark_state/jars/spark-state-shim.jar.

The jar is a build output, never committed: ``build_py`` compiles ``jvm-shim/`` with javac
against the pyspark of the build environment (pinned in pyproject's build-system requires).
Editable installs skip it; they compile the shim on demand (spark_state/spark/shim.py).
"""

import importlib.util
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _shim_module():
    # spark_state.spark.shim from this source tree (first on the path, whatever else is installed): it, the
    # packages above it and spark_state.errors import only the standard library, so no runtime dependency
    # of spark_state needs to be in the build environment.
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module("spark_state.spark.shim")
    finally:
        sys.path.remove(str(HERE))


class BuildPyWithShim(build_py):
    """build_py plus the compiled shim jar."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        shim = _shim_module()
        version = shim.check_spark_version()
        sources = sorted((HERE / "jvm-shim" / "src" / "main" / "java").rglob("*.java"))
        if not sources:
            raise shim.ShimBuildError("spark_state: no jvm-shim sources to build the wheel's jar from")
        jar = Path(self.build_lib) / "spark_state" / shim.PACKAGED_JAR
        with tempfile.TemporaryDirectory(prefix="spark-state-shim-") as work:
            shim.build_jar(sources, jar, Path(work))
        print(f"spark_state: compiled the JVM shim against pyspark {version} into {jar}")


setup(cmdclass={"build_py": BuildPyWithShim})
