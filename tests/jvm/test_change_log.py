"""The shim's change log (a provider's puts and removes within one batch), through a real provider in a JVM
(tests/jvm/ChangeLogProbe.java, no Spark session) and a real worker."""

from __future__ import annotations

import subprocess

from tests.support.jvm_probes import probe_command


def test_a_batch_changing_keys_twice_commits_each_keys_last_change(tmp_path):
    """The shim appends every put and remove to its change log as it happens, so a key changed twice in a batch
    is in the log twice: the committed version (the provider's map, and a new provider loading it from the
    worker) holds each key's last change, and each file (the first version's snapshot, the second's delta)
    holds one row per key. Runs tests/jvm/ChangeLogProbe.java (a provider, no Spark session)."""
    import sys

    cmd = probe_command("ChangeLogProbe.java", "ChangeLogProbe", tmp_path)
    out = subprocess.run([*cmd, str(tmp_path / "ckpt"), sys.executable], capture_output=True, text=True, timeout=240)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("LIVE ", "LOADED ")))
    expected = "1=12/v12,2=21/v21,5=51/v51"
    assert lines.get("LIVE") == expected and lines.get("LOADED") == expected, (out.stdout, out.stderr[-3000:])

    from spark_state.format import datafile as snapshot
    from spark_state.options import DEFAULT_MAX_PARALLELISM

    files = sorted(p for p in (tmp_path / "ckpt").rglob("*.arrow") if "snapshot" in p.name or "delta" in p.name)
    assert len(files) == 2, files
    for f in files:
        keys = [k["k"] for k in snapshot.decode(f.read_bytes(), f.name, DEFAULT_MAX_PARALLELISM)["key"].to_pylist()]
        assert len(keys) == len(set(keys)), (f.name, keys)


def test_changes_streamed_during_the_batch_commit_exactly_through_a_worker_kill_and_an_abort(tmp_path):
    """A batch's changes go to the worker in chunks while it runs (here every 16,384 changes): a first version
    (a snapshot written in arrival order), a delta, a batch whose worker is SIGKILLed after some chunks went out
    (the commit sends them again to the new worker), a batch aborted mid-stream (nothing visible, its file
    dropped) and a key changed in two chunks (its last change wins). The provider's map and a new provider
    loading the last version agree with the model, and the aborted stream left no file."""
    import sys

    from spark_state.format import datafile
    from spark_state.format.manifest import DELTA, SNAPSHOT
    from tests.support.stores import open_stored

    cmd = probe_command("StreamProbe.java", "StreamProbe", tmp_path, "-Dio.sparkstate.streamChunkBytes=1", heap="1g")
    out = subprocess.run([*cmd, str(tmp_path / "ckpt" / "state"), sys.executable], capture_output=True, text=True,
                         timeout=300)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines.get("KILLED") == "1", (out.stdout, out.stderr[-3000:])
    model = {k: k for k in range(60_000)}
    model.update({k: k + 1_000_000 for k in range(30_000)})
    for k in range(59_900, 60_000):
        del model[k]
    model.update({k: k + 2_000_000 for k in range(40_000)})
    model.update({k: k + 3_000_000 for k in range(40_000)})
    model[5] = 7
    expected = f"{len(model)} {sum(model.values())}"
    assert lines.get("LIVE") == expected and lines.get("LOADED") == expected, (out.stdout, out.stderr[-3000:])
    assert "sending the 2 chunks of version 3 again" in out.stderr or "chunks of version 3 again" in out.stderr, \
        out.stderr[-3000:]

    store = open_stored(tmp_path / "ckpt")
    assert store.versions() == [1, 2, 3, 4]
    first = store.reader.read_manifest(1).files[0]
    assert first.kind == SNAPSHOT and first.rows == 60_000
    kg = datafile.decode(store.storage.read_file(first.path), first.path, store.settings.max_parallelism)["kg"]
    assert (kg.to_numpy()[1:] < kg.to_numpy()[:-1]).any(), "a streamed first version is in arrival order"
    assert [f.kind for f in store.reader.read_manifest(4).files] == [SNAPSHOT, DELTA, DELTA, DELTA]
    referenced = {p for v in store.versions() for p in store.reader.read_manifest(v).paths}
    leftovers = set(store.storage.list_files()) - referenced
    # the killed worker's partial file is a crash's leftover (retention collects it once below the window, as
    # any crashed commit's); the aborted stream's file was dropped by the worker
    assert all(p.startswith("shared/v0000000003-") for p in leftovers), leftovers


def test_the_whole_state_a_format_switch_commits_streams_as_changes_do(tmp_path):
    """A store whose base version is in file format 1 commits its whole state once, as typed files; that state
    leaves the JVM in chunks, as a batch's changes do (not encoded whole in the heap, outside the memory budget),
    and the worker keeps the file as streamed: the version's snapshot, in the order the rows came."""
    import sys

    from spark_state.format import datafile
    from spark_state.format.manifest import SNAPSHOT
    from tests.support.stores import open_stored

    cmd = probe_command("WholeStreamProbe.java", "WholeStreamProbe", tmp_path, "-Dio.sparkstate.streamChunkBytes=1",
                        heap="1g")
    out = subprocess.run([*cmd, str(tmp_path / "ckpt" / "state"), sys.executable], capture_output=True, text=True,
                         timeout=300)
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    model = {k: k for k in range(60_000)}
    model.update({k: k + 1_000_000 for k in range(10)})
    expected = f"{len(model)} {sum(model.values())}"
    assert lines.get("LIVE") == expected and lines.get("LOADED") == expected, (out.stdout, out.stderr[-3000:])

    store = open_stored(tmp_path / "ckpt")
    assert [f.typed for f in store.reader.read_manifest(1).files] == [False], "version 1 must be in file format 1"
    [whole] = store.reader.read_manifest(2).files
    assert whole.kind == SNAPSHOT and whole.typed and whole.rows == 60_000
    kg = datafile.decode(store.storage.read_file(whole.path), whole.path, store.settings.max_parallelism)["kg"]
    # a whole state sent with the commit is written sorted by key group; the file as streamed is not
    assert (kg.to_numpy()[1:] < kg.to_numpy()[:-1]).any(), "the snapshot is the file as streamed, in chunks"
    referenced = {p for v in store.versions() for p in store.reader.read_manifest(v).paths}
    assert set(store.storage.list_files()) == referenced, "nothing staged is left behind"
