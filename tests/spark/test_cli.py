"""The ``spark-state`` CLI end to end: each command run as a child process (``python -m spark_state``)
on real checkpoints, on local paths and on an S3 endpoint, in text and ``--json``."""

from __future__ import annotations

import json
import tomllib
import uuid
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
import pyarrow.dataset as ds
import pytest

import spark_state
from spark_state.keygroups import key_groups_of, partitions_of
from tests.support import s3_server
from tests.support.lifecycle import cli, cli_json
from tests.support.paths import ROOT
from tests.support.spark import statestore_rows


pytestmark = pytest.mark.spark_state_only("the CLI reads spark_state checkpoints")


def _reader_rows_per_partition(spark, checkpoint: Path, batch: int) -> Counter:
    return Counter(row[-1] for row in statestore_rows(spark, checkpoint, batchId=batch))


def test_console_script_and_module_run_the_same_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"spark-state": "spark_state.cli:main"}
    done = cli("--help")
    for command in ("ls", "inspect", "validate", "export", "savepoint", "restore", "rescale"):
        assert command in done.stdout
    assert "spark_state, Spark's HDFS or RocksDB provider" in done.stdout   # migrate --to rocksdb too
    assert cli("--version").stdout.strip() == f"spark-state (spark_state) {spark_state.__version__}"


def test_ls_lists_batches_operators_stores_versions_and_bytes(finished):
    code, out = cli_json("ls", finished.checkpoint)
    assert code == 0 and out["ok"]
    assert out["query_id"] == json.loads((finished.checkpoint / "metadata").read_text())["id"]
    assert out["spark_state"] and out["num_partitions"] == 2
    assert out["batches"]["committed"] == out["batches"]["restorable"] == [0, 1, 2, 3, 4]
    (op,) = out["operators"]
    assert op["name"] == "applyInPandasWithState" and op["stores"] == ["default"]
    assert [(s["partition"], s["versions"][-1]) for s in op["partitions"]] == [(0, 5), (1, 5)]
    assert all(s["bytes"] > 0 and s["files"] >= 1 for s in op["partitions"])
    text = cli("ls", finished.checkpoint).stdout
    assert "restorable 0-4" in text and "applyInPandasWithState" in text


def test_inspect_reports_the_rows_spark_reads_with_their_key_groups_and_chain(spark, finished):
    per_partition = _reader_rows_per_partition(spark, finished.checkpoint, 4)
    assert sum(per_partition.values()) > 0
    for partition in (0, 1):
        code, out = cli_json("inspect", finished.checkpoint, "-o", "0", "-p", str(partition))
        assert out["version"] == 5 and out["batch"] == 4
        assert out["rows"] == per_partition[partition]
        kg = out["key_groups"]
        assert sum(kg["rows"].values()) == out["rows"] == sum(b["rows"] for b in kg["buckets"])
        assert all(int(g) % 2 == partition for g in kg["rows"]), "a key group outside the partition"
        assert out["chain"][0]["kind"] == "snapshot"
        for f in out["chain"]:
            assert (Path(out["root"].removeprefix("file://")) / f["path"]).stat().st_size == f["bytes"]
    older = cli_json("inspect", finished.checkpoint, "-o", "0", "-p", "0", "--batch", "0")[1]
    assert older["version"] == 1 and len(older["chain"]) == 1
    text = cli("inspect", finished.checkpoint, "-o", "0", "-p", "0").stdout
    assert "key-group histogram" in text and "chain" in text


def test_validate_passes_then_names_each_broken_file(finished, tmp_path):
    ckpt = finished.copy(tmp_path / "ckpt")
    code, out = cli_json("validate", ckpt)
    assert code == 0 and out["ok"] and out["files"] > 10
    shared = sorted((ckpt / "state" / "0" / "1" / "shared").iterdir())
    flipped, truncated, deleted = shared[0], shared[1], shared[2]
    data = bytearray(flipped.read_bytes())
    data[100] ^= 1
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-5])
    deleted.unlink()
    (ckpt / "commits" / "2").write_text("v1\n{not json")
    done = cli("validate", ckpt, check=False)
    assert done.returncode == 1
    for broken, why in ((flipped, "checksum"), (truncated, "bytes but"), (deleted, "missing"),
                        (ckpt / "commits" / "2", "not JSON")):
        line = next((ln for ln in done.stderr.splitlines() if str(broken) in ln), None)
        assert line is not None and why in line, f"{broken.name} not named with '{why}':\n{done.stderr}"
    code, out = cli_json("validate", ckpt, check=False)
    assert code == 1 and not out["ok"] and len(out["problems"]) == 4
    (ckpt / "offsets" / "4").write_text("v1\n{not json")   # the latest batch's: named once, not twice
    code, out = cli_json("validate", ckpt, check=False)
    assert code == 1 and [p["file"] for p in out["problems"]].count(f"file://{ckpt}/offsets/4") == 1, out


def test_export_writes_the_state_of_a_batch_as_parquet(spark, finished, tmp_path):
    cli("export", finished.checkpoint, tmp_path / "out", "--batch", "3")
    table = ds.dataset(tmp_path / "out", format="parquet", partitioning="hive").to_table()
    assert set(table.column_names) >= {"partition", "kg", "hash", "key", "value", "operator", "store"}
    expected = _reader_rows_per_partition(spark, finished.checkpoint, 3)
    assert Counter(table.column("partition").to_pylist()) == expected
    hashes = table.column("hash")
    assert np.array_equal(key_groups_of(hashes, 100800), table.column("kg").to_numpy())
    assert np.array_equal(partitions_of(hashes, 2), table.column("partition").to_numpy())
    done = cli("export", finished.checkpoint, tmp_path / "out", check=False)
    assert done.returncode == 2 and "already holds files" in done.stderr


def test_savepoint_and_restore_commands_resume_the_query(finished, tmp_path):
    code, sp = cli_json("savepoint", finished.checkpoint, "--target", tmp_path / "sps", "--batch", "2")
    assert sp["batch"] == 2 and sp["savepoint"].startswith(f"file://{tmp_path}/sps/savepoint-")
    assert cli_json("validate", sp["savepoint"])[1]["kind"] == "savepoint"
    assert "batch 2 (resumes with batch 3)" in cli("ls", sp["savepoint"]).stdout
    done = cli("restore", sp["savepoint"], tmp_path / "restored")
    assert "resume with batch 3" in done.stdout
    resumed = finished.query_on(tmp_path / "restored")
    assert resumed.run() == [3, 4]
    assert resumed.outputs == {b: finished.query.outputs[b] for b in (3, 4)}


@pytest.mark.parametrize("args, says", [
    (["ls", "{tmp}/nothing"], "does not exist"),
    (["restore", "{ckpt}", "{ckpt}/offsets"], "refusing to restore into"),
    (["inspect", "{ckpt}", "-o", "3", "-p", "0"], "has no operator 3; its operators are [0]"),
    (["inspect", "{ckpt}", "-o", "0", "-p", "0", "--version", "9"], "has no version 9; versions present: 1-5"),
    (["inspect", "{ckpt}", "-o", "0", "-p", "9"], "partition 9 does not exist at batch 4 of file://"),
    (["inspect", "{ckpt}", "-o", "0", "-p", "-1"], "partition -1 does not exist at batch 4"),
    (["inspect", "{ckpt}", "-o", "0", "-p", "9"], "it has partitions 0..1"),
    (["ls", "{ckpt}", "--conf", "checkpointRoot"], "is not KEY=VALUE"),
    (["ls", "{ckpt}", "--conf", "snapshotIntervall=3"], "unknown option"),
    (["savepoint", "{ckpt}"], "pass one (--target DIR; target_directory= in Python) or set the savepointDir option"),
    (["changes", "{ckpt}", "--start-batch", "-3"], "start batch -3 (start_batch; CLI: --start-batch) is not a batch"),
    (["changes", "{ckpt}", "--start-batch", "3", "--end-batch", "1"], "CLI: --end-batch"),
    (["rescale", "{ckpt}", "0"], "must be at least 1"),
])
def test_errors_say_what_to_do_and_exit_2(finished, tmp_path, args, says):
    args = [a.format(tmp=tmp_path, ckpt=finished.checkpoint) for a in args]
    done = cli(*args, check=False)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    code, out = cli_json(*args, check=False)
    assert code == 2 and not out["ok"] and says in out["error"]


@pytest.fixture
def bucket():
    s3_server.start()
    name = f"cli-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(name)
    return name


def test_commands_work_on_s3_urls(finished, tmp_path, bucket):
    """ls, validate and savepoint on a checkpoint in S3, the savepoint to S3, restored back to a local
    location where the query resumes."""
    fs = fsspec.filesystem("s3")
    fs.put(str(finished.checkpoint), f"{bucket}/ckpt", recursive=True)
    url = f"s3://{bucket}/ckpt"
    code, out = cli_json("ls", url)
    assert out["batches"]["restorable"] == [0, 1, 2, 3, 4]
    assert cli_json("validate", url)[1]["ok"]
    code, sp = cli_json("savepoint", url, "--target", f"s3://{bucket}/savepoints", "--batch", "2")
    assert sp["savepoint"].startswith(f"s3://{bucket}/savepoints/savepoint-")
    cli("restore", sp["savepoint"], tmp_path / "restored")
    resumed = finished.query_on(tmp_path / "restored")
    assert resumed.run() == [3, 4]
    assert resumed.outputs == {b: finished.query.outputs[b] for b in (3, 4)}


def test_changes_writes_parquet_prints_json_and_matches_read_changes(finished, tmp_path):
    import pyarrow.parquet as pq

    import spark_state

    table = spark_state.read_changes(finished.checkpoint, start_batch=1)
    assert table.num_rows and set(table.column("change_type").to_pylist()) == {"update", "delete"}
    code, out = cli_json("changes", finished.checkpoint, "--start-batch", "1")
    assert code == 0 and out["rows"] == table.num_rows
    assert [(r["batch_id"], r["change_type"], r["key"], r["partition_id"]) for r in out["changes"]] == \
        [(r["batch_id"], r["change_type"], r["key"], r["partition_id"]) for r in table.to_pylist()]
    wrote = cli("changes", finished.checkpoint, tmp_path / "changes.parquet", "--start-batch", "1", "-p", "1").stdout
    assert pq.read_table(tmp_path / "changes.parquet").equals(
        spark_state.read_changes(finished.checkpoint, start_batch=1, partitions=[1]))
    assert f"wrote {pq.read_metadata(tmp_path / 'changes.parquet').num_rows} changes of operator 0 to " in wrote, wrote
    done = cli("changes", finished.checkpoint, tmp_path / "changes.parquet", check=False)
    assert done.returncode == 2 and "refusing to overwrite" in done.stderr
    assert "update" in cli("changes", finished.checkpoint, "--end-batch", "1").stdout


def _listing(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_savepoint_stays_as_it_was_written(finished, tmp_path):
    """rescale of a savepoint (and a savepoint into one) is refused, with the way that works, writing nothing; the
    commands that only read it (a savepoint of it included) leave it as written, and it still validates."""
    sp = cli_json("savepoint", finished.checkpoint, "--target", tmp_path / "sps")[1]["savepoint"]
    where = Path(sp.removeprefix("file://"))
    before = _listing(where)
    for args in (["rescale", sp, "3"], ["savepoint", finished.checkpoint, "--target", sp]):
        done = cli(*args, check=False)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"{sp} is a savepoint, which stays as it was written: " in done.stderr, done.stderr
        assert _listing(where) == before
    assert f"restore it first (spark-state restore {sp} NEW) and rescale NEW" in cli("rescale", sp, "3",
                                                                                       check=False).stderr
    for args in (["ls", sp], ["validate", sp], ["inspect", sp, "-o", "0", "-p", "1"], ["export", sp, tmp_path / "x"],
                 ["changes", sp], ["savepoint", sp, "--target", tmp_path / "sps2"],
                 ["migrate", sp, tmp_path / "on-hdfs", "--to", "hdfs"]):
        cli(*args)
    assert _listing(where) == before
    assert cli_json("validate", sp)[1]["ok"]
    cli("restore", sp, tmp_path / "restored")
    assert cli_json("validate", tmp_path / "restored")[1]["ok"]


def test_a_checkpoint_of_spark_s_provider_is_named_as_not_spark_state_s(spark, finished, tmp_path):
    """ls notes it and points to migrate; validate and inspect cannot run on it (exit 2), one line each."""
    from tests.support.spark import Query

    hdfs = Query(spark, finished.query.build, tmp_path / "hdfs", mode="update", provider="hdfs")
    hdfs.run()
    done = cli("ls", hdfs.checkpoint)
    assert "is not a spark_state checkpoint" in done.stdout and \
        f"spark-state migrate file://{hdfs.checkpoint} NEW --to spark_state" in done.stdout, done.stdout
    assert "not a spark_state checkpoint" in cli_json("ls", hdfs.checkpoint)[1]["note"]
    for args in (["validate", hdfs.checkpoint], ["inspect", hdfs.checkpoint, "-o", "0", "-p", "0"]):
        done = cli(*args, check=False)
        assert done.returncode == 2 and "is not a spark_state checkpoint" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
