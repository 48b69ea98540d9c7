"""Rescale on real queries (Spark's offline-repartition contract, metadata only): 3 -> 6 -> 2
partitions between phases gives exactly the output of the same query on the HDFS provider that never
rescaled, for every kind of stateful operator; the restarted query really runs with the new count;
bad input fails clearly and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spark_state import PROVIDER_CLASS, rescale as top_level_rescale
from spark_state.chain.references import REFS_DIR
from spark_state.errors import CheckpointError
from spark_state.format.manifest import ManifestFormat
from spark_state.lifecycle import rescale, restore, savepoint
from spark_state.spark.checkpoint import SparkCheckpoint
from spark_state.storage.layout import StoreId
from tests.support.lifecycle import cli, cli_json
from tests.support.scenarios import SCENARIOS
from tests.support.spark import JsonStream, Query, Twin, rm_rf, statestore_rows

SHUFFLE = "spark.sql.shuffle.partitions"


pytestmark = pytest.mark.spark_state_only("rescale is spark_state's")


def _offsets_conf(checkpoint: Path, batch: int) -> dict:
    lines = (Path(checkpoint) / "offsets" / str(batch)).read_text().splitlines()
    return json.loads(lines[1])["conf"]


def _versions(checkpoint: Path, operator: int, partition: int, store: str = "default") -> list[int]:
    root = Path(checkpoint) / "state" / str(operator) / str(partition)
    root = root if store == "default" else root / store
    if not root.exists():
        return []
    return sorted(int(p.name[4:]) for p in root.iterdir() if p.name.startswith("chk-") and (p / "_metadata").exists())


def _listing(checkpoint: Path) -> dict[str, bytes]:
    return {str(p.relative_to(checkpoint)): p.read_bytes() for p in sorted(Path(checkpoint).rglob("*")) if p.is_file()}


def _last_committed(checkpoint: Path) -> int:
    return max(int(p.name) for p in (Path(checkpoint) / "commits").iterdir() if p.name.isdigit())


def _routed_exactly(checkpoint: Path, old_n: int, new_n: int, version: int) -> None:
    """Every new partition's rescaled state holds exactly the rows Spark routes to it: all of the old rows,
    each once, each in partition pmod(hash, new_n) (output alone would not show a row in a partition
    that never sees its key)."""
    ckpt = SparkCheckpoint(str(checkpoint))
    stores = {(sid.operator, sid.name) for sid in ckpt.stores(_last_committed(checkpoint))}
    for op, name in stores:
        before = [ckpt.store(StoreId(op, p, name)).load(version - 1) for p in range(old_n)]
        after = []
        for p in range(new_n):
            table = ckpt.store(StoreId(op, p, name)).load(version)
            hashes = table.column("hash").to_numpy()
            assert (np.mod(hashes.astype(np.int64), new_n) == p).all(), (op, name, p)
            after += table.select(["key", "value"]).to_pylist()
        old = [row for t in before for row in t.select(["key", "value"]).to_pylist()]
        assert sorted(map(repr, after)) == sorted(map(repr, old)), (op, name)


def _ran_with(checkpoint: Path, stores: dict, n: int, since_version: int) -> None:
    """The query committed state after the rescale in every partition of `n`, with `n` pinned in its offsets."""
    last = _last_committed(checkpoint)
    assert _offsets_conf(checkpoint, last)[SHUFFLE] == str(n)
    for op, names in stores.items():
        for name in names:
            for p in range(n):
                assert max(_versions(checkpoint, op, p, name)) > since_version, (op, p, name)
            beyond = _versions(checkpoint, op, n, name)
            assert not beyond or max(beyond) <= since_version, (op, n, name, beyond)


@pytest.mark.parametrize("name,max_parallelism", [
    ("agg_update", None), ("dedup", 15), ("session_window", None), ("join_inner", 15),
    ("apply_in_pandas_then_window_agg", None),
])
def test_rescale_3_to_6_to_2_gives_exactly_the_output_of_a_query_that_never_rescaled(
        spark, tested, tmp_path, name, max_parallelism):
    """Spark's repartition scenario. Max parallelism 15: 6 and 2 do not divide it, so a slice reads
    the key groups that can hold its rows and filters them by the stored hash; the default 100800:
    every count divides it, whole key groups by byte range."""
    scenario = SCENARIOS[name]
    streams = {n: JsonStream(tmp_path / n, schema) for n, schema in scenario.streams.items()}
    phases = [scenario.phases[0], scenario.phases[1][:1], scenario.phases[1][1:]]

    def build(session):
        return scenario.build(session, **{n: s.read(session) for n, s in streams.items()})

    options = {} if max_parallelism is None else {"max_parallelism": max_parallelism}
    twin = Twin(spark, tmp_path, build, mode=scenario.mode, tested=tested, options=options,
                conf={**scenario.conf, SHUFFLE: "3"})
    counts = [3, 6, 2]
    for i, phase in enumerate(phases):
        for step in phase:
            for n, rows in step.items():
                streams[n].add(rows)
        twin.run()
        if i:
            _ran_with(twin.test.checkpoint, scenario.stores, counts[i], rescaled.state_version)
        if i + 1 < len(phases):
            rescaled = rescale(str(twin.test.checkpoint), counts[i + 1])
            assert (rescaled.old_partitions, rescaled.new_partitions) == (counts[i], counts[i + 1])
            assert rescaled.batch == _last_committed(twin.test.checkpoint)
            assert _offsets_conf(twin.test.checkpoint, rescaled.batch)[SHUFFLE] == str(counts[i + 1])
            _routed_exactly(twin.test.checkpoint, counts[i], counts[i + 1], rescaled.state_version)
    # The rescale batches produce no output; every other batch's output is the HDFS query's, in order.
    assert [rows for _, rows in sorted(twin.test.outputs.items())] == \
        [rows for _, rows in sorted(twin.ref.outputs.items())]
    assert twin.ref.rows(), "the scenario produced no output; it checks nothing"
    assert _offsets_conf(twin.ref.checkpoint, _last_committed(twin.ref.checkpoint))[SHUFFLE] == "3"


def test_applyinpandaswithstate_timeouts_survive_a_rescale_to_a_count_that_divides_nothing(spark, finished, tmp_path):
    """Roll back to batch 1, rescale 2 -> 11 (11 divides no max parallelism here: hash filter), replay:
    the same outputs, event-time timeouts included; a savepoint of the rescaled checkpoint carries the
    other partitions' files it names and restores to the same outputs."""
    original = finished.query
    ckpt = tmp_path / "rolled-back"
    restore(str(finished.checkpoint), str(ckpt), batch=1)
    state_before = statestore_rows(spark, ckpt)
    result = top_level_rescale(str(ckpt), 11)
    # Spark's own state reader sees the same rows at the rescale batch, each in the partition Spark routes it to.
    state_after = statestore_rows(spark, ckpt)
    assert state_before and sorted(r[:-1] for r in state_after) == sorted(r[:-1] for r in state_before)
    assert {r[-1] for r in state_after} - set(range(11)) == set() and len({r[-1] for r in state_after}) > 2
    assert (result.batch, result.state_version, result.old_partitions, result.new_partitions) == (2, 3, 2, 11)
    assert result.manifests == 11 and result.references > 0
    assert any((ckpt / "state" / "0" / str(p) / REFS_DIR).exists() for p in range(2))
    # A savepoint and a restore of the rescaled batch are self-contained.
    restored = tmp_path / "restored"
    restore(savepoint(str(ckpt), str(tmp_path / "sp")), str(restored))
    rm_rf(ckpt / "state" / "0" / "0" / "shared")   # the restored copy needs nothing of the source
    rm_rf(ckpt / "state" / "0" / "1" / "shared")
    replay = finished.query_on(restored)
    assert replay.run() == [3, 4, 5]
    assert [replay.outputs[b] for b in (3, 4, 5)] == [original.outputs[b] for b in (2, 3, 4)]
    assert any(row[-1] == "timeout" for b in (4, 5) for row in replay.outputs[b]), "no event-time timeout replayed"
    _ran_with(restored, {0: ["default"]}, 11, 3)


def test_cli_rescale_then_the_query_runs_with_the_new_count(finished, tmp_path):
    original = finished.query
    ckpt = tmp_path / "rolled-back"
    restore(str(finished.checkpoint), str(ckpt), batch=1)
    code, body = cli_json("rescale", ckpt, "3")
    assert code == 0 and body["ok"] and body["old_partitions"] == 2 and body["new_partitions"] == 3
    assert body["batch"] == 2 and body["bytes_written"] > 0
    # The tools follow a rescaled chain into the other partitions' stores.
    code, checked = cli_json("validate", ckpt)
    assert code == 0 and checked["ok"] and not checked["problems"]
    code, store = cli_json("inspect", ckpt, "-o", "0", "-p", "2")
    assert store["version"] == 3 and store["format"] == ManifestFormat.TYPED and store["rows"] > 0   # sliced, typed files
    assert {f.get("partition") for f in store["chain"]} == {0, 1}
    assert "in partition 1's store" in cli("inspect", ckpt, "-o", "0", "-p", "2").stdout
    done = cli("rescale", ckpt, "1")
    assert "from 3 to 1 partitions at batch 3" in done.stdout
    replay = finished.query_on(ckpt)
    assert replay.run() == [4, 5, 6]
    assert [replay.outputs[b] for b in (4, 5, 6)] == [original.outputs[b] for b in (2, 3, 4)]
    _ran_with(ckpt, {0: ["default"]}, 1, 4)
    # A broken file of another store that a retained manifest names is found by validate.
    rescaled = json.loads((ckpt / "state" / "0" / "0" / "chk-4" / "_metadata").read_text())
    victim = ckpt / "state" / "0" / "1" / next(f["path"] for f in rescaled["files"] if f.get("partition") == 1)
    victim.write_bytes(victim.read_bytes()[:-3])
    code, checked = cli_json("validate", ckpt, check=False)
    assert code == 1 and any(victim.name in p["file"] for p in checked["problems"])


@pytest.mark.parametrize("count,says", [
    (0, "must be at least 1, got 0"), (-3, "must be at least 1, got -3"), (2, "already runs with 2 partitions"),
])
def test_bad_counts_are_refused_and_nothing_is_written(finished, tmp_path, count, says):
    ckpt = finished.copy(tmp_path / "ckpt")
    before = _listing(ckpt)
    with pytest.raises(CheckpointError, match=says):
        rescale(str(ckpt), count)
    assert _listing(ckpt) == before
    done = cli("rescale", ckpt, str(count), check=False)
    assert done.returncode == 2 and says in done.stderr
    assert _listing(ckpt) == before


def test_more_partitions_than_key_groups_are_refused_up_front(finished, tmp_path):
    """A partition count above maxParallelism (100800 here) would leave partitions without a key group: refused
    at once (it used to plan for an hour), naming the option, and nothing is written."""
    ckpt = finished.copy(tmp_path / "ckpt")
    before = _listing(ckpt)
    done = cli("rescale", ckpt, "200000", check=False, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "200000 partitions exceed maxParallelism 100800" in done.stderr, done.stderr
    assert _listing(ckpt) == before
    assert cli_json("ls", ckpt)[1]["num_partitions"] == 2


def test_every_phase_of_a_rescale_shows_progress(finished, tmp_path):
    """Reading, planning (its cost grows with the count) and writing each report progress, one unit per store."""
    from contextlib import contextmanager

    from spark_state.lifecycle.progress import Progress, Task

    class Recorded(Progress):
        def __init__(self):
            self.tasks = []

        @contextmanager
        def task(self, description, total):
            done = self.tasks.append([description, total, 0]) or self.tasks[-1]

            class Counting(Task):
                def advance(self, amount=1):
                    done[2] += amount
            yield Counting()

    ckpt = finished.copy(tmp_path / "ckpt")
    progress = Recorded()
    rescale(str(ckpt), 5, progress=progress)
    assert [d.split()[0] for d, _, _ in progress.tasks] == ["reading", "planning", "writing"]
    assert all(total == count for _, total, count in progress.tasks), progress.tasks
    assert progress.tasks[1][1] == 5


def test_a_checkpoint_of_another_provider_or_none_at_all_is_refused(spark, finished, tmp_path):
    hdfs = Query(spark, finished.query.build, tmp_path / "hdfs", mode="update", provider="hdfs")
    hdfs.run()
    before = _listing(hdfs.checkpoint)
    with pytest.raises(CheckpointError, match=f"not a spark_state checkpoint.*HDFSBackedStateStoreProvider.*"
                                              f"{PROVIDER_CLASS}"):
        rescale(str(hdfs.checkpoint), 4)
    assert _listing(hdfs.checkpoint) == before
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is not a Spark checkpoint"):
        rescale(str(tmp_path / "empty"), 4)


def test_memory_storage_is_refused_with_the_fix(finished, tmp_path):
    ckpt = finished.copy(tmp_path / "ckpt")
    before = _listing(ckpt)
    with pytest.raises(CheckpointError, match="memory storage .* Use storage=filesystem"):
        rescale(str(ckpt), 4, options={"storage": "memory"})
    assert _listing(ckpt) == before


def test_a_last_batch_that_did_not_commit_is_refused_and_nothing_is_written(finished, tmp_path):
    ckpt = finished.copy(tmp_path / "ckpt")
    (ckpt / "commits" / "4").unlink()   # batch 4 started (offsets/4) but failed before its commit
    before = _listing(ckpt)
    with pytest.raises(CheckpointError, match=r"batch 4 .* did not commit \(last committed: 3\).*Stop the query, or "
                                              r"restart it and let it commit a batch"):
        rescale(str(ckpt), 3)
    assert _listing(ckpt) == before


def test_a_running_query_is_refused(spark, finished, tmp_path):
    ckpt = finished.copy(tmp_path / "ckpt")
    query = finished.query_on(ckpt)
    from tests.support.spark import provider_conf, sql_conf

    with sql_conf(spark, provider_conf("spark_state")):
        running = (query.build(spark).writeStream.outputMode("update").option("checkpointLocation", str(ckpt))
                   .foreachBatch(lambda df, b: None).trigger(processingTime="1 hour").start())
    try:
        running.processAllAvailable()
        before = _listing(ckpt)
        with pytest.raises(CheckpointError, match=f"query {running.id} is running .* stop it"):
            rescale(str(ckpt), 3)
        assert _listing(ckpt) == before
    finally:
        running.stop()
    rescale(str(ckpt), 3)   # stopped: fine


def test_an_interrupted_rescale_is_finished_by_running_it_again(finished, tmp_path):
    """A rescale that died before its commit leaves batch 5 uncommitted: another count is refused,
    the same count finishes it, and the query then resumes with it."""
    original = finished.query
    ckpt = tmp_path / "rolled-back"
    restore(str(finished.checkpoint), str(ckpt), batch=1)
    rescale(str(ckpt), 4)
    (ckpt / "commits" / "2").unlink()   # the rescale's last write never happened
    with pytest.raises(CheckpointError, match="unfinished rescale to 4 partitions; run the rescale to 4 again"):
        rescale(str(ckpt), 5)
    with pytest.raises(CheckpointError, match=f"or go back to the state before it: spark-state restore file://{ckpt} "
                                              f"NEW --batch 1"):
        rescale(str(ckpt), 5)
    again = rescale(str(ckpt), 4)
    assert again.batch == 2 and (ckpt / "commits" / "2").exists()
    replay = finished.query_on(ckpt)
    assert replay.run() == [3, 4, 5]
    assert [replay.outputs[b] for b in (3, 4, 5)] == [original.outputs[b] for b in (2, 3, 4)]


def test_state_under_a_checkpoint_root_is_rescaled_there(spark, tmp_path):
    """checkpointRoot: stores live under the root, keyed by the query id; rescale finds them with the
    same option, writes nothing beside the checkpoint, and the restarted query reads them."""
    from spark_state.options import PREFIX
    from tests.support.running_total import PHASES, twin_under_a_checkpoint_root

    twin, events, root = twin_under_a_checkpoint_root(spark, tmp_path)
    ref, test = twin.ref, twin.test
    with pytest.raises(CheckpointError, match=r"has no version .* set .*checkpointRoot, pass it"):
        rescale(str(test.checkpoint), 5)   # without the option: says where it looked and what to pass
    result = rescale(str(test.checkpoint), 5, options={PREFIX + "checkpointRoot": root["checkpoint_root"]})
    assert result.new_partitions == 5
    assert not list(test.checkpoint.rglob("*.arrow"))
    assert not list((test.checkpoint / "state").rglob("chk-*")), "state must stay under the root"
    events.add_all(PHASES[1])
    twin.run()
    assert [rows for _, rows in sorted(test.outputs.items())] == [rows for _, rows in sorted(ref.outputs.items())]
    assert sorted((tmp_path / "root").glob("*/0/4/default/chk-*")), "partition 4 of 5 committed under the root"
