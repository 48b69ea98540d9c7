"""A provider Spark unloads while one of its stores is still open (tests/jvm/UnloadProbe.java, a provider in a
JVM with a real worker, no Spark session)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.jvm_probes import probe_command


def test_stores_open_when_spark_unloads_their_provider_go_on_and_commit_exactly(tmp_path):
    """Spark's maintenance thread closes a provider the coordinator lists as active on another executor, and a
    task of this executor may still be running on it (the soak saw 22 such task failures in an hour). The open
    store keeps its rows: it reads, puts, removes and commits, and a new provider loads exactly that version;
    a store aborted after its provider closed stores nothing; a read store (Spark's aggregation reads a version
    before it upgrades the read to a write store) reads on after its provider closed."""
    cmd = probe_command("UnloadProbe.java", "UnloadProbe", tmp_path)
    out = subprocess.run([*cmd, str(tmp_path / "ckpt" / "state"), sys.executable], capture_output=True, text=True,
                         timeout=240)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    model = {k: k for k in range(1_000)}
    model.update({k: k + 1_000 for k in range(1_500)})
    del model[0]
    assert lines.get("COMMITTED") == "2 1001", (out.stdout, out.stderr[-3000:])
    assert "ABORTED" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert lines.get("READ") == "1001 true", (out.stdout, out.stderr[-3000:])
    assert lines.get("LOADED") == f"{len(model)} {sum(model.values())}", (out.stdout, out.stderr[-3000:])
