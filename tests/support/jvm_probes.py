"""The small Java programs in tests/jvm/ (probes of the shim's classes, no Spark session), compiled against
the shim jar built from this tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import TESTS

#: What Arrow and Spark's unsafe rows need opened on JDK 17.
OPENS = ["--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
         "--add-opens=java.base/java.lang=ALL-UNNAMED", "--add-opens=java.base/java.util=ALL-UNNAMED",
         "-Dio.netty.tryReflectionSetAccessible=true"]


def probe_command(source: str, main_class: str, classes: Path, *jvm_options: str, heap: str = "512m") -> list[str]:
    """Compiles tests/jvm/<source> into ``classes`` and returns the command that runs ``main_class``
    (skips the test without a JDK)."""
    from spark_state import shim

    if shutil.which("javac") is None:
        pytest.skip("needs a JDK 17")
    cp = f"{shim.shim_jar()}:{shim.spark_jars_dir() / '*'}"
    src = TESTS / "jvm" / source
    subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", cp, str(src)], check=True, capture_output=True)
    return ["java", f"-Xmx{heap}", *OPENS, *jvm_options, "-cp", f"{classes}:{cp}", main_class]
