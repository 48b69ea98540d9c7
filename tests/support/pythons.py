"""Finding an interpreter of a given Python minor version (3.10, 3.12, ...) for the compat matrix.

Looked for, in order: an explicit path (``--python 3.12=/path`` of tests/compat/run.py), ``pythonX.Y``
on PATH, pyenv's versions directory (``$PYENV_ROOT``, default ``~/.pyenv``: pyenv's shims only run the
versions ``pyenv global`` names, the others sit there unused) and the system directories. A candidate
counts only if it runs and reports that version, so a pyenv shim that refuses is skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class PythonNotFound(LookupError):
    """No working interpreter of the wanted version; the message says where it looked and what to do."""


def _reports(candidate: Path, version: str) -> bool:
    try:
        out = subprocess.run([str(candidate), "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def candidates(version: str) -> list[Path]:
    """Where an interpreter of ``version`` may be, most specific first."""
    name = f"python{version}"
    found = []
    on_path = shutil.which(name)
    if on_path:
        found.append(Path(on_path))
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    # Newest patch release first: 3.12.10 before 3.12.9.
    for prefix in sorted(pyenv.glob(f"{version}.*"), key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()],
                         reverse=True):
        found.append(prefix / "bin" / name)
    found += [Path("/usr/local/bin") / name, Path("/usr/bin") / name]
    return found


def find(version: str, explicit: str | None = None) -> Path:
    """A working interpreter of Python ``version`` (``"3.12"``), or PythonNotFound."""
    tried = [Path(explicit)] if explicit else candidates(version)
    for candidate in tried:
        if candidate.exists() and _reports(candidate, version):
            return candidate
    raise PythonNotFound(
        f"no working Python {version} interpreter (tried: {', '.join(map(str, tried)) or 'nothing'}); install one "
        f"(e.g. pyenv install {version}) or name it: python -m tests.compat.run --python {version}=/path/to/python{version}")
