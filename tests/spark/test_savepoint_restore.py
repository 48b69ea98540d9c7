"""Savepoints and restore on real queries: a savepoint survives deleting its checkpoint and the
restored query resumes exactly where it was taken; a restore to a retained batch replays exactly
from there; bad input fails clearly and writes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spark_state import PROVIDER_CLASS
from spark_state.errors import CheckpointError, ChecksumMismatch, VersionNotFound
from spark_state.lifecycle import read_savepoint, restore, savepoint
from spark_state.options import PREFIX
from tests.support.scenarios import SCENARIOS, run_scenario
from tests.support.spark import Query, rm_rf, sql_conf


pytestmark = pytest.mark.spark_state_only("savepoints are spark_state's")


def _query_id(checkpoint: Path) -> str:
    return json.loads((Path(checkpoint) / "metadata").read_text())["id"]


@pytest.mark.parametrize("name", ["agg_update", "join_inner", "session_window"])
def test_savepoint_survives_deleting_its_checkpoint_and_the_restored_query_resumes_exactly(
        spark, tested, tmp_path, name):
    """Phase 1, savepoint, delete the checkpoint, restore, phase 2: output identical to HDFS run straight through."""
    restored = tmp_path / "restored"

    def savepoint_delete_restore(twin):
        before = _query_id(twin.test.checkpoint)
        url = savepoint(str(twin.test.checkpoint), str(tmp_path / "savepoints"))
        rm_rf(twin.test.checkpoint)
        assert Path(url.removeprefix("file://")).name.startswith(f"savepoint-{before.replace('-', '')[:6]}-")
        result = restore(url, str(restored))
        assert result.batch == twin.test.run_ends[-1] and result.source_query_id == before
        assert _query_id(restored) == result.query_id != before
        twin.test.checkpoint = restored

    twin = run_scenario(spark, tmp_path, SCENARIOS[name], tested=tested, between=savepoint_delete_restore)
    twin.assert_same()
    assert twin.test.checkpoint == restored and twin.test.runs == 2
    assert twin.ref.rows(), "the scenario produced no output; it checks nothing"


def test_restore_to_a_retained_batch_replays_exactly_from_there(finished, tmp_path):
    original = finished.query
    assert sorted(original.outputs) == [0, 1, 2, 3, 4]   # 4: the no-data batch that fires timeouts
    result = restore(str(finished.checkpoint), str(tmp_path / "rolled-back"), batch=1)
    assert result.batch == 1
    replay = finished.query_on(tmp_path / "rolled-back")
    assert replay.run() == [2, 3, 4]
    assert replay.outputs == {b: original.outputs[b] for b in (2, 3, 4)}
    assert any(row[-1] == "timeout" for b in (3, 4) for row in replay.outputs[b]), "no event-time timeout replayed"


def test_restore_refuses_a_non_empty_target_and_changes_nothing(finished, tmp_path):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="refusing to restore into .*busy.* new or empty location"):
        restore(str(finished.checkpoint), str(target))
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    with pytest.raises(CheckpointError, match="source and target are both"):
        restore(str(finished.checkpoint), str(finished.checkpoint))


def test_restore_of_a_batch_that_is_not_there_names_what_is(finished, tmp_path):
    with pytest.raises(CheckpointError, match=r"batch 7 .* is not committed; committed batches still logged: 0-4"):
        restore(str(finished.checkpoint), str(tmp_path / "t"), batch=7)
    assert not (tmp_path / "t").exists()


def test_restore_of_a_batch_whose_state_retention_deleted_fails_before_writing(finished, tmp_path):
    ckpt = finished.copy(tmp_path / "ckpt")
    shutil.rmtree(ckpt / "state" / "0" / "1" / "chk-2")  # what retention does to version 2 of one store
    with pytest.raises(VersionNotFound, match=r"version 2 of state store .*state/0/1 .* versions present: 1, 3-5"):
        restore(str(ckpt), str(tmp_path / "t"), batch=1)
    assert not (tmp_path / "t").exists()
    restore(str(ckpt), str(tmp_path / "t2"), batch=2)   # the other batches stay restorable


def test_a_corrupted_file_fails_the_savepoint_and_leaves_no_savepoint(finished, tmp_path):
    ckpt = finished.copy(tmp_path / "ckpt")
    victim = sorted((ckpt / "state" / "0" / "0" / "shared").iterdir())[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match=victim.name):
        savepoint(str(ckpt), str(tmp_path / "sp"))
    assert not list((tmp_path / "sp").iterdir())
    assert victim.read_bytes() == bytes(data), "the checkpoint must be left as it was"


def test_a_savepoint_whose_process_died_is_refused_by_restore(finished, tmp_path):
    url = savepoint(str(finished.checkpoint), str(tmp_path / "sp"))
    unfinished = Path(url.removeprefix("file://"))
    (unfinished / "_metadata").unlink()          # the state a crash leaves: marker written, _metadata not yet
    (unfinished / "_in_progress").touch()
    with pytest.raises(CheckpointError, match="did not finish"):
        restore(str(unfinished), str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_savepoint_of_a_checkpoint_of_another_provider_is_refused(spark, finished, tmp_path):
    hdfs = Query(spark, finished.query.build, tmp_path / "hdfs", mode="update", provider="hdfs")
    hdfs.run()
    with pytest.raises(CheckpointError, match=f"not a spark_state checkpoint.*HDFSBackedStateStoreProvider.*"
                                              f"{PROVIDER_CLASS}"):
        savepoint(str(hdfs.checkpoint), str(tmp_path / "sp"))


def test_savepoint_target_defaults_to_the_savepoint_dir_option(spark, finished, tmp_path):
    with pytest.raises(CheckpointError, match="savepointDir"):
        savepoint(str(finished.checkpoint))
    url = savepoint(str(finished.checkpoint), options={"savepointDir": str(tmp_path / "a")})
    assert url.startswith(f"file://{tmp_path}/a/savepoint-")
    with sql_conf(spark, {PREFIX + "savepointDir": str(tmp_path / "b")}):
        url = savepoint(str(finished.checkpoint))
    assert url.startswith(f"file://{tmp_path}/b/savepoint-")
    meta = read_savepoint(url)
    assert meta.batch == 4 and meta.num_partitions == 2
    assert {(s["operator"], s["partition"], s["version"]) for s in meta.stores} == {(0, 0, 5), (0, 1, 5)}


def test_state_under_a_checkpoint_root_is_saved_and_restored_there(spark, tmp_path):
    """checkpointRoot: the savepoint gathers the state from the root; restore writes it under the root for the
    new location, where the restored query finds it."""
    from tests.support.running_total import PHASES, twin_under_a_checkpoint_root

    twin, events, root = twin_under_a_checkpoint_root(spark, tmp_path)
    ref, test = twin.ref, twin.test
    assert not list(test.checkpoint.rglob("*.arrow")), "state must be under the root"
    conf = {PREFIX + "checkpointRoot": root["checkpoint_root"]}
    url = savepoint(str(test.checkpoint), str(tmp_path / "sp"), options=conf)
    restore(url, str(tmp_path / "restored"), options=conf)
    assert not list((tmp_path / "restored").rglob("*.arrow"))
    test.checkpoint = tmp_path / "restored"
    events.add_all(PHASES[1])
    twin.run()
    assert test.outputs == ref.outputs
