"""The shim's TypedCodec through a real JVM (tests/jvm/VariantProbe.java, no Spark session)."""

from __future__ import annotations

import subprocess

from tests.support.jvm_probes import probe_command


def test_a_store_holding_a_variant_commits(tmp_path):
    """TypedCodec.forSchemas decides typed vs opaque by creating an ArrowWriter for the schemas (no row): a
    value holding a VariantType must then encode too (it does on Spark 4.3; a check, not a defect). Runs
    tests/jvm/VariantProbe.java (a JVM of a few seconds, no Spark session)."""
    cmd = probe_command("VariantProbe.java", "io.sparkstate.shim.codec.VariantProbe", tmp_path)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    result = [line for line in out.stdout.splitlines() if line.startswith(("OK", "OPAQUE", "FAILED"))]
    assert result and result[-1] in ("OK", "OPAQUE"), (result, out.stderr[-2000:])
