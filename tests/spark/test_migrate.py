"""Migration between Spark's state store providers and spark_state on real queries.

Round trips: a query runs on a source provider (Spark's HDFS provider, RocksDB, RocksDB with
changelog checkpointing), is migrated to spark_state and runs a phase there, is migrated back to
Spark's HDFS provider and runs the last phase there; meanwhile the original query continues on its
own provider over the same input, and every migrated phase's output must be its output batch by
batch. Every operator docs/guarantees.md supports runs once in the default suite (each with one source
provider); ``--run-slow`` runs every operator from every source provider.

Also: the migrated stores are the stores the shim writes (hashes, key groups, schemas, rows), and
bad input is refused before anything is written.
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from spark_state import PROVIDER_CLASS
from spark_state.lifecycle.migrate import HDFS_PROVIDER, ROCKSDB_PROVIDER, migrate
from spark_state.lifecycle.progress import Progress, Task
from spark_state.options import PREFIX
from spark_state.errors import CheckpointError
from spark_state.format.manifest import Manifest
from tests.support.lifecycle import cli, cli_json
from tests.support.scenarios import SCENARIOS
from tests.support.spark import NO_DATA_BATCHES, JsonStream, Query, arrow_rows, statestore_rows
from tests.support.stores import open_stored
from tests.support.running_total import PHASES as AIP_PHASES
from tests.support.running_total import SCHEMA as AIP_SCHEMA
from tests.support.running_total import build_query

ROCKSDB = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER}
SOURCES = {
    "hdfs": {},
    "rocksdb": ROCKSDB,
    "rocksdb_changelog": {**ROCKSDB, "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"},
}


pytestmark = pytest.mark.spark_state_only("migration is to and from spark_state")


# ----------------------------------------------------------------------------- round trips

@dataclass
class Workload:
    """A query and its input as steps (one file per stream = one micro-batch each)."""

    build: object        # build(spark, streams) -> streaming DataFrame
    mode: str
    streams: dict
    steps: list
    conf: dict


def _scenario(name: str) -> Workload:
    s = SCENARIOS[name]
    return Workload(lambda spark, streams: s.build(spark, **{n: st.read(spark) for n, st in streams.items()}),
                    s.mode, s.streams, [step for phase in s.phases for step in phase], s.conf)


def _apply_in_pandas(timeout: str) -> Workload:
    conf = {NO_DATA_BATCHES: "false"} if timeout == "ProcessingTimeTimeout" else {}
    return Workload(lambda spark, streams: build_query(streams["events"], timeout, "update")(spark), "update",
                    {"events": AIP_SCHEMA}, [{"events": rows} for phase in AIP_PHASES for rows in phase], conf)


WORKLOADS = {name: functools.partial(_scenario, name) for name in SCENARIOS}
WORKLOADS["apply_in_pandas_event_time_timeout"] = functools.partial(_apply_in_pandas, "EventTimeTimeout")
WORKLOADS["apply_in_pandas_processing_time_timeout"] = functools.partial(_apply_in_pandas, "ProcessingTimeTimeout")

#: Every operator kind once, the source providers taking turns (the default suite).
ROUND_TRIPS = [
    ("agg_update", "hdfs"),
    ("window_agg_append", "rocksdb_changelog"),
    ("dedup", "rocksdb"),
    ("dedup_watermark", "hdfs"),
    ("dedup_within_watermark", "rocksdb_changelog"),
    ("session_window", "rocksdb"),
    ("join_left_outer", "hdfs"),
    ("apply_in_pandas_then_window_agg", "rocksdb_changelog"),
    ("apply_in_pandas_event_time_timeout", "rocksdb"),
]
#: Every operator from every source provider (--run-slow).
SLOW_ROUND_TRIPS = [(name, source) for name in WORKLOADS for source in SOURCES if (name, source) not in ROUND_TRIPS]


def _inputs(tmp_path: Path, name: str):
    """Workload `name` over stream files under `tmp_path`: (the workload, build(session) for a Query, add(steps),
    which writes the steps' files)."""
    w = WORKLOADS[name]()
    streams = {n: JsonStream(tmp_path / n, schema) for n, schema in w.streams.items()}

    def build(session):
        return w.build(session, streams)

    def add(steps):
        for step in steps:
            for n, rows in step.items():
                streams[n].add(rows)

    return w, build, add


def _round_trip(spark, tmp_path: Path, name: str, source: str):
    """Phase 1 on `source`, migrate to spark_state, phase 2 there, migrate to HDFS, phase 3 there; the original
    query runs every phase on `source`. Returns (original, on spark_state, on HDFS, the two migrations)."""
    w, build, add = _inputs(tmp_path, name)
    phases = [w.steps[:2], w.steps[2:3], w.steps[3:]]
    original = Query(spark, build, tmp_path / "original", mode=w.mode, provider="hdfs",
                     conf={**SOURCES[source], **w.conf})
    add(phases[0])
    original.run()
    to_spark_state = migrate(str(original.checkpoint), str(tmp_path / "on-spark-state"))
    on_spark_state = Query(spark, build, tmp_path / "on-spark-state", mode=w.mode, conf=w.conf)
    add(phases[1])
    original.run()
    on_spark_state.run()
    to_hdfs = migrate(str(on_spark_state.checkpoint), str(tmp_path / "on-hdfs"), to="hdfs")
    on_hdfs = Query(spark, build, tmp_path / "on-hdfs", mode=w.mode, provider="hdfs", conf=w.conf)
    add(phases[2])
    original.run()
    on_hdfs.run()
    return original, on_spark_state, on_hdfs, (to_spark_state, to_hdfs)


def _check_round_trip(original: Query, on_spark_state: Query, on_hdfs: Query, migrations, source: str) -> None:
    first, second = migrations
    ends = original.run_ends
    provider = source.removesuffix("_changelog")
    assert (first.batch, first.source_provider, first.target_provider) == (ends[0], provider, "spark_state")
    assert (second.batch, second.source_provider, second.target_provider) == (ends[1], "spark_state", "hdfs")
    for query, after, upto in ((on_spark_state, ends[0], ends[1]), (on_hdfs, ends[1], ends[2])):
        expected = {b: rows for b, rows in original.outputs.items() if after < b <= upto}
        assert expected, f"the original query ran no batch after {after}; the phase checks nothing"
        assert query.outputs == expected, (
            f"output of the migrated query differs from the original continuing on {source}:\n"
            f"  expected {expected}\n  got      {query.outputs}")
    assert any(original.outputs[b] for b in original.outputs if b > ends[0]), "no output after the migration"
    assert first.query_id != first.source_query_id and second.query_id != second.source_query_id


@pytest.mark.parametrize("name,source", ROUND_TRIPS, ids=[f"{n}-from-{s}" for n, s in ROUND_TRIPS])
def test_a_migrated_query_continues_as_the_original_on_its_own_provider(spark, tmp_path, name, source):
    original, on_spark_state, on_hdfs, migrations = _round_trip(spark, tmp_path, name, source)
    _check_round_trip(original, on_spark_state, on_hdfs, migrations, source)
    # The query on HDFS runs on Spark's provider alone: its offset log says so and no spark_state file is there.
    offsets = (on_hdfs.checkpoint / "offsets" / str(on_hdfs.run_ends[-1])).read_text().splitlines()
    assert json.loads(offsets[1])["conf"]["spark.sql.streaming.stateStore.providerClass"] == HDFS_PROVIDER
    assert not [p for p in on_hdfs.checkpoint.rglob("*") if p.name.startswith(("chk-", "shared"))]


@pytest.mark.slow
@pytest.mark.parametrize("name,source", SLOW_ROUND_TRIPS, ids=[f"{n}-from-{s}" for n, s in SLOW_ROUND_TRIPS])
def test_every_operator_from_every_provider_round_trips(spark, tmp_path, name, source):
    _check_round_trip(*_round_trip(spark, tmp_path, name, source), source)


# ----------------------------------------------------------------------------- the exit to RocksDB

#: Every operator kind of docs/guarantees.md once; by default the store kinds that differ (four stores of a join,
#: prefix scans of session windows, timeouts, watermark eviction; plain aggregation runs in the repartition test),
#: every one with ``--run-slow``.
DEFAULT_EXITS = {"join_left_outer", "session_window", "apply_in_pandas_event_time_timeout", "dedup_within_watermark"}
OPERATORS = [name if name in DEFAULT_EXITS else pytest.param(name, marks=pytest.mark.slow)
             for name, _ in ROUND_TRIPS]


def _exit_to_rocksdb(spark, tmp_path: Path, name: str, between=None):
    """Phase 1 on spark_state, migrate to RocksDB, phase 2 there (after ``between(checkpoint)``); a twin query runs
    on RocksDB from the start. Returns (the query that ran on RocksDB from the start, the migrated one, result)."""
    w, build, add = _inputs(tmp_path, name)
    native = Query(spark, build, tmp_path / "native-rocksdb", mode=w.mode, provider="rocksdb", conf=w.conf)
    ours = Query(spark, build, tmp_path / "on-spark-state", mode=w.mode, conf=w.conf)
    add(w.steps[:2])
    native.run()
    ours.run()
    result = migrate(str(ours.checkpoint), str(tmp_path / "on-rocksdb"), to="rocksdb")
    if between is not None:
        between(tmp_path / "on-rocksdb")
    migrated = Query(spark, build, tmp_path / "on-rocksdb", mode=w.mode, provider="rocksdb", conf=w.conf)
    add(w.steps[2:])
    native.run()
    migrated.run()
    return native, migrated, result


@pytest.mark.parametrize("name", OPERATORS)
def test_a_query_migrated_to_rocksdb_continues_as_one_that_ran_on_rocksdb_from_the_start(spark, tmp_path, name):
    native, migrated, result = _exit_to_rocksdb(spark, tmp_path, name)
    assert (result.source_provider, result.target_provider, result.batch) == ("spark_state", "rocksdb",
                                                                            native.run_ends[0])
    expected = {b: rows for b, rows in native.outputs.items() if b > result.batch}
    assert expected and any(expected.values()), "the query ran no batch with output after the migration"
    assert migrated.outputs == expected
    # The migrated query runs on Spark's RocksDB provider alone: its offset log says so, no spark_state file is there
    offsets = (migrated.checkpoint / "offsets" / str(migrated.run_ends[-1])).read_text().splitlines()
    assert json.loads(offsets[1])["conf"]["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB_PROVIDER
    assert not [p for p in migrated.checkpoint.rglob("*") if p.name.startswith(("chk-", "shared"))]


def test_spark_reads_the_rocksdb_state_migrate_wrote_as_the_state_spark_state_held(scenario_run, spark, tmp_path):
    """Spark's own statestore reader finds in the migrated RocksDB checkpoint exactly the rows it finds in the
    spark_state checkpoint it came from, every store of a join included."""
    twin = scenario_run("join_inner")
    result = migrate(str(twin.test.checkpoint), str(tmp_path / "rocksdb"), to="rocksdb")
    compared = 0
    for store in SCENARIOS["join_inner"].stores[0]:
        before = statestore_rows(spark, twin.test.checkpoint, storeName=store)
        after = statestore_rows(spark, tmp_path / "rocksdb", storeName=store)
        assert after == before, f"store {store}"
        compared += len(before)
    assert compared and result.rows == compared


def test_spark_repartitions_a_checkpoint_migrated_to_rocksdb(spark, tmp_path):
    """Spark 4.2+'s offline repartition accepts only RocksDB checkpoints: it runs on one migrated from spark_state,
    and the query then continues with the output of one that ran on RocksDB from the start."""
    if not hasattr(spark, "_streamingCheckpointManager"):
        pytest.skip("Spark's offline repartition is Spark 4.2+")

    def repartition(checkpoint):
        spark._streamingCheckpointManager.repartition(str(checkpoint), 3)

    native, migrated, result = _exit_to_rocksdb(spark, tmp_path, "agg_update", between=repartition)
    after = [rows for b, rows in sorted(native.outputs.items()) if b > result.batch]
    got = [rows for b, rows in sorted(migrated.outputs.items()) if b > result.batch + 1]
    assert after and got == after, "the repartitioned query's output differs from the one that ran on RocksDB"
    offsets = (migrated.checkpoint / "offsets" / str(migrated.run_ends[-1])).read_text().splitlines()
    assert json.loads(offsets[1])["conf"]["spark.sql.shuffle.partitions"] == "3"


def test_apply_in_pandas_with_state_on_spark_state_moves_to_transform_with_state_on_rocksdb(spark, tmp_path):
    """docs/operating.md, "Moving to transformWithState": the state an applyInPandasWithState query kept on
    spark_state, read with Spark's state reader, is the initialState of a transformWithStateInPandas query on
    RocksDB, which goes on from there: its output is the original query's, continuing."""
    from pyspark.sql import functions as F

    from tests.support.transform_with_state import TotalProcessor

    events = JsonStream(tmp_path / "events", AIP_SCHEMA)
    original = Query(spark, build_query(events, "NoTimeout", "update"), tmp_path / "ckpt", mode="update")
    events.add_all(AIP_PHASES[0])
    original.run()
    # the move: the old query's state at its last batch, as the new query's initial state
    state = (spark.read.format("statestore").load(str(original.checkpoint))
             .select(F.col("key.k").alias("k"), F.col("value.groupState.total").alias("total"),
                     F.col("value.groupState.n").alias("n")))
    initial = spark.createDataFrame(state.collect(), state.schema)   # read once, before the old query goes on
    assert initial.count() == len({r["k"] for phase in AIP_PHASES[:1] for f in phase for r in f})
    new_events = JsonStream(tmp_path / "new-events", AIP_SCHEMA)   # the new query reads only what comes next

    def build(session):
        return new_events.read(session).groupBy("k").transformWithStateInPandas(
            statefulProcessor=TotalProcessor(), outputStructType="k string, total long, n long, kind string",
            outputMode="Update", timeMode="None", initialState=initial.groupBy("k"))

    moved = Query(spark, build, tmp_path / "ckpt-tws", mode="update", provider="rocksdb")
    before = set(original.outputs)
    for rows in AIP_PHASES[1]:
        events.add(rows)
        new_events.add(rows)
    original.run()
    moved.run()
    expected = sorted((r for b, rows in original.outputs.items() if b not in before for r in rows), key=repr)
    assert expected and moved.rows() == expected


# ------------------------------------------------------------------ what the migrated stores hold

@pytest.mark.parametrize("name", ["agg_update", "join_inner", "session_window", "apply_in_pandas_then_window_agg"])
def test_migrated_stores_are_what_the_shim_writes(scenario_run, tmp_path, name):
    """The same query on HDFS, migrated, gives every store the rows, hashes, key groups and schema the shim gave
    the query that ran on spark_state: the hash covers the key fields Spark partitions by (all of them, the
    session window's grouping keys, a join's key without its index)."""
    twin = scenario_run(name)
    result = migrate(str(twin.ref.checkpoint), str(tmp_path / "migrated"))
    assert result.batch == twin.test.run_ends[-1] == twin.ref.run_ends[-1]
    version = result.batch + 1
    compared = 0
    for op, names in SCENARIOS[name].stores.items():
        for store in names:
            for p in (0, 1):
                shim = open_stored(twin.test.checkpoint, op, p, store).load(version)
                mine = open_stored(tmp_path / "migrated", op, p, store).load(version)
                assert _loose(mine.schema) == _loose(shim.schema), f"operator {op} {store} {p}:\n{mine.schema}\n{shim.schema}"
                assert arrow_rows(mine) == arrow_rows(shim), f"operator {op} {store} partition {p}"
                compared += shim.num_rows
    assert compared, "no state to compare; the scenario checks nothing"


def _loose(schema):
    """A schema's names and types without nullability, field metadata as parsed JSON. A migration knows the
    state schema from Spark's schema file, whose fields are all nullable; the shim gets the running operator's,
    where a join's key columns are not null. Nullability does not change how Arrow stores a value."""
    def field(f):
        meta = {k: json.loads(v) for k, v in (f.metadata or {}).items()}
        return (f.name, kind(f.type), meta)

    def kind(t):
        if pa.types.is_struct(t):
            return ("struct", tuple(field(t.field(i)) for i in range(t.num_fields)))
        return str(t)

    return tuple(field(f) for f in schema)


def test_migrated_state_reads_back_as_the_source_state_and_timeouts_are_kept(spark, tmp_path):
    """applyInPandasWithState's event-time timeouts: the state values, timeout timestamps included, are the
    source's, in both directions; the source checkpoint is left as it was."""
    events = JsonStream(tmp_path / "events", AIP_SCHEMA)
    for rows in AIP_PHASES[0]:
        events.add(rows)
    query = Query(spark, build_query(events, "EventTimeTimeout", "update"), tmp_path / "hdfs", provider="hdfs")
    query.run()
    before = sorted((p.relative_to(query.checkpoint), p.stat().st_size) for p in query.checkpoint.rglob("*"))
    migrate(str(query.checkpoint), str(tmp_path / "ss"))
    migrate(str(tmp_path / "ss"), str(tmp_path / "back"), to="hdfs")
    state = [statestore_rows(spark, c) for c in (query.checkpoint, tmp_path / "ss", tmp_path / "back")]
    assert state[0] == state[1] == state[2]
    timeouts = [row[1][-1] for row in state[0]]
    assert len(timeouts) == 4 and all(t and t > 0 for t in timeouts), f"no timeout timestamps: {state[0]}"
    assert sorted((p.relative_to(query.checkpoint), p.stat().st_size) for p in query.checkpoint.rglob("*")) == before


def test_progress_counts_every_store_partition_and_max_parallelism_is_the_targets(spark, tmp_path):
    twin_input = JsonStream(tmp_path / "events", AIP_SCHEMA)
    twin_input.add(AIP_PHASES[0][0])
    query = Query(spark, build_query(twin_input, "NoTimeout", "update"), tmp_path / "hdfs", provider="hdfs")
    query.run()
    progress = _Recording()
    result = migrate(str(query.checkpoint), str(tmp_path / "ss"), options={"maxParallelism": "64"},
                     progress=progress)
    state_task = next(t for t in progress.tasks if t.description.startswith("migrating the state"))
    assert state_task.total == result.stores == 2 and state_task.done == 2
    assert {t.description for t in progress.tasks} >= {"writing the offset log",
                                                         "copying logs and Spark's state metadata"}
    store = open_stored(tmp_path / "ss", 0, 0, max_parallelism=64)
    v = result.batch + 1
    manifest = Manifest.from_json(store.storage.read_manifest(v), str(v))
    assert manifest.max_parallelism == 64 and manifest.query_id == result.query_id


class _Task(Task):
    def __init__(self, description, total):
        self.description, self.total, self.done = description, total, 0

    def advance(self, amount=1):
        self.done += amount


class _Recording(Progress):
    def __init__(self):
        self.tasks = []

    @contextmanager
    def task(self, description, total):
        self.tasks.append(_Task(description, total))
        yield self.tasks[-1]


# ------------------------------------------------------------------------------------ bad input

@pytest.fixture(scope="module")
def stopped(spark, tmp_path_factory):
    """A stopped query on Spark's HDFS provider (applyInPandasWithState, 2 batches); tests copy it to change it."""
    base = tmp_path_factory.mktemp("stopped")
    events = JsonStream(base / "events", AIP_SCHEMA)
    for rows in AIP_PHASES[0]:
        events.add(rows)
    query = Query(spark, build_query(events, "EventTimeTimeout", "update"), base / "ckpt", provider="hdfs")
    query.run()
    return query


def _copy(query: Query, to: Path) -> Path:
    shutil.copytree(query.checkpoint, to)
    return to


def _edit_offsets_conf(ckpt: Path, **conf) -> None:
    for path in (ckpt / "offsets").iterdir():
        if path.name.isdigit():
            lines = path.read_text().split("\n")
            meta = json.loads(lines[1])
            meta["conf"].update(conf)
            lines[1] = json.dumps(meta)
            path.write_text("\n".join(lines))
            (ckpt / "offsets" / f".{path.name}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("case,message", [
    ("unknown provider", r"runs on the state store provider com\.example\.MyProvider; migrate reads checkpoints of "
                         r"Spark's HDFS provider, Spark's RocksDB provider and spark_state only"),
    ("format v2", r"checkpoint format v2 .*checkpointFormatVersion"),
    ("uncommitted batch", r"batch 2 of .* started but did not commit \(last committed: 1\)"),
    ("transformWithState", r"transformWithStateInPandasExec: transformWithState keeps state in several column "
                           r"families"),
    ("same provider", r"already runs on hdfs"),
    ("memory storage", r"memory storage keeps state in the worker process"),
    ("unknown target", r"cannot migrate to 'cassandra'; choose one of spark_state, hdfs, rocksdb"),
    ("not a checkpoint", r"is not a Spark checkpoint"),
])
def test_bad_input_is_refused_and_nothing_is_written(stopped, tmp_path, case, message):
    ckpt = _copy(stopped, tmp_path / "ckpt")
    to, options = "spark_state", None
    if case == "unknown provider":
        _edit_offsets_conf(ckpt, **{"spark.sql.streaming.stateStore.providerClass": "com.example.MyProvider"})
    elif case == "format v2":
        _edit_offsets_conf(ckpt, **{"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"})
    elif case == "uncommitted batch":
        assert stopped.run_ends == [2]   # two batches of data, a no-data batch that fires timeouts
        (ckpt / "commits" / "2").unlink()
    elif case == "transformWithState":
        meta = ckpt / "state" / "0" / "_metadata" / "metadata"
        meta.write_text(meta.read_text().replace('"applyInPandasWithState"', '"transformWithStateInPandasExec"'))
    elif case == "same provider":
        to = "hdfs"
    elif case == "memory storage":
        options = {"storage": "memory"}
    elif case == "unknown target":
        to = "cassandra"
    elif case == "not a checkpoint":
        ckpt = tmp_path / "nothing"
        ckpt.mkdir()
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    with pytest.raises(CheckpointError, match=message):
        migrate(str(ckpt), str(tmp_path / "target"), to, options=options)
    assert not (tmp_path / "target").exists()
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before


def test_a_non_empty_target_or_the_source_itself_is_refused(stopped, tmp_path):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=r"refusing to migrate into .*busy.* new or empty location"):
        migrate(str(stopped.checkpoint), str(target))
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    with pytest.raises(CheckpointError, match="source and target are both"):
        migrate(str(stopped.checkpoint), str(stopped.checkpoint))


def test_a_running_query_is_refused(spark, stopped, tmp_path):
    ckpt = _copy(stopped, tmp_path / "ckpt")
    running = (stopped.build(spark).writeStream.outputMode("update").format("noop")
               .option("checkpointLocation", str(ckpt)).trigger(processingTime="1 hour").start())
    try:
        running.processAllAvailable()
        with pytest.raises(CheckpointError, match=f"query {running.id} is running in this Spark session"):
            migrate(str(ckpt), str(tmp_path / "target"))
    finally:
        running.stop()
    assert not (tmp_path / "target").exists()


def test_a_migration_that_fails_part_way_leaves_no_target(stopped, tmp_path):
    """A store file missing under the source: Spark's reader fails in the middle of the migration, and the
    offsets and state already written are removed again."""
    ckpt = _copy(stopped, tmp_path / "ckpt")
    (ckpt / "state" / "0" / "1" / "2.delta").unlink()
    with pytest.raises(Exception, match="2.delta"):
        migrate(str(ckpt), str(tmp_path / "target"))
    assert not (tmp_path / "target").exists()


@pytest.mark.skipif(__import__("importlib").util.find_spec("google.protobuf") is None,
                    reason="transformWithStateInPandas needs the protobuf package")
def test_a_real_transform_with_state_checkpoint_is_refused(spark, tmp_path):
    from tests.support.scenarios import EVENTS
    from tests.support.spark import ts
    from tests.support.transform_with_state import transform_with_state

    events = JsonStream(tmp_path / "events", EVENTS)
    events.add([{"k": "a", "v": 1, "ts": ts(1)}])
    query = Query(spark, lambda s: transform_with_state(events.read(s)), tmp_path / "ckpt", mode="update",
                  provider="hdfs", conf=ROCKSDB)
    query.run()
    with pytest.raises(CheckpointError, match="transformWithState keeps state in several column families"):
        migrate(str(query.checkpoint), str(tmp_path / "target"))
    assert not (tmp_path / "target").exists()


# ------------------------------------------------------------------------------------------ CLI

def test_cli_migrates_in_a_local_spark_of_its_own_and_reports_json(stopped, tmp_path):
    """No SparkSession in the child process: the command starts a local one, and prints one JSON document, and
    nothing else but the JVM's own line about its incubator modules (none of Spark's start-up warnings)."""
    done = cli("migrate", stopped.checkpoint, tmp_path / "ss", "--json")
    code, out = done.returncode, json.loads(done.stdout)
    assert code == 0 and out["ok"], out
    assert [line for line in done.stderr.splitlines() if line.strip() and "incubator modules" not in line] == [], \
        done.stderr
    assert out["batch"] == stopped.run_ends[-1] and out["source_provider"] == "hdfs"
    assert out["target_provider"] == "spark_state" and out["stores"] == 2 and out["rows"] == 4
    assert json.loads((tmp_path / "ss" / "metadata").read_text())["id"] == out["query_id"]
    offsets = (tmp_path / "ss" / "offsets" / str(out["batch"])).read_text().splitlines()
    assert json.loads(offsets[1])["conf"]["spark.sql.streaming.stateStore.providerClass"] == PROVIDER_CLASS
    code, out = cli_json("migrate", stopped.checkpoint, tmp_path / "hdfs", "--to", "hdfs", check=False)
    assert code == 2 and not out["ok"] and "already runs on hdfs" in out["error"]
    code, out = cli_json("migrate", stopped.checkpoint, tmp_path / "x", "--conf", PREFIX + "storage=memory",
                         check=False)
    assert code == 2 and "memory storage" in out["error"] and not (tmp_path / "x").exists()
