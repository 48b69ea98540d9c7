"""The executor's memory budget with everything a provider holds (tests/jvm/BudgetProbe.java: a provider in a JVM
with a real worker, no Spark session): the DESIGN's "every byte is budgeted" beyond the engine's own kinds (rows,
runs, cache: tests/jvm/test_engine.py), the batch's change log, the chunks streamed to the worker, the Arrow
buffers of a load."""

from __future__ import annotations

import subprocess
import sys

from tests.support.jvm_probes import probe_command

LIMIT = 256 << 10
CHECK_EVERY = 64
CHUNK = 16 << 10


def test_a_provider_holds_its_budget_with_every_kind_of_memory_and_gives_it_back(tmp_path):
    """memoryLimit 256k, state of 12,000 rows of ~130 bytes (about eight times the budget) over six batches of
    4,000 puts, their changes streamed in 16 KiB chunks; then a new provider loads the last version. Sampled every
    millisecond throughout:

    - every kind of memory a provider holds is charged at some point: heap rows, runs' indexes and filters, cached
      blocks, the change log, chunks in flight, the Arrow buffers of the load;
    - together they never exceed the limit by more than one check interval of puts, the buffers of a few chunks
      (the encoder's, those in flight) and the Arrow batch a load reads;
    - a commit leaves no change log or chunk charged; the load is exact; once both providers closed and the
      background merges that still read their runs ended (within 20 s), nothing is charged."""
    (tmp_path / "classes").mkdir()
    cmd = probe_command("BudgetProbe.java", "BudgetProbe", tmp_path / "classes",
                        f"-Dspark_state.spillCheckEvery={CHECK_EVERY}", f"-Dio.sparkstate.streamChunkBytes={CHUNK}",
                        "-Dio.sparkstate.batchRows=512", f"-Djava.io.tmpdir={tmp_path}", heap="256m")
    out = subprocess.run([*cmd, str(tmp_path / "ckpt" / "state"), sys.executable], capture_output=True, text=True,
                         timeout=240)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert "CLOSED" in lines, (out.stdout, out.stderr[-3000:])
    assert int(lines["LIMIT"]) == LIMIT
    total, *kinds = lines["MAX"].split()
    most = {k: int(v) for k, v in (kv.split("=") for kv in kinds)}
    for kind in ("rows", "runs", "cache", "changes", "stream", "arrow"):
        assert most.get(kind, 0) > 0, f"no {kind} was ever charged to the budget: {most}"
    record = int(lines["RECORD"])
    # the load's Arrow batch (the worker's, up to 16,384 rows: here the whole version) is read whole; the rest
    # makes room for it (rows spill)
    slack = CHECK_EVERY * (record + 64) + 4 * CHUNK + (64 << 10) + most["arrow"]
    assert int(total) <= LIMIT + slack, f"the budget reached {total} bytes ({most}): {int(total) - LIMIT} over its " \
                                        f"limit, {slack} allowed"
    assert lines["COMMITTED"] == "changes=0 stream=0", lines["COMMITTED"]
    assert lines["LOADED"] == lines["EXPECTED"]
    closed = {k: int(v) for k, v in (kv.split("=") for kv in lines["CLOSED"].split())}
    assert all(v == 0 for v in closed.values()), f"with both providers closed the budget still holds {closed}"
