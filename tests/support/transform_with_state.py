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


class TotalProcessor(StatefulProcessor):
    """transformWithStateInPandas: running_total's sum and count per key (no timeout) in a ValueState, which
    ``initialState`` seeds: the state an applyInPandasWithState query kept, read with Spark's state reader."""

    def init(self, handle):
        self.state = handle.getValueState("total", "total long, n long")

    def handleInitialState(self, key, initialState, timerValues):
        row = initialState.iloc[0]
        self.state.update((int(row["total"]), int(row["n"])))

    def handleInputRows(self, key, rows, timerValues):
        total, n = self.state.get() if self.state.exists() else (0, 0)
        for pdf in rows:
            total += int(pdf["v"].sum())
            n += len(pdf)
        self.state.update((total, n))
        yield pd.DataFrame({"k": [key[0]], "total": [total], "n": [n], "kind": ["update"]})

    def close(self):
        pass
