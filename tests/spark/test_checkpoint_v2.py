"""Spark's checkpoint format v2 (``spark.sql.streaming.stateStore.checkpointFormatVersion=2``): every state store
version is named by a checkpoint id, Spark's commit log records the id of the attempt that won, and the next
batch (or a restart) loads exactly that commit. spark_state's checkpoint id is the commit id of the version's
manifest, and each commit's manifest stays loadable by it (``chk-N/_metadata-<id>``; docs/consistency.md,
rule 7). Spark's HDFS provider refuses format v2, so the twin here is Spark's RocksDB provider with format v2."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_state.errors import CheckpointError
from spark_state.spark.files import parse_commit
from spark_state.storage.layout import lineage_name
from tests.support.running_total import PHASES, SCHEMA, flaky_running_total, query_with_hook as _query
from tests.support.scenarios import SCENARIOS, run_scenario
from tests.support.spark import CHECKPOINT_FORMAT, JsonStream, QueryFailed, Twin

pytestmark = pytest.mark.spark_state_only("checks spark_state's checkpoint ids")

V2 = {CHECKPOINT_FORMAT: "2"}


def committed_ids(checkpoint: Path, batch: int) -> dict[int, list[list[str]]]:
    """``stateUniqueIds`` of Spark's commit log entry of `batch`: operator -> partition -> one id per store."""
    entry = parse_commit((checkpoint / "commits" / str(batch)).read_bytes(), f"commits/{batch}")
    return {int(op): ids for op, ids in (entry.get("stateUniqueIds") or {}).items()}


def store_dirs(checkpoint: Path, operator: int, partition: int, stores: list[str]) -> list[Path]:
    base = checkpoint / "state" / str(operator) / str(partition)
    return [base if name == "default" else base / name for name in stores]


def manifest(store: Path, version: int, name: str = "_metadata") -> dict:
    return json.loads((store / f"chk-{version}" / name).read_text())


def assert_commit_log_names_stored_commits(checkpoint: Path, scenario) -> None:
    """Every id of every committed batch is a commit id storage holds for that store's version batch + 1."""
    batches = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for batch in batches[-2:]:   # retention keeps the newest versions only
        ids = committed_ids(checkpoint, batch)
        assert set(ids) == set(scenario.stores), f"commits/{batch} names operators {sorted(ids)}"
        for op, stores in scenario.stores.items():
            for partition, per_store in enumerate(ids[op]):
                assert len(per_store) == len(stores)
                for store, ckpt_id in zip(store_dirs(checkpoint, op, partition, stores), per_store):
                    lineage = manifest(store, batch + 1, lineage_name(ckpt_id))
                    assert lineage["commit_id"] == ckpt_id and lineage["version"] == batch + 1


@pytest.mark.parametrize("name", ["agg_update", "dedup_watermark", "join_inner", "session_window",
                                  "apply_in_pandas_then_window_agg"])
def test_queries_with_checkpoint_format_v2_match_rocksdb_and_restart_exactly(spark, tested, tmp_path, name):
    """Each query runs two phases (stopped and restarted from its checkpoint in between) on spark_state and on
    RocksDB, both with format v2: the same output batch by batch, and the commit log names commits storage holds."""
    scenario = SCENARIOS[name]
    twin = run_scenario(spark, tmp_path, scenario, tested=tested, conf=V2, reference="rocksdb")
    twin.assert_same()
    assert len(twin.test.outputs) >= 4
    assert_commit_log_names_stored_commits(twin.test.checkpoint, scenario)
    assert committed_ids(twin.ref.checkpoint, twin.ref.last_batch()), "RocksDB's twin did not run with format v2"


def test_a_rerun_batch_leaves_two_lineages_and_the_committed_one_is_restored(spark, tested, tmp_path):
    """A batch that failed after a partition committed its state is re-run on restart: that version now has two
    commits (lineages). The one Spark's commit log names is restored, even when the other attempt's manifest is
    the version's latest (as when a zombie attempt of the batch writes last): the run after it matches RocksDB."""
    events = JsonStream(tmp_path / "events", SCHEMA)
    marker = tmp_path / "fail-once"
    twin = Twin(spark, tmp_path / "twin", _query(events, flaky_running_total, marker), mode="update", tested=tested,
                options={"storage": "filesystem"}, conf=V2, reference="rocksdb")
    twin.ref.build = _query(events, flaky_running_total, tmp_path / "never-exists")
    events.add_all(PHASES[0])
    twin.run()
    events.add_all(PHASES[1])
    twin.ref.run()
    # the partition of key "a" fails once the other partition has committed the batch's version (a lineage)
    version = twin.test.last_batch() + 2
    lineages = str(twin.test.checkpoint / "state" / "0" / "*" / f"chk-{version}" / "_metadata-*")
    marker.write_text(json.dumps({"glob": lineages, "more_than": len(glob.glob(lineages))}))
    with pytest.raises(QueryFailed, match="injected failure"):
        twin.test.run()
    assert not marker.exists(), "the failure was not injected"
    twin.test.run()   # the restart re-runs the failed batch
    twin.assert_same()

    ckpt = twin.test.checkpoint
    # the re-run versions: a store version with two lineage manifests, one of them named by the commit log
    rerun = []
    for batch in sorted(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit()):
        for partition, (ckpt_id,) in enumerate(committed_ids(ckpt, batch)[0]):
            chk = ckpt / "state" / "0" / str(partition) / f"chk-{batch + 1}"
            lineages = {p.name for p in chk.glob("_metadata-*")} if chk.exists() else set()
            others = lineages - {lineage_name(ckpt_id)}
            if others:
                assert lineage_name(ckpt_id) in lineages
                rerun.append((chk, ckpt_id, others))
    assert rerun, "no version was committed twice: the failed batch committed nothing before failing"
    # the other attempt's commit becomes each version's latest manifest, as if it had landed after the winner
    for chk, ckpt_id, others in rerun:
        shutil.copyfile(chk / sorted(others)[0], chk / "_metadata")
        assert manifest(chk.parent, int(chk.name[4:]))["commit_id"] != ckpt_id
    # the tools read the lineage the commit log names, and refuse to rewrite a format v2 checkpoint's logs
    import spark_state

    state = spark_state.read_state(str(ckpt), options={"storage": "filesystem"})
    keys = [key["k"] for key in state.column("key").to_pylist()]
    assert keys and set(keys) <= {row[0] for row in twin.ref.rows()} and len(keys) == len(set(keys))
    with pytest.raises(CheckpointError, match="checkpoint format v2"):
        spark_state.rescale(str(ckpt), 3, options={"storage": "filesystem"})
    events.add_all([[{"k": "a", "v": 100, "ts": "2026-01-01T00:10:00.000000Z"},
                     {"k": "b", "v": 1000, "ts": "2026-01-01T00:10:00.000000Z"}]])
    twin.run()
    twin.assert_same()


# ----------------------------------------------------------------- Spark 4.3's real-time mode

RT_PHASES = [
    [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)],
    [("a", 10), ("d", 20), ("c", 30), ("b", 40)],
]


def _latest_per_key(rows: list[dict]) -> dict:
    """The aggregation's state as its update-mode output shows it: each key's largest running sum."""
    out: dict = {}
    for row in rows:
        out[row["k"]] = max(out.get(row["k"], row["sum"]), row["sum"])
    return out


def _expected_sums(phases) -> dict:
    sums: dict = {}
    for key, value in (r for phase in phases for r in phase):
        sums[key] = sums.get(key, 0) + value
    return sums


@pytest.mark.parametrize("operator", ["aggregation", "dropDuplicates"])
def test_real_time_mode_stateful_queries_run_out_of_the_box_and_restart_exactly(spark, tmp_path, operator):
    """A real-time query (Spark 4.3's ``trigger(realTime=...)``, which turns checkpoint format v2 on by itself)
    runs on spark_state with no extra setting, is stopped and restarted from its checkpoint, and its output is
    RocksDB's: each key's running sum continues across the restart; each key is emitted once by dropDuplicates."""
    from tests.support.realtime import RealTimeQuery, has_real_time_mode

    if not has_real_time_mode(spark):
        pytest.skip("this Spark has no real-time mode (Spark 4.3+)")
    assert spark.conf.get(CHECKPOINT_FORMAT, None) is None, "the session must leave the format to real-time mode"
    if operator == "aggregation":
        def build(df):
            return df.groupBy("k").agg(F.sum("v").alias("sum"))
        mode = "update"
    else:
        def build(df):
            return df.dropDuplicates(["k"])
        mode = "append"
    queries = {p: RealTimeQuery(spark, build, tmp_path / f"ckpt-{p}", p, mode) for p in ("rocksdb", "spark_state")}
    for i in range(len(RT_PHASES)):
        expected = _expected_sums(RT_PHASES[:i + 1])
        for query in queries.values():
            if operator == "aggregation":
                query.run(RT_PHASES[i], lambda rows: _latest_per_key(rows) == expected)
            else:
                query.run(RT_PHASES[i], lambda rows: {r["k"] for r in rows} == set(expected))
    ours, rocksdb = queries["spark_state"], queries["rocksdb"]
    if operator == "aggregation":
        assert _latest_per_key(ours.rows()) == _latest_per_key(rocksdb.rows()) == _expected_sums(RT_PHASES)
    else:
        keys = sorted(r["k"] for r in ours.rows())
        assert keys == sorted(r["k"] for r in rocksdb.rows()) == sorted(_expected_sums(RT_PHASES)), \
            "a key was emitted twice or not at all: the restart lost or doubled dropDuplicates' state"
    # real-time mode ran with checkpoint ids, and every id the commit log names is a commit storage holds
    last = ours.checkpoint / "commits"
    batch = max(int(p.name) for p in last.iterdir() if p.name.isdigit())
    ids = committed_ids(ours.checkpoint, batch)
    assert ids, "the real-time query ran without checkpoint ids"
    for op, partitions in ids.items():
        for partition, (ckpt_id,) in enumerate(partitions):
            store = ours.checkpoint / "state" / str(op) / str(partition)
            assert manifest(store, batch + 1, lineage_name(ckpt_id))["commit_id"] == ckpt_id
