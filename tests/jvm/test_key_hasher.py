"""The shim's KeyHasher through a real JVM (tests/jvm/HasherProbe.java, no Spark session): one hasher is shared
by every store of a key schema and used by many task threads at once, so each thread hashes with its own
generated code; every thread's hash must still be Spark's own (HashPartitioning's Murmur3Hash, seed 42)."""

from __future__ import annotations

import subprocess

from tests.support.jvm_probes import probe_command


def test_a_shared_hasher_hashes_as_spark_does_from_many_threads_at_once(tmp_path):
    cmd = probe_command("HasherProbe.java", "io.sparkstate.shim.codec.HasherProbe", tmp_path)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    result = [line for line in out.stdout.splitlines() if line.startswith(("OK", "FAILED"))]
    assert result == ["OK"], (out.stdout[-2000:], out.stderr[-2000:])
