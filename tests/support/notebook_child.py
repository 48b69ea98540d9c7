"""A notebook's sequence in one Python process, for tests/spark/test_notebook.py.

    python -m tests.support.notebook_child WORKDIR (works|foreign-loader)

A plain SparkSession starts the JVM without spark_state's jar and is stopped; then
``spark_state.configure(builder).getOrCreate()`` in the same process. ``works`` runs a streaming
count, stops the query and restarts it from its checkpoint. ``foreign-loader`` first gives the
calling JVM thread a class loader that cannot take jars (one without addURL), so getOrCreate() must refuse with
ShimNotLoaded. Prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    workdir, mode = Path(argv[1]), argv[2]
    import spark_state
    from spark_state.spark.config import ShimNotLoaded
    from tests.support.spark import spark_builder

    plain = spark_builder("notebook: plain session first").getOrCreate()
    plain.range(3).count()
    jvm = plain.sparkContext._jvm
    plain.stop()
    result: dict = {}
    if mode == "foreign-loader":
        # A loader over Spark's that has no addURL: everything still loads, nothing can be added.
        thread = jvm.java.lang.Thread.currentThread()
        thread.setContextClassLoader(jvm.org.apache.spark.util.ParentClassLoader(thread.getContextClassLoader()))
        try:
            spark_state.configure(spark_builder("notebook: configured")).getOrCreate()
            result["error"] = None
        except ShimNotLoaded as err:
            result["error"] = str(err)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    spark = spark_state.configure(spark_builder("notebook: configured")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    events = workdir / "events"
    events.mkdir(parents=True, exist_ok=True)
    counts = []
    for i, keys in enumerate(("aab", "ac")):
        (events / f"{i}.json").write_text("".join(json.dumps({"k": k}) + "\n" for k in keys))
        query = (spark.readStream.schema("k string").json(str(events)).groupBy("k").count()
                 .writeStream.outputMode("complete").format("memory").queryName(f"counts{i}")
                 .option("checkpointLocation", str(workdir / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        counts.append({r["k"]: r["count"] for r in spark.sql(f"select * from counts{i}").collect()})
    result["counts"] = counts
    result["manifests"] = len(list((workdir / "checkpoint" / "state").rglob("chk-*/_metadata")))
    spark.stop()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
