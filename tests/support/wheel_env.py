"""Building the wheel and running tests/support/wheel_app.py from an install of it, as a user would.

Shared by tests/packaging/test_wheel.py (suite), tests/compat/run.py (pyspark 4.0-4.2 matrix) and the
cluster test: a wheel built from a clean copy of the source tree, a virtualenv with it installed,
and an environment where ``java`` runs but ``javac``/``jar`` are not found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.support.paths import ROOT

APP = Path(__file__).with_name("wheel_app.py")

#: JDK tools a JRE does not have; hidden from PATH by jre_env().
JDK_ONLY = {"javac", "jar", "javap", "jshell", "jlink", "jmod", "jdeps", "jarsigner", "jdeprscan", "jpackage"}
#: Source-tree entries a clean clone does not have (build outputs, caches, venvs).
NOT_IN_CLONE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "jars",
                                      ".pytest_cache", ".hypothesis", "out", "spark-warehouse", "metastore_db")


class AppFailed(AssertionError):
    """A child process failed; the message carries its command and the tail of its output."""


def run(cmd: list, *, log: Path, env: dict | None = None, cwd: Path | None = None, timeout: float = 600) -> str:
    """Runs ``cmd`` with its output in ``log``; returns the output or raises AppFailed with its tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        try:
            proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env,
                                  cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout} s"
    text = log.read_text(errors="replace")
    if code != 0:
        tail = "\n".join(text.splitlines()[-60:])
        raise AppFailed(f"{' '.join(map(str, cmd))} failed ({code}); log {log}:\n{tail}")
    return text


def build_wheel(dest: Path, *, isolated: bool = True) -> Path:
    """Builds the wheel from a clean copy of the source tree (as from a fresh clone) into ``dest``.

    ``isolated`` is pip's PEP 517 build isolation: the build installs its own pyspark
    (jvm-shim/wheel_backend.py); without it the current environment's pyspark is used.
    """
    src = dest / "src"
    shutil.copytree(ROOT, src, ignore=NOT_IN_CLONE)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dest, src]
    if not isolated:
        cmd.insert(4, "--no-build-isolation")
    run(cmd, log=dest / "build.log")
    return _one(dest, "spark_state-*.whl")


def build_release(dest: Path) -> tuple[Path, Path]:
    """The sdist and the wheel built from it (``python -m build``, as ``make dist``), from a clean copy of the
    source tree, into ``dest``."""
    src = dest / "src"
    shutil.copytree(ROOT, src, ignore=NOT_IN_CLONE)
    run([sys.executable, "-m", "build", "--outdir", dest, src], log=dest / "build.log")
    return _one(dest, "spark_state-*.tar.gz"), _one(dest, "spark_state-*.whl")


def _one(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        raise AppFailed(f"expected one {pattern} in {directory}, found {found}")
    return found[0]


def make_venv(path: Path, *, share_current_site: bool = False, base: Path | None = None) -> Path:
    """A new virtualenv of ``base`` (default: this interpreter), with no pip of its own: installs go
    through this interpreter's pip (``pip --python``, which runs pip's code on the venv's Python).

    ``share_current_site`` appends the current environment's site-packages to the new one's
    path (after its own, and without running that directory's .pth files, so an editable
    spark_state there stays invisible): a wheel installed ``--no-deps`` then finds pyspark,
    pandas and pyarrow without reinstalling them.
    """
    subprocess.run([str(base or sys.executable), "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    if share_current_site:
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        Path(site, "_shared_site.pth").write_text("".join(p + "\n" for p in paths))
    return python


def pip_install(python: Path, *requirements, no_deps: bool = False, log: Path) -> str:
    cmd = [sys.executable, "-m", "pip", "--python", python, "install", "--disable-pip-version-check"]
    if no_deps:
        # --ignore-installed: a venv made with share_current_site sees this environment's
        # (editable) spark_state, which pip would otherwise call "already installed"; pip then
        # installs into the new venv and leaves this environment untouched.
        cmd += ["--no-deps", "--ignore-installed"]
    return run(cmd + list(requirements), log=log)


def jre_env(tmp: Path, base: dict | None = None) -> dict:
    """``base`` (default os.environ) where ``java`` runs but no JDK-only tool is found.

    Every PATH directory holding a JDK tool is replaced by a shadow directory of symlinks to
    its other entries; JAVA_HOME points at a directory whose bin/ holds only ``java``. The
    variables the test harness sets for its own Spark (PYTHONPATH, PYSPARK_*) are dropped.
    """
    env = dict(os.environ if base is None else base)
    for var in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    java = shutil.which("java", path=env.get("PATH"))
    if java is None:
        raise AppFailed("java is not on PATH")
    dirs = []
    for i, d in enumerate(p for p in env.get("PATH", "").split(os.pathsep) if p):
        entries = os.listdir(d) if os.path.isdir(d) else []
        if not JDK_ONLY.intersection(entries):
            dirs.append(d)
            continue
        shadow = tmp / "path" / str(i)
        shadow.mkdir(parents=True, exist_ok=True)
        for name in entries:
            if name not in JDK_ONLY and not (shadow / name).exists():
                (shadow / name).symlink_to(Path(d) / name)
        dirs.append(str(shadow))
    jre = tmp / "jre" / "bin"
    jre.mkdir(parents=True, exist_ok=True)
    if not (jre / "java").exists():
        (jre / "java").symlink_to(os.path.realpath(java))
    env["PATH"] = os.pathsep.join(dirs)
    env["JAVA_HOME"] = str(jre.parent)
    return env


def run_app(python: Path, workdir: Path, phase: int, env: dict, *, args: list | None = None,
            launcher: list | None = None, timeout: float = 300) -> dict:
    """Runs wheel_app.py phase ``phase`` with ``python`` (or under ``launcher``, e.g. spark-submit)."""
    env = dict(env, PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    cmd = (launcher or [python]) + [APP, workdir, phase] + (args or [])
    out = run(cmd, log=workdir / f"phase{phase}.log", env=env, cwd=workdir.parent, timeout=timeout)
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AppFailed(f"no RESULT line in {workdir / f'phase{phase}.log'}:\n{out[-3000:]}")
