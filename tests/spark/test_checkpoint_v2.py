"""Spark's checkpoint format v2 (``spark.sql.streaming.stateStore.checkpointFormatVersion=2``): every state store
version is named by a checkpoint id, Spark's commit log records the id of the attempt that won, and the next
batch (or a restart) loads exactly that commit. spark_state's checkpoint id is the commit id of the version's
manifest, and each commit's manifest stays loadable by it (``chk-N/_metadata-<id>``; docs/consistency.md,
rule 7). Spark's HDFS provider refuses format v2, so the twin here is Spark's RocksDB provider with format v2."""

from __future__ import annotations

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
    marker.write_text(json.dumps({"stores": str(twin.test.checkpoint / "state" / "0" / "[0-9]*")}))
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

def test_real_time_mode_is_refused_by_spark_itself_for_any_provider_but_rocksdb(spark, tmp_path):
    """Spark 4.3's real-time mode (``trigger(realTime=...)``) turns checkpoint format v2 on, which spark_state now
    runs, but Spark itself refuses to start a real-time query unless ``providerClass`` is its RocksDB provider
    (``STREAMING_REAL_TIME_MODE.SQL_CONFIGURATION_NOT_SUPPORTED``; no setting relaxes it): a real-time query cannot
    run on spark_state, whatever spark_state supports. This test notices when a Spark lifts that rule."""
    from tests.support.realtime import RealTimeQuery, has_real_time_mode

    if not has_real_time_mode(spark):
        pytest.skip("this Spark has no real-time mode (Spark 4.3+)")
    query = RealTimeQuery(spark, lambda df: df.groupBy("k").agg(F.sum("v").alias("sum")), tmp_path / "ckpt",
                          "spark_state", "update")
    with pytest.raises(Exception, match=r"(?s)SQL_CONFIGURATION_NOT_SUPPORTED.*providerClass must be "
                                        r"org\.apache\.spark\.sql\.execution\.streaming\.state\.RocksDBStateStoreProvider"):
        query.run([("a", 1)], lambda rows: True, timeout=60)
