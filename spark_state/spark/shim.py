"""Locates (and in a source tree, builds) the JVM shim jar for the installed PySpark.

A wheel carries the jar prebuilt at ``spark_state/jars/spark-state-shim.jar`` (compiled by the
wheel build, see setup.py), so an installed spark_state needs no JDK. In a source tree
(editable install, development) the shim is compiled on demand with ``javac --release 17``
against the jars of the installed ``pyspark`` (no Maven, no Scala compiler) into
``jvm-shim/build/spark-state-shim-spark<version>.jar``, rebuilt when that jar is missing or a
``.java`` source is newer.

One jar serves Spark 4.0 to 4.3 (see jvm-shim/.../SparkCompat.java); other versions are refused
here, before Spark starts, with a message naming the supported ones.

``python -m spark_state.spark.shim build`` builds (if needed) and prints the jar path. This module
imports nothing but the standard library and ``spark_state.errors``: setup.py uses it to build wheels.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from spark_state.errors import ShimBuildError, UnsupportedSparkVersion

__all__ = ["ShimBuildError", "UnsupportedSparkVersion", "SUPPORTED_SPARK", "shim_jar", "shim_dir",
           "packaged_jar", "spark_version", "spark_jars_dir", "check_spark_version", "build_jar"]

#: Spark minor versions the shim is built and tested for (pyproject: pyspark>=4.0,<4.4).
SUPPORTED_SPARK = ("4.0", "4.1", "4.2", "4.3")
#: Where the wheel build puts the compiled shim, relative to the spark_state package.
PACKAGED_JAR = Path("jars") / "spark-state-shim.jar"


def _package() -> Path:
    """The spark_state package directory (this module is spark_state/spark/shim.py)."""
    return Path(__file__).resolve().parent.parent


def packaged_jar() -> Path:
    """Where a wheel install keeps the prebuilt jar (it may not exist: source trees build it)."""
    return _package() / PACKAGED_JAR


def shim_dir() -> Path:
    """The ``jvm-shim/`` source directory next to the package (source tree / editable install)."""
    path = _package().parent / "jvm-shim"
    if not (path / "src" / "main" / "java").is_dir():
        raise ShimBuildError(
            f"spark_state: this installation has neither the prebuilt JVM shim jar ({packaged_jar()}) "
            f"nor the shim sources ({path}/src/main/java). Install spark_state from its wheel "
            "(pip install spark_state-<version>-py3-none-any.whl, which carries the jar), or from a "
            "source checkout in editable mode (pip install -e .), which compiles the shim with javac."
        )
    return path


def _pyspark():
    try:
        import pyspark
    except ImportError as e:  # pragma: no cover - pyspark is a dependency
        raise ShimBuildError("spark_state: pyspark is not installed; pip install pyspark") from e
    return pyspark


def spark_version() -> str:
    return _pyspark().__version__


def check_spark_version(version: str | None = None) -> str:
    """Returns the (installed) Spark version, or raises UnsupportedSparkVersion naming the supported ones."""
    version = spark_version() if version is None else version
    if ".".join(version.split(".")[:2]) not in SUPPORTED_SPARK:
        raise UnsupportedSparkVersion(
            f"spark_state: pyspark {version} is not supported; spark_state supports Spark "
            f"{', '.join(SUPPORTED_SPARK[:-1])} and {SUPPORTED_SPARK[-1]} (any patch release). "
            "Install one of them, e.g. pip install 'pyspark>=4.0,<4.4'."
        )
    return version


def spark_jars_dir() -> Path:
    jars = Path(_pyspark().__file__).resolve().parent / "jars"
    if not jars.is_dir():
        raise ShimBuildError(f"spark_state: pyspark has no jars directory at {jars}; reinstall pyspark.")
    return jars


def _sources(root: Path) -> list[Path]:
    return sorted((root / "src" / "main" / "java").rglob("*.java"))


def _jar_path(root: Path) -> Path:
    return root / "build" / f"spark-state-shim-spark{spark_version()}.jar"


def _is_stale(jar: Path, sources: list[Path]) -> bool:
    if not jar.is_file():
        return True
    built = jar.stat().st_mtime
    return any(src.stat().st_mtime > built for src in sources)


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        java_home = os.environ.get("JAVA_HOME")
        if java_home and (Path(java_home) / "bin" / name).is_file():
            found = str(Path(java_home) / "bin" / name)
    if found is None:
        raise ShimBuildError(
            f"spark_state: `{name}` was not found on PATH (or in $JAVA_HOME/bin); building the JVM shim "
            "from source needs a JDK 17: install one (e.g. apt-get install openjdk-17-jdk-headless) and make "
            f"sure `{name}` is on PATH, or install spark_state from its wheel, which carries the jar prebuilt."
        )
    return found


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        raise ShimBuildError(
            f"spark_state: {what} failed (exit code {proc.returncode}).\n"
            f"command: {' '.join(cmd)}\n{output}"
        )


def build_jar(sources: list[Path], jar: Path, workdir: Path) -> None:
    """Compiles ``sources`` against the installed pyspark's jars into ``jar`` (classes in ``workdir``)."""
    javac = _tool("javac")
    jar_tool = _tool("jar")
    classpath = str(spark_jars_dir() / "*")
    classes = workdir / "classes"
    jar.parent.mkdir(parents=True, exist_ok=True)
    if classes.exists():
        shutil.rmtree(classes)
    classes.mkdir(parents=True)
    _run(
        [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", classpath, "-d", str(classes)]
        + [str(s) for s in sources],
        "compiling the JVM shim with javac",
    )
    # Build into a temporary file, then rename: a concurrent reader never sees half a jar.
    fd, tmp = tempfile.mkstemp(prefix=".shim-", suffix=".jar", dir=jar.parent)
    os.close(fd)
    try:
        _run([jar_tool, "--create", "--file", tmp, "-C", str(classes), "."], "packaging the JVM shim with jar")
        os.replace(tmp, jar)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def shim_jar(build: bool = True) -> Path:
    """Path of the shim jar for the installed Spark.

    A wheel install returns its prebuilt jar (no JDK needed). A source tree (re)builds
    ``jvm-shim/`` when needed unless ``build=False``; then a missing jar is an error (a stale
    one is returned as is). An unsupported pyspark raises UnsupportedSparkVersion.
    """
    check_spark_version()
    packaged = packaged_jar()
    if packaged.is_file():
        return packaged
    root = shim_dir()
    jar = _jar_path(root)
    sources = _sources(root)
    if not sources:
        raise ShimBuildError(f"spark_state: no .java sources under {root}/src/main/java.")
    if _is_stale(jar, sources):
        if not build:
            if jar.is_file():
                return jar
            raise ShimBuildError(
                f"spark_state: the JVM shim jar {jar} has not been built for Spark {spark_version()}; "
                "run `python -m spark_state.spark.shim build` (or `make shim`)."
            )
        build_jar(sources, jar, root / "build")
    return jar


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["build"], ["path"]):
        print("usage: python -m spark_state.spark.shim build|path", file=sys.stderr)
        return 2
    try:
        jar = shim_jar(build=args[0] == "build")
    except ShimBuildError as e:
        print(e, file=sys.stderr)
        return 1
    print(jar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
