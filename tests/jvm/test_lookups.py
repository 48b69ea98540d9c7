"""Spark 4.2+'s ``keyExists`` (deduplication's lookup) and ``multiGet`` (a batch of keys) on spark_state's read
and write stores (tests/jvm/LookupProbe.java: a provider in a JVM with a real worker, no Spark session)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.jvm_probes import probe_command


def _model() -> tuple[set[int], set[int]]:
    """The keys of version 2 as the probe commits it, and of its write store after the uncommitted changes."""
    v2 = {k for k in range(2_000) if k % 3} | set(range(1_000, 2_500))
    write = (v2 | set(range(0, 3_000, 7))) - set(range(1, 3_000, 11))
    return v2, write


def test_key_exists_and_multi_get_answer_as_get_does_on_restored_and_changed_stores(tmp_path):
    """The shim's own keyExists and multiGet are the ones Spark calls (declared by the shim's store class, not
    Spark's defaults: multiGet's default throws), and agree with get on every key, present or not, for a version
    restored on a new provider and for a write store holding uncommitted puts and removes."""
    cmd = probe_command("LookupProbe.java", "LookupProbe", tmp_path)
    out = subprocess.run([*cmd, str(tmp_path / "ckpt" / "state"), sys.executable], capture_output=True, text=True,
                         timeout=240)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    v2, write = _model()
    assert lines.get("DECLARED") == "StoreView StoreView", (out.stdout, out.stderr[-3000:])
    assert lines.get("READ") == f"3000 {len(v2)} 0", (out.stdout, out.stderr[-3000:])
    assert lines.get("WRITE") == f"3000 {len(write)} 0", (out.stdout, out.stderr[-3000:])
