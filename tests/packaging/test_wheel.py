"""The wheel, as a user installs it: the shim jar inside, no JDK needed at run time.

The wheel is built once per run from a clean copy of the source tree with pip's PEP 517 build
(isolated: the build installs its own pyspark and compiles the shim). It is installed
``--no-deps`` into a new virtualenv that sees this environment's site-packages (pyspark,
pandas, pyarrow; not its editable spark_state), which keeps the test fast; installing every
dependency fresh, beside each other supported pyspark, is tests/compat/run.py's job.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import zipfile

import pytest

import spark_state
from tests.support import wheel_app, wheel_env

needs_jdk = pytest.mark.skipif(shutil.which("javac") is None, reason="building the wheel needs a JDK 17")


@needs_jdk
def test_wheel_carries_the_compiled_shim_and_no_sources(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        with zf.open("spark_state/jars/spark-state-shim.jar") as jar, zipfile.ZipFile(jar) as inner:
            classes = set(inner.namelist())
    assert not [n for n in names if n.endswith(".java")]
    for cls in ("SparkStateProvider", "SparkStateStore", "SparkStateReadStore", "SparkCompat", "worker/WorkerClient"):
        assert f"io/sparkstate/shim/{cls}.class" in classes
    assert "spark_state/worker/__main__.py" in names


@needs_jdk
def test_installed_wheel_restores_state_after_restart_without_javac(wheel, tmp_path):
    python = wheel_env.make_venv(tmp_path / "venv", share_current_site=True)
    wheel_env.pip_install(python, wheel, no_deps=True, log=tmp_path / "pip.log")
    env = wheel_env.jre_env(tmp_path)
    app = tmp_path / "app"

    first = wheel_env.run_app(python, app, 1, env, args=["--configure"])
    second = wheel_env.run_app(python, app, 2, env, args=["--configure"])  # a new application: restart

    installed_jar = tmp_path / "venv" / "lib"
    for result in (first, second):
        assert result["javac"] is None
        assert result["jar"].startswith(str(installed_jar)) and result["jar"].endswith("spark_state/jars/spark-state-shim.jar")
        assert result["provider"] == "io.sparkstate.shim.SparkStateProvider"
        assert "io.sparkstate.shim.MaintenanceWarnings" in result["listeners"]
        assert result["contract"] == {name: [] for name in wheel_app.SHIM_CLASSES}
        assert result["pythons"] == [str(python)]
    assert first["totals"] == {"a": 4, "b": 2}
    assert second["totals"] == {"a": 14, "c": 5}  # a's total continues from the first application


def _contents(wheel) -> dict:
    """Every entry's SHA-256, the shim jar's by entry (a jar's own timestamps differ between builds); RECORD,
    which holds the jar's hash, is left out."""
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            data = zf.read(name)
            if name.endswith(".jar"):
                with zipfile.ZipFile(io.BytesIO(data)) as jar:
                    out[name] = {n: hashlib.sha256(jar.read(n)).hexdigest() for n in jar.namelist()}
            elif not name.endswith(".dist-info/RECORD"):
                out[name] = hashlib.sha256(data).hexdigest()
    return out


@needs_jdk
def test_the_sdist_builds_the_same_wheel_and_both_pass_twine_check(wheel, tmp_path):
    sdist, from_sdist = wheel_env.build_release(tmp_path / "release")
    assert sdist.name == f"spark_state-{spark_state.__version__}.tar.gz"
    assert from_sdist.name == wheel.name == f"spark_state-{spark_state.__version__}-py3-none-any.whl"
    assert _contents(from_sdist) == _contents(wheel)
    assert f"spark_state-{spark_state.__version__}.dist-info/licenses/LICENSE" in _contents(wheel)
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert check.returncode == 0, check.stdout + check.stderr
