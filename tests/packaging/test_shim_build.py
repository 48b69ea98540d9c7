"""Building and locating the JVM shim jar (spark_state.spark.shim). JVM behaviour is tested elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from spark_state.spark import shim

needs_jdk = pytest.mark.skipif(shutil.which("javac") is None or shutil.which("jar") is None,
                               reason="needs a JDK 17 (javac, jar)")


@pytest.fixture
def shim_copy(tmp_path, monkeypatch):
    """A private copy of jvm-shim/ sources, so tests never touch the repository's build."""
    src = Path(shim.__file__).resolve().parents[2] / "jvm-shim" / "src"
    root = tmp_path / "jvm-shim"
    shutil.copytree(src, root / "src")
    monkeypatch.setattr(shim, "shim_dir", lambda: root)
    return root


@needs_jdk
def test_builds_jar_named_for_spark_version(shim_copy):
    jar = shim.shim_jar()
    assert jar == shim_copy / "build" / f"spark-state-shim-spark{shim.spark_version()}.jar"
    with zipfile.ZipFile(jar) as zf:
        names = set(zf.namelist())
    for cls in ("SparkStateProvider", "SparkStateStore", "SparkStateReadStore", "worker/WorkerClient",
                "codec/ArrowCodec", "codec/KeyHasher", "engine/PrefixIndex", "engine/StateMap"):
        assert f"io/sparkstate/shim/{cls}.class" in names
    # The provider implements Spark's interface and has the public no-arg constructor Spark needs.
    out = subprocess.run(["javap", "-cp", f"{jar}{os.pathsep}{shim.spark_jars_dir() / '*'}",
                          "io.sparkstate.shim.SparkStateProvider"], capture_output=True, text=True, check=True).stdout
    assert "implements org.apache.spark.sql.execution.streaming.state.StateStoreProvider" in out
    assert "public io.sparkstate.shim.SparkStateProvider();" in out


@needs_jdk
def test_rebuilds_only_when_a_source_is_newer(shim_copy):
    jar = shim.shim_jar()
    built = jar.stat().st_mtime_ns
    assert shim.shim_jar() == jar and jar.stat().st_mtime_ns == built  # fresh: no rebuild

    source = next((shim_copy / "src").rglob("KeyHasher.java"))
    later = time.time() + 5
    os.utime(source, (later, later))
    shim.shim_jar()
    assert jar.stat().st_mtime_ns != built


@needs_jdk
def test_javac_errors_show_command_and_output(shim_copy):
    broken = shim_copy / "src" / "main" / "java" / "io" / "sparkstate" / "shim" / "Broken.java"
    broken.write_text("package io.sparkstate.shim; class Broken { int x = ; }\n")
    with pytest.raises(shim.ShimBuildError) as err:
        shim.shim_jar()
    msg = str(err.value)
    assert "javac" in msg and "--release 17" in msg
    assert "Broken.java" in msg
    assert not (shim_copy / "build" / f"spark-state-shim-spark{shim.spark_version()}.jar").exists()


def test_missing_javac_says_install_jdk17(shim_copy, monkeypatch):
    monkeypatch.setattr(shim.shutil, "which", lambda name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(shim.ShimBuildError, match="JDK 17"):
        shim.shim_jar()


def test_build_false_without_jar_is_a_clear_error(shim_copy):
    with pytest.raises(shim.ShimBuildError, match="python -m spark_state.spark.shim build"):
        shim.shim_jar(build=False)


def test_missing_sources_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shim, "__file__", str(tmp_path / "spark_state" / "spark" / "shim.py"))
    with pytest.raises(shim.ShimBuildError, match="editable"):
        shim.shim_dir()


@needs_jdk
def test_cli_build_prints_jar_path(shim_copy, capsys):
    assert shim.main(["build"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.endswith(f"spark-state-shim-spark{shim.spark_version()}.jar")
    assert Path(printed).is_file()
    assert shim.main(["bogus"]) == 2


@pytest.mark.parametrize("version", ["3.5.4", "4.4.0", "5.0.0"])
def test_unsupported_spark_is_refused_naming_the_supported_ones(version):
    with pytest.raises(shim.UnsupportedSparkVersion) as err:
        shim.check_spark_version(version)
    msg = str(err.value)
    assert f"pyspark {version} is not supported" in msg
    assert "4.0, 4.1, 4.2 and 4.3" in msg and "pyspark>=4.0,<4.4" in msg


@pytest.mark.parametrize("version", ["4.0.0", "4.1.4", "4.2.1", "4.3.0"])
def test_supported_spark_versions_pass(version):
    assert shim.check_spark_version(version) == version


def test_packaged_jar_is_used_without_compiling(shim_copy, monkeypatch, tmp_path):
    # A wheel install: the jar next to the package, and no javac anywhere.
    package = tmp_path / "site" / "spark_state"
    (package / "jars").mkdir(parents=True)
    (package / "jars" / "spark-state-shim.jar").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    monkeypatch.setattr(shim, "__file__", str(package / "spark" / "shim.py"))
    monkeypatch.setattr(shim.shutil, "which", lambda name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert shim.shim_jar() == package / "jars" / "spark-state-shim.jar"
    assert not (shim_copy / "build").exists()


def test_unsupported_installed_spark_stops_shim_jar(monkeypatch):
    monkeypatch.setattr(shim, "spark_version", lambda: "3.5.1")
    with pytest.raises(shim.UnsupportedSparkVersion, match="3.5.1"):
        shim.shim_jar()
