"""Builds and locates the JVM shim jar (``jvm-shim/``) for the installed PySpark.

The shim is compiled with ``javac --release 17`` against the jars of the installed
``pyspark`` (no Maven, no Scala compiler) into
``jvm-shim/build/spark-state-shim-spark<version>.jar``. It is rebuilt when the jar
for the installed Spark version is missing or a ``.java`` source is newer.

``python -m spark_state.shim build`` builds and prints the jar path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["ShimBuildError", "shim_jar", "shim_dir", "spark_version", "spark_jars_dir"]


class ShimBuildError(RuntimeError):
    """The shim jar cannot be built; the message says why and how to fix it."""


def shim_dir() -> Path:
    """The ``jvm-shim/`` directory next to the package (the project is installed editable)."""
    path = Path(__file__).resolve().parent.parent / "jvm-shim"
    if not (path / "src" / "main" / "java").is_dir():
        raise ShimBuildError(
            f"spark_state: the JVM shim sources are not at {path}/src/main/java. spark_state must be "
            "installed from its source tree in editable mode (pip install -e .) so that jvm-shim/ sits "
            "next to the spark_state package."
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
            "needs a JDK 17: install one (e.g. apt-get install openjdk-17-jdk-headless) and make sure "
            f"`{name}` is on PATH."
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


def _build(root: Path, sources: list[Path], jar: Path) -> None:
    javac = _tool("javac")
    jar_tool = _tool("jar")
    classpath = str(spark_jars_dir() / "*")
    build = root / "build"
    classes = build / "classes"
    build.mkdir(parents=True, exist_ok=True)
    if classes.exists():
        shutil.rmtree(classes)
    classes.mkdir()
    _run(
        [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", classpath, "-d", str(classes)]
        + [str(s) for s in sources],
        "compiling the JVM shim with javac",
    )
    # Build into a temporary file, then rename: a concurrent reader never sees half a jar.
    fd, tmp = tempfile.mkstemp(prefix=".shim-", suffix=".jar", dir=build)
    os.close(fd)
    try:
        _run([jar_tool, "--create", "--file", tmp, "-C", str(classes), "."], "packaging the JVM shim with jar")
        os.replace(tmp, jar)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def shim_jar(build: bool = True) -> Path:
    """Path of the shim jar for the installed Spark; (re)builds it when needed unless ``build=False``.

    With ``build=False`` a missing jar is an error (a stale one is returned as is).
    """
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
                "run `python -m spark_state.shim build` (or `make shim`)."
            )
        _build(root, sources, jar)
    return jar


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["build"], ["path"]):
        print("usage: python -m spark_state.shim build|path", file=sys.stderr)
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
