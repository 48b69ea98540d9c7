"""The examples of README.md and docs/*.md: found, checked for a reason when they do not run, and run.

An example is a fenced block of Python or shell at the start of a line. The HTML comment on the
line above it (blank lines between are allowed) says how it is treated:

    (none)                        runs, after the page's earlier examples, in a copy of the sandbox
    <!-- example: sandbox -->     the one-minute example: run once, in an empty directory, to make the
                                  sandbox (its ckpt/ is the checkpoint the other examples work on)
    <!-- not-run: REASON -->      not run; REASON says why, and what tests the same thing instead

Python examples of one page share a namespace and run in this process (so they use the suite's
SparkSession); shell examples run with ``bash -e`` and this interpreter's ``bin/`` first on PATH.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import ROOT

#: Fence languages that are examples; anything else (text, properties, diagrams) is not.
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*(not-run|example):\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int           # of the opening fence, 1-based
    lang: str
    code: str
    kind: str           # "run", "sandbox" or "not-run"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown file whose examples count: the README and the user guide."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def examples(path: Path) -> list[Example]:
    """The examples of one page in order; a malformed directive raises ValueError naming its line."""
    found: list[Example] = []
    lines = path.read_text().splitlines()
    directive: tuple[int, str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _DIRECTIVE.match(line.strip())
        if match:
            directive = (i + 1, match.group(1), match.group(2))
        fence = _FENCE.match(line)
        if fence and fence.group(1):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise ValueError(f"{path}:{i + 1}: a fenced block that never closes")
            lang = fence.group(1).lower()
            if lang in PYTHON | SHELL:
                kind, reason = "run", ""
                if directive is not None:
                    _, verb, arg = directive
                    if verb == "not-run":
                        kind, reason = "not-run", arg
                    elif arg == "sandbox":
                        kind = "sandbox"
                    else:
                        raise ValueError(f"{path}:{directive[0]}: unknown directive 'example: {arg}'")
                found.append(Example(path, i + 1, "python" if lang in PYTHON else "bash",
                                     "\n".join(lines[i + 1:end]) + "\n", kind, reason))
            elif directive is not None:
                raise ValueError(f"{path}:{directive[0]}: a directive above a {lang} block, which is not an example")
            directive = None
            i = end + 1
            continue
        if line.strip() and not match:
            if directive is not None:
                raise ValueError(f"{path}:{directive[0]}: a directive not followed by an example")
        i += 1
    if directive is not None:
        raise ValueError(f"{path}:{directive[0]}: a directive not followed by an example")
    return found


@contextlib.contextmanager
def working_directory(path: Path):
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run(example: Example, namespace: dict, cwd: Path) -> None:
    """Runs one example in ``cwd``; a failure raises AssertionError naming the example's file and line."""
    if example.lang == "python":
        with working_directory(cwd):
            exec(compile(example.code, example.where, "exec"), namespace)  # noqa: S102 - the docs' own code
        return
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    proc = subprocess.run(["bash", "-e", "-c", example.code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise AssertionError(f"{example.where} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
