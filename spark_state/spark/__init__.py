"""Spark's side of the house: Spark's own checkpoint files (``files``), a checkpoint directory and the
stores in it as the offline tools see it (``checkpoint``), turning spark_state on for a session
(``config``) and the JVM shim's jar (``shim``). Imports nothing heavy: setup.py and the worker use it."""
