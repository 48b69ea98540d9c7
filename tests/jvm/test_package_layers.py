"""The shim's packages depend on each other only downwards (jvm-shim/.../package-info.java): Spark's side
uses everything, the worker client uses the codec, and the engine, the codec and the worker client use
nothing else of the shim but two leaves: the memory budget and what is kept per schema. Read off the compiled
jar with the JDK's jdeps."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

ROOT = "io.sparkstate.shim"
#: package -> the shim packages it may use besides itself
ALLOWED = {
    "": {"engine", "codec", "worker", "memory", "schema"},
    "worker": {"codec", "memory", "schema"},
    "codec": {"memory", "schema"},
    "engine": {"memory", "schema"},
    "memory": set(),
    "schema": set(),
}


def _edges() -> set[tuple[str, str]]:
    from spark_state.spark import shim

    if shutil.which("jdeps") is None:
        pytest.skip("needs a JDK 17 (jdeps)")
    out = subprocess.run(["jdeps", "-verbose:package", "-filter:none", str(shim.shim_jar())],
                         capture_output=True, text=True, check=True).stdout
    edges = set()
    for line in out.splitlines():
        m = re.match(rf"\s+{re.escape(ROOT)}(\.\w+)?\s+->\s+{re.escape(ROOT)}(\.\w+)?\s", line)
        if m:
            src, dst = (g[1:] if g else "" for g in m.groups())
            if src != dst:
                edges.add((src, dst))
    return edges


def test_every_package_uses_only_the_layers_below_it():
    edges = _edges()
    assert edges, "jdeps found no dependency between the shim's packages: is the jar built?"
    packages = {p for e in edges for p in e}
    assert packages <= set(ALLOWED), f"packages the layering does not name: {packages - set(ALLOWED)}"
    wrong = sorted((src or ROOT, dst) for src, dst in edges if dst not in ALLOWED[src])
    assert not wrong, f"dependencies against the layering (package -> package it must not use): {wrong}"
