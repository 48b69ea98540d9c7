"""The shim's change log (a provider's puts and removes within one batch), through a real provider in a JVM
(tests/jvm/ChangeLogProbe.java, no Spark session) and a real worker."""

from __future__ import annotations

import subprocess

from tests.support.jvm_probes import probe_command


def test_a_batch_changing_keys_twice_commits_each_keys_last_change(tmp_path):
    """The shim appends every put and remove to its change log as it happens, so a key changed twice in a batch
    is in the log twice: the committed version (the provider's map, and a new provider loading it from the
    worker) holds each key's last change, and each file (the first version's snapshot, the second's delta)
    holds one row per key. Runs tests/jvm/ChangeLogProbe.java (a provider, no Spark session)."""
    import sys

    cmd = probe_command("ChangeLogProbe.java", "ChangeLogProbe", tmp_path)
    out = subprocess.run([*cmd, str(tmp_path / "ckpt"), sys.executable], capture_output=True, text=True, timeout=240)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("LIVE ", "LOADED ")))
    expected = "1=12/v12,2=21/v21,5=51/v51"
    assert lines.get("LIVE") == expected and lines.get("LOADED") == expected, (out.stdout, out.stderr[-3000:])

    from spark_state.format import datafile as snapshot
    from spark_state.options import DEFAULT_MAX_PARALLELISM

    files = sorted(p for p in (tmp_path / "ckpt").rglob("*.arrow") if "snapshot" in p.name or "delta" in p.name)
    assert len(files) == 2, files
    for f in files:
        keys = [k["k"] for k in snapshot.decode(f.read_bytes(), f.name, DEFAULT_MAX_PARALLELISM)["key"].to_pylist()]
        assert len(keys) == len(set(keys)), (f.name, keys)
