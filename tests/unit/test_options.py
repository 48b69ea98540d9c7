"""Options: defaults, parsing, and clear errors for bad values."""

import re

import pytest
from hypothesis import given, strategies as st

from spark_state.options import DESCRIPTIONS, PREFIX, OptionError, Settings
from tests.support.paths import ROOT



def test_defaults_round_trip_through_spark_conf():
    assert Settings.from_conf(Settings().to_conf()) == Settings()


def test_full_and_short_keys_are_the_same_option():
    assert Settings.from_conf({PREFIX + "storage": "memory"}) == Settings.from_conf({"storage": "MEMORY"})


def test_other_spark_keys_are_ignored():
    assert Settings.from_conf({"spark.sql.shuffle.partitions": "7"}) == Settings()


@pytest.mark.parametrize("key, value, must_say", [
    ("storage", "tape", ["storage", "'tape'", "filesystem", "memory"]),
    ("maxParallelism", "lots", ["maxParallelism", "whole number"]),
    ("maxParallelism", "0", ["maxParallelism", "out of range"]),
    ("compressionLevel", "23", ["compressionLevel", "[1, 22]"]),
    ("memory.maxStateSize", "five", ["maxStateSize", "5m"]),
    ("checkpointRoot", "relative/dir", ["checkpointRoot", "absolute"]),
    ("verifyChecksums", "maybe", ["verifyChecksums", "true or false"]),
    ("rowImages.rangeReads", "sometimes", ["rowImages.rangeReads", "'sometimes'", "auto, true or false"]),
    ("rowImages.rangeReadsMinSize", "0", ["rangeReadsMinSize", "positive"]),
    ("snapshotIntervall", "3", ["unknown option", "snapshotIntervall", "snapshotInterval"]),
])
def test_bad_values_name_the_option_and_the_fix(key, value, must_say):
    with pytest.raises(OptionError) as err:
        Settings.from_conf({PREFIX + key: value})
    for text in must_say:
        assert text in str(err.value)


@pytest.mark.parametrize("value, small, large", [
    (None, False, True),       # the default, auto: by range from 64 MiB
    ("auto", False, True),
    ("true", True, True),
    ("FALSE", False, False),
])
def test_range_reads_are_auto_by_default_from_their_minimum_size(value, small, large):
    settings = Settings.from_conf({} if value is None else {"rowImages.rangeReads": value})
    assert settings.reads_by_range((64 << 20) - 1) is small
    assert settings.reads_by_range(64 << 20) is large
    assert Settings.from_conf(settings.to_conf()) == settings
    lower = Settings.from_conf({"rowImages.rangeReadsMinSize": "1m"})
    assert lower.reads_by_range(1 << 20) and not lower.reads_by_range((1 << 20) - 1)
    assert not Settings(row_image_range_reads="false").reads_by_range(1 << 30), "settings made in code, as text"


@given(st.integers(1, 10**6), st.sampled_from([("", 1), ("k", 1024), ("m", 1024**2), ("MiB", 1024**2), ("g", 1024**3)]))
def test_sizes_accept_units(n, unit):
    suffix, mult = unit
    assert Settings.from_conf({"memory.maxStateSize": f"{n}{suffix}"}).memory_max_state_size == n * mult


def test_spark_defaults_example_lists_every_option():
    text = (ROOT / "conf" / "spark-defaults.conf").read_text()
    for short in DESCRIPTIONS:
        assert PREFIX + short in text, f"conf/spark-defaults.conf does not show {short}"
        line = re.search(rf"^(?:# )?{re.escape(PREFIX + short)}\s", text, re.M)
        above = text[:line.start()].rstrip("\n").rsplit("\n", 1)[-1]
        assert above == "# " + DESCRIPTIONS[short], f"conf/spark-defaults.conf explains {short} otherwise than options.py"
    from spark_state.spark.config import spark_conf

    for key in spark_conf():  # the jar, the provider and the listener too (set, or shown commented out)
        assert re.search(rf"^(# )?{re.escape(key)}\s", text, re.M), f"conf/spark-defaults.conf does not show {key}"


def test_configure_validates_before_spark_starts():
    from spark_state.spark.config import option_conf, spark_conf

    assert option_conf(storage="memory", snapshot_interval=4) == {
        PREFIX + "storage": "memory", PREFIX + "snapshotInterval": "4"}
    with pytest.raises(OptionError, match="compressionLevel"):
        option_conf(compression_level=99)
    with pytest.raises(TypeError, match="snapshot_intervall"):
        spark_conf(snapshot_intervall=3)


def test_memory_limit_defaults_to_the_jvms_computation():
    """Unset, the worker answers null (validate) and the shim computes it from Spark's memory model: half of
    Spark's user memory, 145 MiB of a 1 GiB heap, as the description says."""
    assert Settings().memory_limit is None and Settings.from_conf({"memoryLimit": "145m"}).memory_limit == 145 << 20
    description = DESCRIPTIONS["memoryLimit"]
    assert "0.5 * (heap - 300 MiB) * (1 - spark.memory.fraction)" in description and "145 MiB of a 1 GiB" in description


def test_an_option_set_on_the_builder_fails_in_get_or_create_before_spark_starts():
    """configure()'s keywords are checked in the call; a value given to its builder with .config() in
    getOrCreate(), before a JVM is asked for anything (a fresh Builder: the global one is the suite's)."""
    from pyspark.sql import SparkSession

    import spark_state

    builder = spark_state.configure(SparkSession.Builder().master("local[1]"))
    builder.config(PREFIX + "snapshotInterval", "0")
    with pytest.raises(OptionError, match=r"snapshotInterval=0 is out of range.*\(set in the builder\)"):
        builder.getOrCreate()


def test_check_options_reads_the_conf_it_is_given():
    from spark_state import check_options

    check_options({PREFIX + "snapshotInterval": "5", "spark.sql.shuffle.partitions": "x"})
    with pytest.raises(OptionError, match="fileGracePeriod='soon' is not a duration"):
        check_options({PREFIX + "fileGracePeriod": "soon"})
