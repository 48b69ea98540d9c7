"""The small Java programs in tests/jvm/ (probes of the shim's classes, no Spark session), compiled against
the shim jar built from this tree."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import quick_jvm
from tests.support.paths import TESTS

#: What Arrow and Spark's unsafe rows need opened on JDK 17.
OPENS = ["--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
         "--add-opens=java.base/java.lang=ALL-UNNAMED", "--add-opens=java.base/java.util=ALL-UNNAMED",
         "-Dio.netty.tryReflectionSetAccessible=true"]


def probe_command(source: str, main_class: str, classes: Path, *jvm_options: str, heap: str = "512m") -> list[str]:
    """Compiles tests/jvm/<source>, with the helpers the probes share (Probes.java), into ``classes`` and returns
    the command that runs ``main_class`` (skips the test without a JDK)."""
    from spark_state.spark import shim

    if shutil.which("javac") is None:
        pytest.skip("needs a JDK 17")
    cp = f"{shim.shim_jar()}:{shim.spark_jars_dir() / '*'}"
    sources = [str(TESTS / "jvm" / source), str(TESTS / "jvm" / "Probes.java")]
    subprocess.run(["javac", "-nowarn", "-d", str(classes), "-cp", cp, *sources], check=True, capture_output=True)
    return ["java", f"-Xmx{heap}", *OPENS, *quick_jvm.flags(), *jvm_options, "-cp", f"{classes}:{cp}", main_class]


class ProbeProcess:
    """A running probe that answers each command line on stdin with lines on stdout."""

    def __init__(self, cmd: list[str], *, stderr=None):
        # stderr (the JVM's log) goes to a file unless the caller names one: a pipe nobody reads would block
        # the probe once it fills
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log if stderr is None else stderr, text=True)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            raise AssertionError(f"the probe JVM ended (exit code {self.proc.wait()}): " + self.log.read()[-2000:])
        return line.rstrip("\n")

    def ask(self, line: str) -> str:
        self.send(line)
        return self.read()

    def answer(self, line: str) -> str:
        """Sends one command and returns its answer: the first line that starts with OK or ERR (a probe
        may print other lines before it)."""
        self.send(line)
        while not (reply := self.read()).startswith(("OK", "ERR")):
            pass
        return reply.strip()

    def close(self, timeout: float = 30) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=timeout)
        self.log.close()
