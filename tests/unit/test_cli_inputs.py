"""The ``spark-state`` CLI on wrong and damaged input, without Spark: a copy of a checkpoint Spark wrote
(tests/fixtures/format1, 4 batches, 2 partitions) broken as users break them, and locations that are not
one. Every file-system, permission and credential error exits 2 with one line that says what to do, never a
traceback; ``ls`` shows what it can and marks the rest; ``validate`` names the batches a problem affects and
the batch ``restore`` can go back to."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from spark_state.lifecycle.migrate import HDFS_PROVIDER
from tests.support.lifecycle import cli, cli_json
from tests.support.paths import FIXTURES

SPARK_WROTE = FIXTURES / "format1" / "pandas" / "ckpt-test"
#: Root ignores permission bits unless it gives up these capabilities (setpriv, for the child it starts).
AS_NON_ROOT = ["--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture
def ckpt(tmp_path) -> Path:
    return Path(shutil.copytree(SPARK_WROTE, tmp_path / "ckpt"))


def _one_line_error(done, code: int = 2) -> str:
    assert done.returncode == code, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["ls"], ["validate"], ["inspect", "-o", "0", "-p", "0"], ["export", "{out}"],
                                     ["savepoint", "--target", "{out}"], ["restore", "{out}"], ["rescale", "4"],
                                     ["changes"]])
@pytest.mark.parametrize("location, says", [("{tmp}/nothing", "does not exist"),
                                            ("{tmp}/a-file", "is a file, not a checkpoint directory")])
def test_a_location_that_is_no_directory_says_which_it_is(tmp_path, command, location, says):
    (tmp_path / "a-file").write_text("hello\n")
    where = location.format(tmp=tmp_path)
    args = [a.format(out=tmp_path / "out") for a in command]
    line = _one_line_error(cli(args[0], where, *args[1:], check=False))
    assert says in line and where in line
    assert not (tmp_path / "out").exists(), "a refused command wrote something"


@pytest.mark.parametrize("command", [["export", "{ckpt}", "{target}"], ["restore", "{ckpt}", "{target}"],
                                     ["savepoint", "{ckpt}", "--target", "{target}"]])
def test_a_file_where_a_target_directory_should_be_is_refused(ckpt, tmp_path, command):
    target = tmp_path / "a-file"
    target.write_text("keep me\n")
    line = _one_line_error(cli(*[a.format(ckpt=ckpt, target=target) for a in command], check=False))
    assert str(target) in line and "is a file" in line
    assert target.read_text() == "keep me\n"


def test_s3_without_credentials_says_how_to_give_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1")
    for command in (["ls"], ["validate"], ["restore", str(tmp_path / "out")]):
        line = _one_line_error(cli(command[0], "s3://some-bucket/ckpt", *command[1:], check=False, env=env))
        assert "no credentials" in line and "AWS_ACCESS_KEY_ID" in line and "s3://some-bucket/ckpt" in line
    code, out = cli_json("ls", "s3://some-bucket/ckpt", check=False, env=env)
    assert code == 2 and not out["ok"] and out["kind"] == "NoCredentialsError"


def _no_aws_credentials(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1")
    return env


@pytest.mark.parametrize("command", [["restore", "{ckpt}", "s3://some-bucket/new"],
                                     ["savepoint", "{ckpt}", "--target", "s3://some-bucket/new"],
                                     ["export", "{ckpt}", "s3://some-bucket/new"],
                                     ["ls", "{ckpt}", "--conf",
                                      "spark.sql.streaming.stateStore.sparkState.checkpointRoot=s3://some-bucket/new"]])
def test_missing_credentials_name_the_object_store_location_not_the_local_one(ckpt, tmp_path, command):
    """A local checkpoint, an S3 target (or checkpointRoot) and no credentials: the line names the S3 location
    and its credentials, not the local checkpoint, which the command could read."""
    args = [a.format(ckpt=ckpt) for a in command]
    line = _one_line_error(cli(*args, check=False, env=_no_aws_credentials(tmp_path)))
    assert "no credentials" in line and "s3://some-bucket/new" in line and "AWS_ACCESS_KEY_ID" in line, line
    assert str(ckpt) not in line, line


def test_a_directory_it_may_not_read_is_named_and_ls_lists_the_rest(ckpt):
    locked = ckpt / "state" / "0" / "0"
    locked.chmod(0)
    try:
        done = cli("ls", ckpt, check=False, capabilities=AS_NON_ROOT)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert f"unreadable: file://{locked}: permission denied" in done.stdout
        assert "restorable none" in done.stdout
        done = cli("validate", ckpt, check=False, capabilities=AS_NON_ROOT)
        assert done.returncode == 1 and f"BAD file://{locked}: permission denied" in done.stderr
        ckpt.chmod(0)
        line = _one_line_error(cli("ls", ckpt, check=False, capabilities=AS_NON_ROOT))
        assert "permission denied" in line and str(ckpt) in line
    finally:
        ckpt.chmod(stat.S_IRWXU)
        locked.chmod(stat.S_IRWXU)


def test_a_garbage_manifest_marks_its_batch_and_validate_names_the_way_back(ckpt, tmp_path):
    (ckpt / "state" / "0" / "0" / "chk-4" / "_metadata").write_bytes(b"\x00garbage")
    code, out = cli_json("ls", ckpt)
    assert code == 0
    assert out["batches"]["restorable"] == [0, 1, 2]
    assert [d["batch"] for d in out["batches"]["damaged"]] == [3]
    assert "chk-4/_metadata" in out["batches"]["damaged"][0]["reason"]
    assert out["operators"][0]["partitions"][0]["damaged"] == [4]
    text = cli("ls", ckpt).stdout
    assert "damaged: 3" in text
    # The store's row says which versions are damaged, not a count that reads like one ("1-4 (4 damaged)").
    assert "1-4 (version 4 damaged)" in text, text
    done = cli("validate", ckpt, check=False)
    assert done.returncode == 1
    assert "they affect batch 3 " in done.stdout
    assert f"spark-state restore file://{ckpt} NEW_LOCATION --batch 2" in done.stdout
    code, report = cli_json("validate", ckpt, check=False)
    assert (code, report["affected_batches"], report["way_back"]) == (1, [3], 2)
    cli("restore", ckpt, tmp_path / "back", "--batch", "2")
    assert cli_json("validate", tmp_path / "back")[1]["ok"]


def test_a_missing_data_file_makes_every_batch_that_needs_it_unrestorable(ckpt, tmp_path):
    (delta,) = (ckpt / "state" / "0" / "1" / "shared").glob("v0000000003-delta-*.arrow")
    delta.unlink()
    code, out = cli_json("ls", ckpt)
    assert out["batches"]["restorable"] == [0, 1], "ls lists a batch whose state cannot load as restorable"
    assert [d["batch"] for d in out["batches"]["damaged"]] == [2, 3]
    assert f"{delta.name} is missing" in out["batches"]["damaged"][0]["reason"]
    code, report = cli_json("validate", ckpt, check=False)
    assert (code, report["affected_batches"], report["way_back"]) == (1, [2, 3], 1)
    line = _one_line_error(cli("restore", ckpt, tmp_path / "r2", "--batch", "2", check=False))
    assert "is missing" in line
    cli("restore", ckpt, tmp_path / "r1", "--batch", "1")


def test_a_truncated_data_file_is_caught_by_its_size(ckpt):
    (delta,) = (ckpt / "state" / "0" / "0" / "shared").glob("v0000000004-delta-*.arrow")
    delta.write_bytes(delta.read_bytes()[:-7])
    out = cli_json("ls", ckpt)[1]
    assert out["batches"]["restorable"] == [0, 1, 2]
    assert "bytes, its manifest says" in out["batches"]["damaged"][0]["reason"]


def test_ls_shows_what_it_can_when_spark_logs_are_garbage(ckpt):
    (ckpt / "metadata").write_text("{not json")
    (ckpt / "offsets" / "1").write_text("v1\ngarbage")
    code, out = cli_json("ls", ckpt)
    assert code == 0 and out["query_id"] is None
    assert {p["file"].rsplit("/", 2)[-1] for p in out["problems"]} == {"metadata", "1"}
    assert out["batches"]["restorable"] == [0, 2, 3] and out["num_partitions"] == 2
    text = cli("ls", ckpt).stdout
    assert "query (unreadable)" in text and f"unreadable: file://{ckpt}/offsets/1" in text
    assert json.loads(cli("validate", ckpt, "--json", check=False).stdout)["affected_batches"] == [1]


@pytest.mark.parametrize("command", [["restore", "{ckpt}", "{out}"], ["export", "{ckpt}", "{out}"],
                                     ["savepoint", "{ckpt}", "--target", "{out}"], ["rescale", "{ckpt}", "3"],
                                     ["inspect", "{ckpt}", "-o", "0", "-p", "0"]])
def test_a_garbage_manifest_stops_a_command_with_the_way_to_find_the_batch_to_go_back_to(ckpt, tmp_path, command):
    (ckpt / "state" / "0" / "0" / "chk-4" / "_metadata").write_bytes(b"\x00garbage")
    line = _one_line_error(cli(*[a.format(ckpt=ckpt, out=tmp_path / "out") for a in command], check=False))
    assert "chk-4/_metadata" in line and f"spark-state validate file://{ckpt}" in line, line
    assert not (tmp_path / "out").exists()


def test_rescale_refuses_a_last_batch_whose_state_cannot_load_and_writes_nothing(ckpt):
    """Rescale writes only metadata: on a missing data file it would commit a batch whose state cannot load,
    and the query would fail only when it restarts."""
    (delta,) = (ckpt / "state" / "0" / "1" / "shared").glob("v0000000003-delta-*.arrow")
    delta.unlink()
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    line = _one_line_error(cli("rescale", ckpt, "3", check=False))
    assert f"{delta.name} is missing" in line and "batch 3" in line and "spark-state validate" in line, line
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before, "a refused rescale wrote something"


def test_help_reads_as_plain_text():
    """--help shows the module docstring: without its reST markup (``--json``) on a terminal."""
    done = cli("--help")
    assert "``" not in done.stdout, done.stdout
    assert "spark-state: operate on spark_state checkpoints" in done.stdout and "--json (one JSON document" in done.stdout


def test_inspect_of_an_empty_partition_says_so_instead_of_a_histogram_of_zeros(capsys):
    """A small query's partition often holds no key (the one-minute example: 2 keys, 4 partitions)."""
    from spark_state.cli import _show_inspect

    buckets = [{"from": i * 5040, "to": i * 5040 + 5039, "rows": 0, "key_groups": 0} for i in range(20)]
    _show_inspect({"operator": 0, "partition": 0, "store": "default", "version": 2, "batch": 1, "rows": 0,
                   "root": "file:///data/ckpt/state/0/0", "chain": [],
                   "key_groups": {"max_parallelism": 100800, "key_groups_with_rows": 0, "buckets": buckets,
                                  "rows_per_key_group": {"min": 0, "mean": 0.0, "max": 0}}})
    out = capsys.readouterr().out
    assert "histogram" not in out and "rows per non-empty key group" not in out, out
    assert "no rows at batch 1" in out, out


@pytest.mark.parametrize("command", [["ls"], ["validate"], ["inspect", "-o", "0", "-p", "0"], ["export", "{out}"],
                                     ["changes"], ["savepoint", "--target", "{out}"], ["restore", "{out}"],
                                     ["rescale", "4"], ["migrate", "{out}"]])
def test_memory_storage_says_there_is_nothing_on_disk_instead_of_listing_nothing(ckpt, tmp_path, capsys, command):
    """A query on memory storage keeps its state in the worker's memory: its checkpoint has none to operate on."""
    from spark_state.cli import main

    args = [a.format(out=tmp_path / "out") for a in command]
    code = main([args[0], str(ckpt), *args[1:], "--conf", "storage=memory", "--no-progress"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), out
    (line,) = err.strip().splitlines()
    assert f"spark-state {args[0]}: error: --conf storage=memory" in line and "nothing on disk" in line, line
    assert "storage=filesystem" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["{ckpt}", "{ckpt}/savepoints/x", "{ckpt}/state/sp"])
def test_a_savepoint_target_inside_the_checkpoint_is_refused(ckpt, target):
    """A savepoint must outlive its checkpoint (deleting the checkpoint is how a query starts over)."""
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    line = _one_line_error(cli("savepoint", ckpt, "--target", target.format(ckpt=ckpt), check=False))
    assert f"inside the query's checkpoint file://{ckpt}" in line and f"file://{ckpt}-savepoints" in line, line
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before, "a refused savepoint wrote something"
    line = _one_line_error(cli("savepoint", ckpt, "--conf", f"savepointDir={ckpt}/savepoints", check=False))
    assert "inside the query's checkpoint" in line, line


def test_a_savepoint_without_a_target_says_how_to_give_one(ckpt):
    line = _one_line_error(cli("savepoint", ckpt, check=False))
    assert "no target directory" in line and "--target DIR" in line and "savepointDir" in line, line


def _actions(parser: argparse.ArgumentParser, name: str):
    """(command, action) for every flag and argument of `parser` and its subcommands, subcommands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice for choice in action._choices_actions}
            for sub, subparser in action.choices.items():
                yield name, helps.get(sub)
                yield from _actions(subparser, f"{name} {sub}")
        else:
            yield name, action


def test_every_command_flag_and_argument_has_a_help_text():
    from spark_state.cli import _parser

    missing = [f"{name} {'/'.join(a.option_strings) or a.dest if a else '(a subcommand)'}"
               for name, a in _actions(_parser(), "spark-state") if a is None or not (a.help or "").strip()]
    assert not missing, f"--help shows these without a help text: {missing}"


def _as_if_on_spark_s_provider(ckpt: Path) -> None:
    """The checkpoint's offset log pinning Spark's own provider, as a query that never used spark_state."""
    from spark_state import PROVIDER_CLASS

    for f in (ckpt / "offsets").iterdir():
        if f.is_file() and not f.name.startswith("."):
            f.write_text(f.read_text().replace(PROVIDER_CLASS, HDFS_PROVIDER))
            (f.parent / f".{f.name}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("command", [["validate"], ["inspect", "-o", "0", "-p", "0"], ["export", "{out}"],
                                     ["changes"], ["savepoint", "--target", "{out}"], ["rescale", "4"]])
def test_every_command_on_spark_s_provider_names_migrate_as_the_way_in(ckpt, tmp_path, command):
    """Not only ``ls``: each command that cannot run on another provider's checkpoint says how to move it over."""
    _as_if_on_spark_s_provider(ckpt)
    args = [a.format(out=tmp_path / "out") for a in command]
    line = _one_line_error(cli(args[0], ckpt, *args[1:], check=False))
    assert "is not a spark_state checkpoint" in line and HDFS_PROVIDER in line, line
    assert f"spark-state migrate file://{ckpt} NEW --to spark_state" in line, line


def test_ls_of_a_query_without_state_says_there_is_nothing_to_migrate(ckpt):
    """A stateless query on Spark's provider: no state/ directory, so no advice to migrate it."""
    _as_if_on_spark_s_provider(ckpt)
    shutil.rmtree(ckpt / "state")
    code, out = cli_json("ls", ckpt)
    assert code == 0 and out["operators"] == [] and not out["problems"], out
    assert "holds no state" in out["note"] and "nothing to read or migrate" in out["note"], out["note"]
    assert "migrate" not in cli("ls", ckpt).stdout.replace("nothing to read or migrate", ""), "advice to migrate"


def test_inspect_counts_the_key_groups_the_partition_owns(ckpt):
    """Partition p of N owns the key groups kg % N == p: of 100,800, partition 0 of 2 owns 50,400."""
    code, out = cli_json("inspect", ckpt, "-o", "0", "-p", "0")
    assert code == 0 and out["key_groups"]["owned"] == out["key_groups"]["max_parallelism"] // 2, out["key_groups"]
    text = cli("inspect", ckpt, "-o", "0", "-p", "0").stdout
    assert f"of the {out['key_groups']['owned']} key groups it owns" in text, text


def test_traceback_asked_for_keeps_the_exit_status_of_a_command_that_could_not_run(tmp_path):
    done = cli("ls", tmp_path / "nothing", "--traceback", check=False)
    assert done.returncode == 2 and "Traceback" in done.stderr, (done.returncode, done.stderr[-2000:])


def test_ls_names_only_directories_as_stores_and_says_what_it_could_not_read(ckpt):
    """Without the operator's metadata, stores are the directories of its partitions; a file beside them (here
    another provider's 1.delta) is none. A checkpoint whose logs are garbage shows "unknown", never "None"."""
    shutil.rmtree(ckpt / "state" / "0" / "_metadata")
    (ckpt / "state" / "0" / "0" / "1.delta").write_bytes(b"junk")
    (ckpt / "state" / "0" / "1" / "left-keyToNumValues").mkdir()
    code, out = cli_json("ls", ckpt)
    assert code == 0 and out["operators"][0]["stores"] == ["default", "left-keyToNumValues"], out["operators"]
    for f in (ckpt / "offsets").iterdir():
        f.write_bytes(b"\x00garbage")
    text = cli("ls", ckpt).stdout
    assert "None" not in text, text
    assert "provider (unknown: no offset log could be read)" in text and "partitions: (unknown)" in text, text


def test_changes_refuses_an_output_that_is_not_parquet_before_reading(ckpt, tmp_path):
    """changes writes Parquet: a .txt or .csv name would get Parquet bytes under a name that says otherwise."""
    for name in ("out.txt", "out.csv", "out"):
        line = _one_line_error(cli("changes", ckpt, tmp_path / name, check=False))
        assert "must be a .parquet file" in line and "changes.parquet" in line, line
        assert not (tmp_path / name).exists()


def test_counts_say_one_row_not_one_rows():
    from spark_state.cli import _count

    assert [_count(n, "row") for n in (0, 1, 2)] == ["0 rows", "1 row", "2 rows"]
