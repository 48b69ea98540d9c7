"""A Spark Connect client that runs one applyInPandasWithState query, for tests/spark/test_connect.py.

    python tests/support/connect_client.py sc://HOST:PORT WORKDIR PHASE

It imports nothing from spark_state: the state store is the server's business. Phase N adds
input file N under WORKDIR/events and runs a running-total query once (availableNow) from
WORKDIR/checkpoint into a JSON file sink; run phase 1, then phase 2 (against a new server) to
restart from the checkpoint. Prints one line ``RESULT {json}``: whether the session is a
Connect session, each key's latest total in the sink, and the server's state store provider.
The UDF is defined in ``__main__`` so the client pickles it by value for the server.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EVENTS = {1: [("a", 1), ("b", 2), ("a", 3)], 2: [("a", 10), ("c", 5)]}


def running_total(key, pdfs, state):
    import pandas as pd

    (k,) = key
    total = state.get[0] if state.exists else 0
    for pdf in pdfs:
        total += int(pdf["v"].sum())
    state.update((total,))
    yield pd.DataFrame({"k": [k], "total": [total]})


def main(url: str, workdir: Path, phase: int) -> int:
    from pyspark.sql import SparkSession

    events = workdir / "events"
    events.mkdir(parents=True, exist_ok=True)
    (events / f"part-{phase}.json").write_text("".join(json.dumps({"k": k, "v": v}) + "\n" for k, v in EVENTS[phase]))

    spark = SparkSession.builder.remote(url).getOrCreate()
    # A file sink: it resumes from the checkpoint (a memory sink in update mode would not).
    out = workdir / "out"
    query = (spark.readStream.schema("k string, v long").json(str(events)).groupBy("k")
             .applyInPandasWithState(running_total, "k string, total long", "total long", "append", "NoTimeout")
             .writeStream.outputMode("append").format("json").option("path", str(out))
             .option("checkpointLocation", str(workdir / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    totals: dict[str, int] = {}
    for row in spark.read.schema("k string, total long").json(str(out)).collect():
        totals[row["k"]] = max(totals.get(row["k"], 0), row["total"])
    result = {
        "connect": type(spark).__module__.startswith("pyspark.sql.connect"),
        "totals": totals,
        "provider": spark.conf.get("spark.sql.streaming.stateStore.providerClass"),
    }
    spark.stop()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
