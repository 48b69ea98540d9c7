"""Bad input on a real query: a clear error that says what was wrong and how to fix it, and no lost data.

Each test runs a running count (groupBy().count(), update mode), breaks
something, checks the error, mends it, and checks that the counts carry on
exactly. ``unloadOnCommit`` makes Spark drop its providers after every
commit, so every batch restores its state from storage through the worker.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from spark_state.options import PREFIX
from tests.support.spark import JsonStream, Query, QueryFailed

SCHEMA = "k string, n int"
RESTORE_EVERY_BATCH = {"spark.sql.streaming.stateStore.unloadOnCommit": "true"}


@pytest.fixture(autouse=True)
def _only_spark_state(tested):
    if tested != "spark_state":
        pytest.skip("checks spark_state's own errors")


def _counts(spark, events: JsonStream):
    return events.read(spark).groupBy("k").count()


def _final_counts(query: Query) -> dict[str, int]:
    latest: dict[str, int] = {}
    for batch in sorted(query.outputs):
        for row in query.outputs[batch]:
            latest[row[0]] = row[1]
    return latest


def _add(events: JsonStream, expected: Counter, keys: str) -> None:
    events.add([{"k": k, "n": 1} for k in keys])
    expected.update(keys)


def _first_line(err: QueryFailed | Exception) -> str:
    text = getattr(err, "message", str(err))
    return next((line for line in text.splitlines() if "spark_state" in line), text.splitlines()[0])


def _query(spark, tmp_path: Path, events: JsonStream, **kwargs) -> Query:
    return Query(spark, lambda s: _counts(s, events), tmp_path / "ckpt", conf=dict(RESTORE_EVERY_BATCH), **kwargs)


def test_unknown_option_value_fails_at_start_naming_option_and_fix(spark, tmp_path):
    events = JsonStream(tmp_path / "events", SCHEMA)
    expected: Counter = Counter()
    _add(events, expected, "aab")
    query = _query(spark, tmp_path, events)
    query.conf[PREFIX + "storage"] = "tape"
    with pytest.raises(Exception) as info:
        query.run()
    line = _first_line(info.value)
    assert "storage" in line and "'tape'" in line and "filesystem, memory" in line, line
    assert not list((tmp_path / "ckpt").glob("commits/[0-9]*")), "no batch may commit with a bad option"
    del query.conf[PREFIX + "storage"]
    query.run()
    assert _final_counts(query) == dict(expected)


def test_max_parallelism_change_on_restore_is_refused_and_loses_nothing(spark, tmp_path):
    events = JsonStream(tmp_path / "events", SCHEMA)
    expected: Counter = Counter()
    _add(events, expected, "abcab")
    query = _query(spark, tmp_path, events)
    query.run()
    _add(events, expected, "abd")
    query.options["max_parallelism"] = 64
    with pytest.raises(QueryFailed) as info:
        query.run()
    line = _first_line(info.value)
    assert "100800" in line and "64" in line and "maxParallelism" in line, line
    del query.options["max_parallelism"]
    query.run()
    assert _final_counts(query) == dict(expected)


def _flip_a_byte(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x5A
    return bytes(damaged)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 3]


@pytest.mark.parametrize("damage", [_flip_a_byte, _truncate], ids=["corrupted", "truncated"])
def test_damaged_state_file_is_named_and_state_comes_back_once_mended(spark, tmp_path, damage):
    events = JsonStream(tmp_path / "events", SCHEMA)
    expected: Counter = Counter()
    _add(events, expected, "abcdabcd")
    query = _query(spark, tmp_path, events)
    query.run()
    files = sorted((tmp_path / "ckpt" / "state").rglob("shared/*.arrow"))
    assert files, "the query wrote no spark_state files"
    victim = max(files, key=lambda p: p.stat().st_mtime_ns)
    original = victim.read_bytes()
    victim.write_bytes(damage(original))
    _add(events, expected, "abe")
    with pytest.raises(QueryFailed) as info:
        query.run()
    assert victim.name in info.value.message and "corrupted or truncated" in info.value.message, _first_line(info.value)
    victim.write_bytes(original)  # the operator restores the file from a backup
    query.run()
    assert _final_counts(query) == dict(expected)


def test_a_bad_option_from_spark_submit_fails_in_get_or_create(tmp_path):
    """An option of the application's Spark conf (--conf, spark-defaults.conf; here PYSPARK_SUBMIT_ARGS) fails
    where configure()'s session is created, not in the first batch."""
    import os
    import subprocess
    import sys

    from tests.support.paths import pythonpath_with_root

    app = ("import spark_state\nfrom pyspark.sql import SparkSession\n"
           "spark_state.configure(SparkSession.builder.master('local[1]')).getOrCreate()\n")
    env = dict(os.environ, PYTHONPATH=pythonpath_with_root(),
               PYSPARK_SUBMIT_ARGS=f"--conf {PREFIX}fileGracePeriod=soon pyspark-shell")
    done = subprocess.run([sys.executable, "-c", app], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("spark_state.errors.OptionError: ") and "fileGracePeriod='soon' is not a duration" in last
    assert "(set in the session" in last, last
