"""transformWithStateInPandas, which spark_state refuses (column families) and Spark runs on RocksDB: the query
the refusal tests and the migration's refusal of a transformWithState checkpoint run."""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor


class CountProcessor(StatefulProcessor):
    """transformWithStateInPandas: a running count per key in a ValueState."""

    def init(self, handle):
        self.count = handle.getValueState("count", "c long")

    def handleInputRows(self, key, rows, timerValues):
        c = self.count.get()[0] if self.count.exists() else 0
        for pdf in rows:
            c += len(pdf)
        self.count.update((c,))
        yield pd.DataFrame({"k": [key[0]], "c": [c]})

    def close(self):
        pass


def transform_with_state(events):
    """A transformWithStateInPandas query (column families: RocksDB only) on a stream of EVENTS."""
    return events.groupBy("k").transformWithStateInPandas(
        statefulProcessor=CountProcessor(), outputStructType="k string, c long",
        outputMode="Update", timeMode="None")
