"""The names and numbers the JVM shim and the Python worker must agree on, read from both sides: the Java
constants from the compiled shim (``javap -constants``), the Python ones from spark_state. Most of them
would fail silently if they drifted apart (options under another prefix are not sent, a protocol version
nobody compares), so a change on one side alone fails here. Needs a JDK, not Spark."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import spark_state
from spark_state import errors, options
from spark_state.spark.config import MAINTENANCE_LISTENER, WORKER_PLUGIN
from spark_state.worker.protocol import PROTOCOL_VERSION
from spark_state.worker.server import Dispatcher

PACKAGE = "io.sparkstate.shim.worker"
#: The shim's classes that hold constants shared with Python.
HOLDERS = ("Options", "StoreClient", "WorkerConnection")
_CONSTANT = re.compile(r"^\s*(?:\w+ )*static final (?P<type>[\w.]+) (?P<name>\w+) = (?P<value>.*);$")


def _javap(*classes: str) -> str:
    from spark_state.spark import shim

    if shutil.which("javap") is None:
        pytest.skip("needs a JDK 17 (javap)")
    return subprocess.run(["javap", "-p", "-constants", "-cp", str(shim.shim_jar()), *classes],
                          capture_output=True, text=True, check=True).stdout


def _value(kind: str, text: str):
    if kind == "java.lang.String":
        return text[1:-1]
    return int(text.rstrip("lL"))


@pytest.fixture(scope="module")
def java() -> dict[str, dict[str, object]]:
    """{class: {constant: value}} of the shim's constant holders, as compiled."""
    holders: dict[str, dict[str, object]] = {}
    current = None
    for line in _javap(*(f"{PACKAGE}.{c}" for c in HOLDERS)).splitlines():
        header = re.search(rf"class {re.escape(PACKAGE)}\.(\w+)", line)
        if header:
            current = holders.setdefault(header.group(1), {})
        elif (m := _CONSTANT.match(line)) and current is not None:
            current[m["name"]] = _value(m["type"], m["value"])
    assert set(holders) == set(HOLDERS), holders
    return holders


def test_option_prefix_and_default_max_parallelism(java):
    assert java["Options"]["PREFIX"] == options.PREFIX
    assert java["Options"]["DEFAULT_MAX_PARALLELISM"] == options.DEFAULT_MAX_PARALLELISM
    assert options.Settings().max_parallelism == options.DEFAULT_MAX_PARALLELISM


def test_the_options_the_shim_reads_mean_the_same_to_the_worker(java):
    names = java["Options"]
    settings = options.Settings.from_conf({
        options.PREFIX + names["MAX_PARALLELISM"]: "7",
        options.PREFIX + names["PYTHON"]: "/opt/python",
        options.PREFIX + names["PRESTART_WORKER"]: "false",
    })
    assert (settings.max_parallelism, settings.python, settings.prestart_worker) == (7, "/opt/python", False)


def test_protocol_version(java):
    assert java["WorkerConnection"]["PROTOCOL"] == PROTOCOL_VERSION


def test_every_op_the_shim_sends_is_one_the_worker_dispatches(java):
    ops = [v for k, v in java["StoreClient"].items() if k.startswith("OP_")] + [java["WorkerConnection"]["OP_HELLO"]]
    assert {"validate", "load", "stage", "commit", "abort", "maintenance", "hello"} <= set(ops)   # the holders were read
    missing = [op for op in ops if not callable(getattr(Dispatcher, f"op_{op}", None))]
    assert not missing, f"the shim sends ops the worker's Dispatcher does not have: {missing}"


def test_the_error_kinds_the_shim_maps_are_worker_errors(java):
    kind = java["WorkerConnection"]["KIND_OPTION_ERROR"]
    assert getattr(errors, kind) is options.OptionError   # the worker sends type(err).__name__
    assert getattr(errors, java["WorkerConnection"]["KIND_STREAM_LOST"]) is errors.StreamLost


def test_the_classes_python_names_are_in_the_jar():
    """configure() names the provider, the executor plugin and the listener: each is a public class of the
    shim of the right kind, with the public no-arg constructor Spark instantiates it by."""
    kinds = {spark_state.PROVIDER_CLASS: "implements org.apache.spark.sql.execution.streaming.state.StateStoreProvider",
             WORKER_PLUGIN: "implements org.apache.spark.api.plugin.SparkPlugin",
             MAINTENANCE_LISTENER: "extends org.apache.spark.sql.streaming.StreamingQueryListener"}
    out = _javap(*kinds)
    for name, kind in kinds.items():
        assert re.search(rf"^public class {re.escape(name)} {re.escape(kind)}", out, re.M), (name, out)
        assert f"public {name}();" in out, name
