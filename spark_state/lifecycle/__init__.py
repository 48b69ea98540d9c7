"""Operating on checkpoints: savepoint, restore, rescale, validate, export (see the CLI, spark_state.cli)."""

from spark_state.lifecycle.rescale import Rescaled, rescale
from spark_state.lifecycle.restore import Restored, restore
from spark_state.lifecycle.savepoint import read_savepoint, savepoint

__all__ = ["Rescaled", "Restored", "read_savepoint", "rescale", "restore", "savepoint"]
