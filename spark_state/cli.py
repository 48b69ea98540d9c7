"""``spark-state``: operate on spark_state checkpoints and savepoints without a Spark session.

    spark-state ls        LOCATION                 batches, operators, stores, versions, bytes
    spark-state inspect   LOCATION -o OP -p PART   one store: rows, key-group histogram, chain of files
    spark-state validate  LOCATION                 every named file exists and matches its checksum
    spark-state export    LOCATION OUTPUT          state of a batch as Parquet
    spark-state changes   LOCATION [OUTPUT]        what each batch changed (Parquet, a table, or --json)
    spark-state savepoint LOCATION [--target DIR]  a self-contained savepoint of a batch
    spark-state restore   SOURCE TARGET [--batch]  a new checkpoint that resumes at a batch
    spark-state rescale   LOCATION N               change the partition count, metadata only
    spark-state migrate   CHECKPOINT TARGET [--to] a new checkpoint on spark_state, Spark's HDFS or RocksDB provider

LOCATION is a path or an fsspec URL (file://, s3://, ...). Every command takes
``--json`` (one JSON document on stdout), ``--conf KEY=VALUE`` (the query's
spark_state options, e.g. its ``checkpointRoot``) and ``--no-progress``.
Exit status: 0 done, 1 validate found problems, 2 the command could not run
(one line says why and what to do; --traceback shows Python's traceback instead).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

import spark_state
from spark_state.errors import OptionError
from spark_state.storage.layout import DEFAULT_STORE

EXIT_OK, EXIT_INVALID, EXIT_ERROR = 0, 1, 2


def _conf(values: list[str]) -> dict[str, str]:
    out = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OptionError(f"--conf {item!r} is not KEY=VALUE; e.g. --conf "
                              f"spark.sql.streaming.stateStore.sparkState.checkpointRoot=s3://bucket/state")
        out[key.strip()] = value.strip()
    return out


def _refuse_memory_storage(command: str, options: dict[str, str]) -> None:
    """Memory storage keeps a query's state in its worker process only, so a checkpoint of such a query has no
    state on disk: say so rather than list or copy an empty checkpoint."""
    from spark_state.options import settings_from

    if settings_from(options).storage == "memory":
        raise OptionError(f"--conf storage=memory: memory storage keeps state only in the worker process's memory, "
                          f"nothing on disk for spark-state {command} to read. Run the query with "
                          f"storage=filesystem (the default) to operate on its checkpoint, or drop the --conf if "
                          f"it ran with filesystem storage.")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a spark_state option of the query (full key or short name), repeatable")
    common.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    common.add_argument("--traceback", action="store_true",
                        help="on an error, the Python traceback instead of one line (for a bug report)")

    text = __doc__.replace("``", "")  # plain text on a terminal
    parser = argparse.ArgumentParser(prog="spark-state", description=text.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(text.split("\n\n")[1:]))
    parser.add_argument("--version", action="version", version=f"spark-state (spark_state) {spark_state.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("ls", parents=[common], help="batches, operators, stores, versions and bytes")
    p.add_argument("location", help="checkpoint location or savepoint directory")

    p = sub.add_parser("inspect", parents=[common], help="one store: rows, key-group histogram, chain of files")
    p.add_argument("location", help="checkpoint location or savepoint directory")
    p.add_argument("-o", "--operator", type=int, required=True, help="operator id (spark-state ls lists them)")
    p.add_argument("-p", "--partition", type=int, required=True, help="partition number, from 0")
    p.add_argument("-s", "--store", default=DEFAULT_STORE,
                   help=f"store name (joins have four); default '{DEFAULT_STORE}'")
    at = p.add_mutually_exclusive_group()
    at.add_argument("--batch", type=int, help="the state of this committed batch (default: the latest)")
    at.add_argument("--version", type=int, help="this store version (= batch + 1)")

    p = sub.add_parser("validate", parents=[common], help="every referenced file exists and matches its checksum")
    p.add_argument("location", help="checkpoint location or savepoint directory")
    p.add_argument("--batch", type=int, help="check only the state of this batch (default: every retained version)")

    p = sub.add_parser("export", parents=[common], help="state of a batch as Parquet")
    p.add_argument("location", help="checkpoint location or savepoint directory")
    p.add_argument("output", help="new or empty directory")
    p.add_argument("--batch", type=int, help="committed batch (default: the latest)")
    p.add_argument("-o", "--operator", type=int, action="append", help="only this operator (repeatable)")

    p = sub.add_parser("changes", parents=[common], help="what each batch changed in an operator's state "
                                                         "(Spark's change feed), as Parquet, a table or --json")
    p.add_argument("location", help="checkpoint location or savepoint directory")
    p.add_argument("output", nargs="?", help="a new .parquet file (default: print the rows)")
    p.add_argument("-o", "--operator", type=int, default=0, help="operator id (default 0; spark-state ls lists them)")
    p.add_argument("-s", "--store", help="store name (joins have four)")
    p.add_argument("--start-batch", type=int, default=0, help="first batch (default 0)")
    p.add_argument("--end-batch", type=int, help="last batch (default: the latest committed)")
    p.add_argument("-p", "--partition", type=int, action="append", help="only this partition (repeatable)")

    p = sub.add_parser("savepoint", parents=[common], help="a self-contained savepoint of a committed batch")
    p.add_argument("location", help="checkpoint location of the query (it may keep running)")
    p.add_argument("--target", help="directory for savepoint-<id>-<random>/, outside the checkpoint "
                                    "(default: the savepointDir option)")
    p.add_argument("--batch", type=int, help="committed batch (default: the latest)")

    p = sub.add_parser("restore", parents=[common], help="a new checkpoint that resumes after a batch")
    p.add_argument("source", help="savepoint directory or checkpoint location")
    p.add_argument("target", help="new or empty checkpoint location")
    p.add_argument("--batch", type=int, help="retained batch of a checkpoint source (default: the latest)")

    p = sub.add_parser("rescale", parents=[common], help="change the partition count (metadata only)")
    p.add_argument("location", help="checkpoint location of a stopped query")
    p.add_argument("num_partitions", type=int, help="the partition count the query resumes with")

    p = sub.add_parser("migrate", parents=[common], help="a new checkpoint on spark_state or Spark's HDFS or RocksDB "
                                                         "provider (starts a local Spark)")
    p.add_argument("checkpoint", help="checkpoint location of a stopped query (HDFS, RocksDB or spark_state)")
    p.add_argument("target", help="new or empty checkpoint location")
    p.add_argument("--to", choices=("spark_state", "hdfs", "rocksdb"), default="spark_state",
                   help="the provider the query continues on (default spark_state)")
    return parser


# ------------------------------------------------------------------ rendering

def _console():
    from rich.console import Console

    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def _count(n: int, noun: str) -> str:
    """``1 row``, ``2 rows``: a count with its noun (plural in ``s``, as every noun printed here is)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _show_ls(r: dict) -> None:
    from rich.table import Table

    from spark_state.storage.layout import format_versions

    con = _console()
    if r["kind"] == "savepoint":
        con.print(f"savepoint {r['location']}\n  query {r['query_id']}, batch {r['batch']} "
                  f"(resumes with batch {r['batch'] + 1}), {r['num_partitions']} partitions, "
                  f"{r['files']} files, {_human(r['bytes'])}\n  taken from {r['source']}")
        return
    b = r["batches"]
    provider = r["provider"] or ("Spark's default (HDFSBackedStateStoreProvider)" if r.get("provider_known") else
                                 "(unknown: no offset log could be read)")
    con.print(f"checkpoint {r['location']}\n  query {r['query_id'] or '(unreadable)'}\n  provider {provider}")
    con.print(f"  batches: offsets {format_versions(b['offsets'])}; committed {format_versions(b['committed'])}; "
              f"restorable {format_versions(b['restorable'])}")
    if b["damaged"]:
        con.print(f"  damaged: {format_versions([d['batch'] for d in b['damaged']])} (batch {b['damaged'][0]['batch']}: "
                  f"{b['damaged'][0]['reason']}); spark-state validate names every bad file")
    con.print(f"  partitions: {r['num_partitions'] if r['num_partitions'] is not None else '(unknown)'}")
    for p in r["problems"]:
        con.print(f"  unreadable: {p['file']}: {p['message']}")
    if r.get("note"):
        con.print(f"  note: {r['note']}")
    for op in r["operators"]:
        con.print(f"operator {op['id']} ({op['name']}): stores {', '.join(op['stores'])}")
        if not op.get("partitions"):
            continue
        table = Table(box=None, pad_edge=False)
        for col in ("store", "partition", "versions", "files", "bytes"):
            table.add_column(col, justify="right" if col in ("partition", "files", "bytes") else "left")
        for s in op["partitions"]:
            versions = format_versions(s["versions"])
            if s["damaged"]:
                which = "version" if len(s["damaged"]) == 1 else "versions"
                versions += f" ({which} {format_versions(s['damaged'])} damaged)"
            table.add_row(s["name"], str(s["partition"]), versions, str(s["files"]), _human(s["bytes"]))
        con.print(table)


def _show_inspect(r: dict) -> None:
    from rich.table import Table

    con = _console()
    kg = r["key_groups"]
    owned = kg.get("owned")
    of = f"the {owned} key groups it owns" if owned is not None else f"{kg['max_parallelism']} key groups"
    con.print(f"store operator {r['operator']}, partition {r['partition']}, {r['store']}: version {r['version']} "
              f"(batch {r['batch']}), {_count(r['rows'], 'row')} in {kg['key_groups_with_rows']} of {of}\n  {r['root']}")
    chain = Table(title="chain (oldest first)", box=None, pad_edge=False, title_justify="left")
    for col in ("kind", "version", "rows", "bytes", "checksum", "path"):
        chain.add_column(col)
    for f in r["chain"]:
        where = f["path"]
        if f.get("partition") is not None:
            where += f" (in partition {f['partition']}'s store)"
        if f.get("modulus") is not None:
            where += f" [rows with pmod(hash, {f['modulus']}) = {f['residue']}]"
        chain.add_row(f["kind"], str(f["version"]), str(f["rows"]), _human(f["bytes"]), f["checksum"], where)
    con.print(chain)
    if not r["rows"]:
        con.print(f"no rows at batch {r['batch']}: this partition holds no key (spark-state ls shows each "
                  f"partition's bytes; a key's partition is Spark's hash of it modulo the partition count)")
        return
    rows = kg["rows_per_key_group"]
    con.print(f"rows per non-empty key group: min {rows['min']}, mean {rows['mean']:.1f}, max {rows['max']}")
    top = max((bk["rows"] for bk in kg["buckets"]), default=0) or 1
    hist = Table(title="key-group histogram", box=None, pad_edge=False, title_justify="left")
    for col in ("key groups", "groups with rows", "rows", ""):
        hist.add_column(col, justify="right" if col != "" else "left")
    for bk in kg["buckets"]:
        hist.add_row(f"{bk['from']}-{bk['to']}", str(bk["key_groups"]), str(bk["rows"]),
                     "█" * max(0, round(40 * bk["rows"] / top)))
    con.print(hist)


def _show_validate(r) -> None:
    from spark_state.storage.layout import format_versions

    con = _console()
    if r.ok:
        con.print(f"ok: {r.kind} {r.location}: {r.files} files, {_human(r.bytes)} checked")
        return
    for p in r.problems:
        print(f"BAD {p.file}: {p.message}", file=sys.stderr)
    con.print(f"{len(r.problems)} problem(s) in {r.kind} {r.location} ({r.files} files checked fine)")
    if r.affected_batches:
        con.print(f"they affect {'batch' if len(r.affected_batches) == 1 else 'batches'} "
                  f"{format_versions(r.affected_batches)} (the query cannot resume from those)")
    if r.way_back is not None:
        con.print(f"way back: spark-state restore {r.location} NEW_LOCATION --batch {r.way_back}  (a new checkpoint "
                  f"that resumes the query after batch {r.way_back}, the latest batch no problem affects)")
    elif r.kind == "checkpoint" and r.affected_batches:
        con.print("no retained batch is intact: restore a savepoint (spark-state restore SAVEPOINT NEW_LOCATION) "
                  "if you took one")


# ------------------------------------------------------------------ commands

def _run(args) -> tuple[object, Callable[[object], None], int]:
    from spark_state.lifecycle.progress import for_terminal

    options = _conf(args.conf)
    _refuse_memory_storage(args.command, options)
    progress = for_terminal(not args.no_progress)
    if args.command == "ls":
        from spark_state.lifecycle.overview import overview

        return overview(args.location, options=options, progress=progress), _show_ls, EXIT_OK
    if args.command == "inspect":
        from spark_state.lifecycle.overview import store_report

        r = store_report(args.location, args.operator, args.partition, args.store, batch=args.batch,
                         version=args.version, options=options)
        return r, _show_inspect, EXIT_OK
    if args.command == "validate":
        from spark_state.lifecycle.validate import validate

        r = validate(args.location, batch=args.batch, options=options, progress=progress)
        return r, _show_validate, EXIT_OK if r.ok else EXIT_INVALID
    if args.command == "export":
        from spark_state.lifecycle.export import export

        r = export(args.location, args.output, batch=args.batch, operators=args.operator, options=options,
                   progress=progress)
        return r, lambda r: print(f"exported batch {r.batch}: {_count(r.rows, 'row')} in "
                                  f"{_count(r.files, 'Parquet file')} under {r.output}"), EXIT_OK
    if args.command == "changes":
        return _changes(args, options), _show_changes, EXIT_OK
    if args.command == "savepoint":
        from spark_state.lifecycle.savepoint import read_savepoint, savepoint

        url = savepoint(args.location, args.target, batch=args.batch, options=options, progress=progress)
        meta = read_savepoint(url)
        r = {"savepoint": url, "query_id": meta.query_id, "batch": meta.batch, "files": len(meta.files),
             "bytes": sum(f.size for f in meta.files)}
        return r, lambda r: print(r["savepoint"]), EXIT_OK
    if args.command == "restore":
        from spark_state.lifecycle.restore import restore

        r = restore(args.source, args.target, args.batch, options=options, progress=progress)
        return r, lambda r: print(f"restored batch {r.batch} of {r.source} into {r.location} (new query id "
                                  f"{r.query_id}); start the query there to resume with batch {r.batch + 1}"), EXIT_OK
    if args.command == "rescale":
        from spark_state.lifecycle.rescale import rescale

        r = rescale(args.location, args.num_partitions, options=options, progress=progress)
        return r, lambda r: print(f"rescaled {r.location} from {r.old_partitions} to {r.new_partitions} partitions "
                                  f"at batch {r.batch} ({r.manifests} manifests, {_human(r.bytes_written)} written, "
                                  f"{r.seconds:.2f} s); restart the query to run with {r.new_partitions}"), EXIT_OK
    if args.command == "migrate":
        from spark_state.lifecycle.migrate import migrate

        r = migrate(args.checkpoint, args.target, args.to, options=options, progress=progress)
        return r, lambda r: print(f"migrated batch {r.batch} of {r.source} ({r.source_provider}) into {r.location} "
                                  f"({r.target_provider}, new query id {r.query_id}): {r.stores} store partitions, "
                                  f"{_count(r.rows, 'row')}, {_human(r.bytes)} in {r.seconds:.1f} s; start the query "
                                  f"there to resume with batch {r.batch + 1}"), EXIT_OK
    raise AssertionError(args.command)


def _changes(args, options) -> dict:
    """``spark-state changes``: the rows of read_changes, written as Parquet when an output is given."""
    import io

    import pyarrow.parquet as pq

    from spark_state.errors import CheckpointError
    from spark_state.lifecycle.reading import read_changes
    from spark_state.storage.directory import Dir

    if args.output:   # checked before the checkpoint is read: a wrong name should not cost a read
        parent, _, name = args.output.rstrip("/").rpartition("/")
        if not name.lower().endswith(".parquet"):
            raise CheckpointError(f"OUTPUT {args.output!r} must be a .parquet file (changes writes Parquet); "
                                  f"name one, e.g. changes.parquet, or leave it out to print the rows "
                                  f"(--json for JSON).")
        out = Dir(parent or ".")
        if out.exists(name):
            raise CheckpointError(f"refusing to overwrite {args.output}; give a new file.")
    table = read_changes(args.location, args.operator, args.store, args.start_batch, args.end_batch, args.partition,
                         options=options)
    result = {"operator": args.operator, "rows": table.num_rows}
    if args.output:
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        out.copy_in(name, sink.getvalue())
        result["output"] = args.output
    else:
        result["changes"] = table.to_pylist()
    return result


def _show_changes(r: dict) -> None:
    from rich.table import Table

    if "output" in r:
        print(f"wrote {_count(r['rows'], 'change')} of operator {r['operator']} to {r['output']}")
        return
    table = Table(box=None, pad_edge=False)
    for col in ("batch_id", "change_type", "key", "value", "partition_id"):
        table.add_column(col)
    for row in r["changes"]:
        table.add_row(*(str(row[c]) for c in ("batch_id", "change_type", "key", "value", "partition_id")))
    _console().print(table)


def _jsonable(value):
    import dataclasses

    if dataclasses.is_dataclass(value):
        out = {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if hasattr(value, "ok"):
            out["ok"] = value.ok
        return out
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _printable(text: str) -> str:
    """One line on a terminal: control characters (a location's newline or escape) shown as escapes."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _location(args, err: BaseException | None = None) -> str | None:
    """The location a storage error is about: the one the command reads; for an object store's credential or
    connection error, the first object-store URL among the command's locations and its --conf values (an S3
    target of a local checkpoint, an S3 checkpointRoot), since a local path needs no credentials."""
    given = [getattr(args, a, None) for a in ("location", "source", "checkpoint", "target", "output")]
    given += [v for item in (getattr(args, "conf", None) or []) for v in [item.partition("=")[2].strip()]]
    given = [str(g) for g in given if g]
    if err is not None:
        from spark_state.lifecycle.failures import is_object_store_error

        if is_object_store_error(err):
            remote = [g for g in given if "://" in g and not g.lower().startswith(("file://", "local://"))]
            if remote:
                return remote[0]
    return given[0] if given else None


def _way_back_hint(args, err: BaseException) -> str:
    """For a damaged file met on the way (a manifest that does not parse, a checksum): the command that names
    every damaged file and the batch to go back to."""
    from spark_state.errors import ChecksumMismatch

    location = _location(args)
    if not isinstance(err, ChecksumMismatch) or args.command == "validate" or not location:
        return ""
    try:
        from spark_state.storage.directory import Dir

        location = Dir(location).url
    except Exception:  # noqa: BLE001 - the hint names the location as given
        pass
    return f" `spark-state validate {location}` names every damaged file and the batch to go back to."


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    try:
        result, show, code = _run(args)
    except Exception as err:  # noqa: BLE001 - every failure is one line that says what to do (failures.py)
        if args.traceback:   # the traceback instead of the line, with the same exit status
            import traceback

            traceback.print_exc()
            return EXIT_ERROR
        from spark_state.lifecycle.failures import explain

        message = explain(err, _location(args, err)) + _way_back_hint(args, err)
        if args.json:
            print(json.dumps({"ok": False, "command": args.command, "kind": type(err).__name__, "error": message}))
        print(f"spark-state {args.command}: error: {_printable(message)}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        body = _jsonable(result)
        if isinstance(body, dict):
            body.setdefault("ok", True)
            body["seconds"] = round(time.perf_counter() - started, 3)
        print(json.dumps(body, default=str))
    else:
        show(result)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
