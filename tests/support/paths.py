"""Where things are: the checkout the tests run from (child processes get it as cwd and PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG4J = ROOT / "conf" / "log4j2.properties"
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"


def pythonpath_with_root(env: dict | None = None) -> str:
    """PYTHONPATH with this checkout first, so a child process imports this tree's spark_state and tests."""
    current = (os.environ if env is None else env).get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys([str(ROOT)] + [p for p in current.split(os.pathsep) if p]))
