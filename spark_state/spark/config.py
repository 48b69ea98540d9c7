"""One call to turn spark_state on for a SparkSession, in the style of delta-spark's helper."""

from __future__ import annotations

import sys
from typing import Any

from spark_state import PROVIDER_CLASS
from spark_state.errors import OptionError, ShimNotLoaded
from spark_state.options import OPTION_FIELDS, PREFIX, Settings

_PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
_LISTENERS_KEY = "spark.sql.streaming.streamingQueryListeners"
_PLUGINS_KEY = "spark.plugins"
#: Executor plugin that starts each executor's worker when the executor starts (option prestartWorker).
WORKER_PLUGIN = "io.sparkstate.shim.SparkStatePlugin"
#: Driver-side listener that logs a warning when stores report failing background maintenance.
MAINTENANCE_LISTENER = "io.sparkstate.shim.MaintenanceWarnings"

#: configure() keyword -> option short name, so Python callers can use snake_case (the Settings fields).
KEYWORDS = {field: name for name, field in OPTION_FIELDS.items()}


def option_conf(**options: Any) -> dict[str, str]:
    """The ``...sparkState.*`` conf entries for snake_case ``options``, validated (OptionError)."""
    unknown = sorted(set(options) - set(KEYWORDS))
    if unknown:
        raise TypeError(f"unknown spark_state option(s) {unknown}; known: {sorted(KEYWORDS)}")
    raw = {KEYWORDS[k]: ("true" if v is True else "false" if v is False else str(v))
           for k, v in options.items() if v is not None}
    Settings.from_conf(raw)  # raises OptionError with a clear message
    return {PREFIX + k: v for k, v in raw.items()}


def spark_conf(**options: Any) -> dict[str, str]:
    """Every Spark conf entry configure() sets, as a dict (for --conf lines or spark-defaults.conf).

    Values are validated here, so a bad value fails before Spark starts.
    """
    from spark_state.spark.shim import shim_jar

    options.setdefault("python", sys.executable)
    conf = option_conf(**options)
    conf[_PROVIDER_KEY] = PROVIDER_CLASS
    conf[_LISTENERS_KEY] = MAINTENANCE_LISTENER
    if Settings.from_conf(conf).prestart_worker:
        conf[_PLUGINS_KEY] = WORKER_PLUGIN
    conf["spark.jars"] = str(shim_jar())
    return conf


def configure(builder, **options: Any):
    """Returns ``builder`` with the shim jar on the classpath and spark_state as the state store.

    ``options`` are the plugin's options in snake_case (see ``spark_state.options``):
    ``configure(SparkSession.builder, storage="filesystem", snapshot_interval=5)``. They are checked here;
    the builder's ``getOrCreate()`` checks every spark_state option set otherwise (``builder.config``,
    ``--conf``, ``spark-defaults.conf``) before Spark starts and once the session has its conf, so a bad
    value fails there, not in the first batch (docs/configuration.md, "When a value is checked").
    A ``spark.jars`` value already on the builder is kept; the shim jar is appended.

    ``spark.jars`` only reaches the driver's classpath when it starts the JVM. When a JVM is
    already running in this process (a notebook that started a plain session first, or an
    application under spark-submit without ``--jars``), the builder's ``getOrCreate()`` also
    adds the jar to the driver's class loader (see ``ensure_driver_classpath``).
    """
    conf = spark_conf(**options)
    jar = conf["spark.jars"]
    if _PLUGINS_KEY in conf and _jvm_running():
        # A JVM started without the jar cannot load the plugin class when its next SparkContext starts;
        # the first state store starts the worker instead.
        del conf[_PLUGINS_KEY]
    for key in ("spark.jars", _LISTENERS_KEY, _PLUGINS_KEY):   # lists: keep what the builder already has
        if key not in conf:
            continue
        existing = builder._options.get(key) if hasattr(builder, "_options") else None
        value = conf.pop(key)
        if existing and value not in existing.split(","):
            value = f"{existing},{value}"
        builder = builder.config(key, value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    get_or_create = builder.getOrCreate

    def get_or_create_with_shim():
        check_options(getattr(builder, "_options", {}), "the builder")   # before Spark starts
        session = get_or_create()
        ensure_driver_classpath(session, jar)
        check_options(_session_conf(session), "the session (--conf, spark-defaults.conf, the builder)")
        return session

    get_or_create_with_shim.__doc__ = get_or_create.__doc__
    builder.getOrCreate = get_or_create_with_shim
    return builder


def check_options(conf, where: str = "the session") -> None:
    """Raises OptionError for a spark_state option in `conf` (a SparkSession, or Spark conf entries) that the
    worker would refuse in the first batch: what ``spark.conf.set`` sets is otherwise checked only there."""
    if hasattr(conf, "conf") and hasattr(conf, "readStream"):
        conf = _session_conf(conf)
    ours = {k: str(v) for k, v in dict(conf).items() if str(k).startswith(PREFIX)}
    try:
        Settings.from_conf(ours)
    except OptionError as err:
        raise OptionError(f"{err} (set in {where})") from None


def _session_conf(session) -> dict:
    try:
        return dict(session.conf.getAll)
    except Exception:  # noqa: BLE001 - a session that cannot list its conf is checked by the worker at the first batch
        return {}


def _jvm_running() -> bool:
    """Whether this Python process already started a Spark JVM (whose classpath lacks a jar added now)."""
    module = sys.modules.get("pyspark")
    context = getattr(module, "SparkContext", None) if module else None
    return getattr(context, "_jvm", None) is not None


def ensure_driver_classpath(session, jar: str) -> None:
    """Makes the provider class loadable by ``session``'s driver, or raises ShimNotLoaded saying what to do.

    Spark loads the provider with the thread's context class loader. A JVM started before
    spark_state was configured lacks the jar there; when that loader is Spark's
    MutableURLClassLoader (pyspark and spark-submit start the driver with one), the jar is
    added to it. Spark Connect sessions have no driver here and are left alone.
    """
    try:
        jvm = session.sparkContext._jvm
    except Exception:  # noqa: BLE001 - Spark Connect: the server's classpath is its own conf
        return
    from py4j.protocol import Py4JError

    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()

    def loadable() -> bool:
        try:
            jvm.java.lang.Class.forName(PROVIDER_CLASS, False, loader)
            return True
        except Py4JError:
            return False

    if loadable():
        return
    try:
        loader.addURL(jvm.java.io.File(jar).toURI().toURL())
    except Py4JError:
        pass
    if not loadable():
        raise ShimNotLoaded(
            "spark_state: the Spark JVM of this Python process was started without the spark_state jar "
            f"({jar}) and its class loader ({loader.getClass().getName()}) cannot take it now, so Spark "
            f"would fail with ClassNotFoundException: {PROVIDER_CLASS}. Fix: restart the Python process "
            "(in a notebook: restart the kernel) and call spark_state.configure(builder) before the first "
            "SparkSession is created, or start Spark with --jars set to that jar "
            "(python -m spark_state.spark.shim path prints it)."
        )

