"""``python -m spark_state``: the ``spark-state`` CLI (see spark_state.cli)."""

import sys

from spark_state.cli import main

sys.exit(main())
