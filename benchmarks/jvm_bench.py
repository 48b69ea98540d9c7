"""Compiles and runs benchmarks/jvm/ProviderBench.java (one JVM per provider, mode and size)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pyspark

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "jvm" / "ProviderBench.java"
VARIANTS_SOURCE = HERE / "jvm" / "VariantProviders.java"
LOG4J = HERE / "jvm" / "log4j2.properties"
BUILD = HERE / "jvm" / "build"
JARS = Path(pyspark.__file__).resolve().parent / "jars"

# The flags Spark itself gives its JVMs on Java 17 (module opens for Unsafe and friends).
JAVA_OPENS = [
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.cs=ALL-UNNAMED",
    "--add-opens=java.base/sun.security.action=ALL-UNNAMED",
    "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED",
    "-Djdk.reflect.useDirectMethodHandle=false",
    "-Dio.netty.tryReflectionSetAccessible=true",
]


def compile_harness() -> Path:
    """javac ProviderBench.java against the installed pyspark's jars (only when the source changed)."""
    target = BUILD / "ProviderBench.class"
    if target.exists() and target.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BUILD
    if shutil.which("javac") is None:
        raise RuntimeError("javac not found: install a JDK 17 to run the provider micro-benchmark")
    BUILD.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(BUILD), "-cp", f"{JARS}/*", str(SOURCE)],
        capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"javac ProviderBench.java failed:\n{proc.stderr}")
    return BUILD


def compile_variants(shim_jar: Path) -> Path:
    """javac VariantProviders.java against the shim jar (only when the source or the jar changed): the
    classes join the harness's on the classpath, in the shim's package."""
    target = BUILD / "io" / "sparkstate" / "shim" / "VariantProviders.class"
    if target.exists() and target.stat().st_mtime >= max(VARIANTS_SOURCE.stat().st_mtime, shim_jar.stat().st_mtime):
        return BUILD
    BUILD.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(BUILD), "-cp", f"{shim_jar}{os.pathsep}{JARS}/*",
         str(VARIANTS_SOURCE)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"javac VariantProviders.java failed:\n{proc.stderr}")
    return BUILD


def heap_for(rows: int) -> str:
    if rows <= 200_000:
        return "2g"
    if rows <= 2_000_000:
        return "6g"
    return "16g"


def run(provider, mode: str, rows: int, ckpt_dir: Path, log_path: Path, *, shim_jar: Path | None = None,
        batches: int = 10, change_pct: float = 10.0, version: int | None = None,
        extra_jvm: list[str] | None = None, timeout: float = 3600, data: str = "bench") -> dict:
    """Runs one ProviderBench JVM and returns its RESULT JSON (raises with the log tail on failure)."""
    classes = compile_harness()
    cp = [f"{JARS}/*", str(classes)]
    if provider.spark_state:
        if shim_jar is None:
            raise RuntimeError("spark_state shim jar not available")
        cp.insert(0, str(shim_jar))
        if provider.variant:
            compile_variants(shim_jar)
    cmd = ["java", f"-Xmx{heap_for(rows)}", f"-Dlog4j2.configurationFile={LOG4J}", *JAVA_OPENS,
           *(extra_jvm or []), "-cp", os.pathsep.join(cp), "ProviderBench",
           "--provider-class", provider.cls, "--mode", mode, "--rows", str(rows), "--dir", str(ckpt_dir),
           "--batches", str(batches), "--change-pct", str(change_pct), "--data", data]
    if version is not None:
        cmd += ["--version", str(version)]
    for k, v in provider.sql_confs().items():
        if k != "spark.sql.streaming.stateStore.providerClass":
            cmd += ["--conf", f"{k}={v}"]
    return run_for_result(cmd, log_path, f"ProviderBench {provider.name} {mode} rows={rows}", timeout=timeout)


def run_for_result(cmd: list[str], log_path: Path, what: str, *, timeout: float, cwd: Path | None = None) -> dict:
    """Runs a benchmark child process and returns the JSON of its ``RESULT `` line.

    stderr goes to ``log_path`` under the command line; a failure raises with the log's tail.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=cwd, timeout=timeout)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    if proc.returncode != 0 or result is None:
        tail = "".join(open(log_path, errors="replace").readlines()[-30:])
        raise RuntimeError(f"{what} exited {proc.returncode}; log {log_path}:\n{tail}")
    return result
