"""Restores over row images on remote checkpoint storage (issue 38), through spark_state providers in a JVM with a
real worker (tests/jvm/RemoteImageProbe.java) and the loopback S3 server: a store restored on an executor that
holds none of its files reads the image's tail from the load reply and fetches only the blocks its lookups need,
by range, while the rest arrives in the executor's local cache in the background; the cache is bounded and
evicts, and a copy that vanished, shrank or was damaged costs a fetch, never a wrong answer."""

from __future__ import annotations

import re
import shutil
import sys
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from tests.support import s3_server
from tests.support.jvm_probes import ProbeProcess, probe_command

KEYS = 20_000
#: Row images for every snapshot; the changes after one are compacted only when asked for.
IMAGES = ["rowImages.minRows=0", "snapshotInterval=100", "rowImages.rangeReads=true"]


@pytest.fixture(scope="module")
def endpoint() -> str:
    return s3_server.start()


@pytest.fixture(scope="module")
def classes(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("remote-probe")


class Probe(ProbeProcess):
    """A JVM of providers; ``options`` go to every provider it makes (sparkState.* short names)."""

    def __init__(self, classes: Path, tmp: Path, *jvm: str):
        cmd = probe_command("RemoteImageProbe.java", "io.sparkstate.shim.engine.RemoteImageProbe", classes,
                            f"-Djava.io.tmpdir={tmp}", *jvm, heap="512m")
        super().__init__(cmd)
        self.tmp = tmp

    def ok(self, line: str) -> list[str]:
        reply = self.answer(line)
        assert reply.startswith("OK"), f"{line}: {reply}"
        return reply.split()[1:]

    def provider(self, name: str, checkpoint: Path, partition: int, *options: str) -> None:
        self.ok(f"provider {name} {checkpoint} {sys.executable} {partition} {' '.join(options)}")

    def cached(self) -> list[dict]:
        self.send("cached")
        out = []
        while (line := self.read()) != "END":
            _, name, local, present, pages, users, reserved = line.split(" ")
            out.append(dict(name=name, local=Path(local), present=int(present), pages=int(pages), users=int(users),
                            reserved=int(reserved)))
        return out

    def fetched(self) -> tuple[int, int]:
        b, r = self.ok("fetched")
        return int(b), int(r)


def s3_root(endpoint: str) -> str:
    bucket = f"remote-{uuid.uuid4().hex[:8]}"
    s3_server.make_bucket(bucket)
    return f"s3://{bucket}/state"


def build(probe: Probe, name: str, checkpoint: Path, partition: int, root: str, *options: str) -> int:
    """Version 1 of KEYS keys (k -> k), compacted into a snapshot with its image; version 2 changes a few keys
    after it. Returns the image's size."""
    probe.provider(name, checkpoint, partition, f"checkpointRoot={root}", *IMAGES, *options)
    assert probe.ok(f"write {name} 0 0 {KEYS} 1") == ["1"]
    probe.ok("drain")
    assert probe.ok(f"remove {name} 1 0 1 2") == ["2"]
    fs = fsspec.filesystem("s3")
    images = [p for p in fs.find(root.removeprefix("s3://")) if p.endswith(".img") and f"/{partition}/" in p]
    assert len(images) == 1, images
    return fs.size(images[0])


def test_a_restore_reads_the_index_from_the_load_and_only_the_blocks_its_lookups_need(endpoint, classes, tmp_path):
    """No background fill (imageFillStreams=0), the key filter's load only after the first lookup: what a
    restore fetches is exactly what its gets need."""
    probe = Probe(classes, tmp_path, "-Dspark_state.imageFillStreams=0", "-Dspark_state.imageCachePage=4096",
                  "-Dspark_state.imageFillDelayMs=600000")
    try:
        size = build(probe, "a", tmp_path / "ckpt", 0, s3_root(endpoint))
        before = probe.fetched()
        probe.ok("open a 2")
        # the image opened from the tail its load sent (its page directory, not its index)
        assert probe.fetched() == before
        [copy] = probe.cached()
        filter_bytes = 8 * -(-10 * KEYS // 64)
        assert copy["name"].endswith(".img") and copy["name"].startswith("s3://")
        assert copy["present"] == 0, "no page fetched"
        assert probe.ok("get a 1000 5000 0 19999 777777") == ["1000", "5000", "null", "19999", "null"]
        fetched, requests = probe.fetched()
        # the first get: its index page (the image's one: 240 blocks) with the bytes around its guessed block,
        # one request; each later get at most one for its block's pages (4 KiB pages, a block ~ 1.3 KiB); after
        # the first, the key filter with the whole index in the background (two)
        index_bytes = 40 * 240
        assert requests - before[1] <= 1 + 4 + 2, (requests, before)
        assert fetched - before[0] <= (16 << 10) + 2 * 4096 + 4 * 2 * 4096 + index_bytes + filter_bytes + 4 * 4096 \
            < size, (fetched, size)
        [copy] = probe.cached()
        assert 0 < copy["present"] < copy["pages"], copy
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("check a 0 3 0") == ["3"]
        assert probe.ok("scan a") == [str(KEYS - 3), str(sum(range(3, KEYS)))]
        [copy] = probe.cached()
        # every block was read once and kept; only the tail's pages (directory, trailer: sent with the load) are not
        assert copy["pages"] - copy["present"] <= 2, copy
        before = probe.fetched()
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.fetched() == before, "a second pass reads only the local copy"
    finally:
        probe.close()


@pytest.mark.parametrize("page, jvm", [
    (4096, ("-Dspark_state.imageCachePage=4096", "-Dspark_state.imageFillRange=16384",
            "-Dspark_state.imageFillBytes=65536")),   # many ranges per request, many requests
    (65536, ()),   # the defaults: the whole image in one range, through the fill's 128 KiB buffer in pieces
], ids=["small-ranges", "defaults"])
def test_the_background_fill_completes_the_local_copy_and_later_restores_fetch_nothing(endpoint, classes, tmp_path,
                                                                                       page, jvm):
    probe = Probe(classes, tmp_path, *jvm)
    try:
        size = build(probe, "a", tmp_path / "ckpt", 0, s3_root(endpoint))
        assert size > 2 * (128 << 10), "the image must pass through the fill's buffer in several pieces"
        before = probe.fetched()
        probe.ok("open a 2")
        assert probe.ok("get a 7 8 9") == ["7", "8", "9"]
        assert probe.ok("filled a 60000") == []
        [copy] = probe.cached()
        assert copy["present"] == copy["pages"] and copy["users"] == 1, copy
        fetched, requests = probe.fetched()
        # the whole image once (the tail came with the load; a page under a lookup may be fetched twice at most)
        assert size * 0.9 <= fetched - before[0] <= size + 8 * page, (fetched - before[0], size)
        assert requests - before[1] <= size // 65536 + 16, "the fill asks for many pages at once"
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        probe.ok("release a")
        before = probe.fetched()
        probe.ok("open a 2")   # a new provider (a task moved back): the copy is reused
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("scan a") == [str(KEYS - 3), str(sum(range(3, KEYS)))]
        assert probe.fetched() == before, "a complete copy serves a later restore without a request"
    finally:
        probe.close()


def test_the_fill_waits_for_the_first_lookup(endpoint, classes, tmp_path):
    """A restored image nothing has read yet costs no request beyond its load's: its key filter and fill start
    when the first lookup has its block (or a delay after the open, set to ten minutes here), so that lookup
    does not queue behind megabytes of the image. After it, the fill completes the copy."""
    probe = Probe(classes, tmp_path, "-Dspark_state.imageFillDelayMs=600000")
    try:
        build(probe, "a", tmp_path / "ckpt", 0, s3_root(endpoint))
        before = probe.fetched()
        probe.ok("open a 2")
        time.sleep(1.5)
        assert probe.fetched() == before, "the image was fetched before anything read it"
        assert probe.ok("get a 7") == ["7"]
        assert probe.ok("filled a 60000") == [], "the first lookup did not start the fill"
        [copy] = probe.cached()
        assert copy["present"] == copy["pages"], copy
    finally:
        probe.close()


def test_index_pages_are_read_as_lookups_need_them_and_a_damaged_one_fails_clearly(endpoint, classes, tmp_path,
                                                                                  monkeypatch):
    """Index pages of 16 entries (15 pages at 20,000 keys): the open fetches nothing (the load sent the
    page directory), gets, a check of every key and a scan answer right across page boundaries; an index page
    damaged in the checkpoint itself fails its CRC on the read that needs it, naming the page."""
    monkeypatch.setenv("SPARK_STATE_IMAGE_PAGE_ENTRIES", "16")   # the worker the probe starts writes them
    jvm = ("-Dspark_state.imageFillStreams=0", "-Dspark_state.imageCachePage=4096",
           "-Dspark_state.imageFillDelayMs=600000")   # nothing but the lookups reads the image until the first
    root = s3_root(endpoint)
    probe = Probe(classes, tmp_path, *jvm)
    try:
        build(probe, "a", tmp_path / "ckpt", 0, root)
        before = probe.fetched()
        probe.ok("open a 2")
        assert probe.fetched() == before, "the open fetched nothing"
        assert probe.ok("get a 1000 5000 0 19999 777777") == ["1000", "5000", "null", "19999", "null"]
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("check a 0 3 0") == ["3"]
        assert probe.ok("scan a") == [str(KEYS - 3), str(sum(range(3, KEYS)))]
    finally:
        probe.close()
    fs = fsspec.filesystem("s3")
    [image] = [p for p in fs.find(root.removeprefix("s3://")) if p.endswith(".img")]
    data = bytearray(fs.cat_file(image))
    pages = int.from_bytes(data[-56:-52], "little")
    assert int.from_bytes(data[-52:-48], "little") == 16 and pages > 10, pages
    index_offset = int.from_bytes(data[-40:-32], "little")
    data[index_offset + 5 * 16 * 40 + 8] ^= 0xFF   # page 5's first entry's last sort key
    fs.pipe_file(image, bytes(data))
    probe = Probe(classes, tmp_path, *jvm)   # a new executor: no local copy
    try:
        probe.provider("a", tmp_path / "ckpt", 0, f"checkpointRoot={root}", *IMAGES)
        probe.ok("open a 2")
        reply = probe.answer(f"check a 3 {KEYS} 1")
        assert reply.startswith("ERR") and "index page 5 of " in reply and "fails its CRC-32" in reply, reply
    finally:
        probe.close()


def test_a_copy_that_vanished_or_was_damaged_is_fetched_again_and_answers_right(endpoint, classes, tmp_path):
    probe = Probe(classes, tmp_path, "-Dspark_state.imageCachePage=4096")
    try:
        build(probe, "a", tmp_path / "ckpt", 0, s3_root(endpoint))
        probe.ok("open a 2")
        assert probe.ok("filled a 60000") == []
        probe.ok("release a")
        [copy] = probe.cached()
        assert copy["users"] == 0 and copy["local"].exists()
        # damaged while idle: every page but the last (the tail) overwritten with garbage, same size
        data = bytearray(copy["local"].read_bytes())
        data[: len(data) - 4096] = b"\x5a" * (len(data) - 4096)
        copy["local"].write_bytes(bytes(data))
        before = probe.fetched()
        probe.ok("open a 2")
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("check a 0 3 0") == ["3"]
        assert probe.fetched()[1] > before[1], "the damaged blocks were read again from the checkpoint"
        probe.ok("release a")
        # vanished while idle
        [copy] = probe.cached()
        copy["local"].unlink()
        before = probe.fetched()
        probe.ok("open a 2")
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("scan a") == [str(KEYS - 3), str(sum(range(3, KEYS)))]
        assert probe.fetched()[1] > before[1]
        # truncated under a reading store
        probe.ok("release a")
        probe.ok("open a 2")
        assert probe.ok("filled a 60000") == []
        [copy] = probe.cached()
        with open(copy["local"], "r+b") as f:
            f.truncate(4096)
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
    finally:
        probe.close()


def race(classes: Path, tmp_path: Path, scenario: str, page: int) -> list[str]:
    """The answer of one race of tests/jvm/CachedImageRaceProbe.java, played in a fixed order."""
    cmd = probe_command("CachedImageRaceProbe.java", "io.sparkstate.shim.engine.CachedImageRaceProbe", classes,
                        f"-Djava.io.tmpdir={tmp_path}", f"-Dspark_state.imageCachePage={page}",
                        "-Dspark_state.imageFillStreams=0")
    probe = ProbeProcess(cmd + [scenario])
    try:
        reply = probe.read()
        assert reply.startswith("OK"), reply
        return reply.split()[1:]
    finally:
        probe.close()


def test_a_fill_that_outlives_its_copy_marks_nothing_in_the_next_one(classes, tmp_path):
    """A fill under way when its image goes idle, the file vanishes and a store opens the image again: the pages
    it wrote to the vanished file are not present in the new one, and the cache charges only pages present."""
    present, used = map(int, race(classes, tmp_path, "lost", 262144))
    assert present == 4 and used == 4 * 262144


def test_a_lookup_waiting_on_a_fill_of_an_evicted_image_fetches_its_page_itself(classes, tmp_path):
    """The fill of an image evicted under it marks nothing: the lookup waiting for its page is woken and fetches
    it (it read the right bytes); the evicted image is charged nothing."""
    reply = race(classes, tmp_path, "dropped", 131072)
    assert reply[:3] == ["reserved", "0", "131072"] and reply[-1] == "true", reply


def test_an_idle_copy_is_evicted_only_when_that_makes_room(classes, tmp_path):
    """Bound 4 pages, an idle copy holds 1 and an open one 3: 2 more pages do not fit even without the idle copy,
    so it stays (evicting it would only cost its next restore a fetch); 1 more page fits by evicting it."""
    too_much, dropped, kept, fits, dropped_then, used = race(classes, tmp_path, "idle", 65536)
    assert (too_much, dropped, kept) == ("false", "false", "1"), "the idle copy was evicted for nothing"
    assert (fits, dropped_then, used) == ("true", "true", "4")


def test_the_cache_is_bounded_and_evicts_the_least_recently_used_idle_copy(endpoint, classes, tmp_path):
    root = s3_root(endpoint)
    probe = Probe(classes, tmp_path, "-Dspark_state.imageCachePage=4096")
    try:
        sizes = [build(probe, name, tmp_path / "ckpt", p, root) for p, name in enumerate("abc")]
        bound = int(max(sizes) * 1.5)
        for name in "abc":
            probe.provider(name, tmp_path / "ckpt", "abc".index(name), f"checkpointRoot={root}", *IMAGES,
                           f"rowImages.cacheSize={bound}")
        for name in "abc":
            probe.ok(f"open {name} 2")
            assert probe.ok(f"check {name} 3 {KEYS} 1") == [str(KEYS - 3)]
            probe.ok(f"release {name}")
            copies = probe.cached()
            assert sum(c["reserved"] for c in copies) <= bound, copies
            assert sum(c["local"].stat().st_blocks * 512 for c in copies if c["local"].exists()) <= bound + 65536
        kept = [c["name"] for c in probe.cached() if c["reserved"] > 0]
        assert len(kept) == 1, "the two older copies were evicted"
        probe.ok("open a 2")   # evicted: fetched again, right
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
    finally:
        probe.close()


def test_a_cache_too_small_for_the_images_being_read_says_so_once_and_answers_right(endpoint, classes, tmp_path):
    """Images that stores read fill the cache: their missing blocks are fetched each time a lookup reads them
    (a request per block read, no fill), which the executor says once per image, naming the option."""
    probe = Probe(classes, tmp_path, "-Dspark_state.imageCachePage=4096")
    try:
        root = s3_root(endpoint)
        build(probe, "a", tmp_path / "ckpt", 0, root)
        probe.provider("a", tmp_path / "ckpt", 0, f"checkpointRoot={root}", *IMAGES, "rowImages.cacheSize=16k")
        probe.ok("open a 2")
        before = probe.fetched()
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        [copy] = probe.cached()
        assert copy["reserved"] <= 16 << 10, copy
        # no fill: each block a lookup first reads is a request of its own (the heap's block cache keeps it)
        assert probe.fetched()[1] - before[1] > 40, (probe.fetched(), before)
        probe.log.seek(0)
        warnings = [line for line in probe.log.read().splitlines() if "cache of remote row images is full" in line]
        assert len(warnings) == 1 and " WARN " in warnings[0] and "rowImages.cacheSize" in warnings[0], warnings
    finally:
        probe.close()


def test_an_executor_that_cannot_keep_a_local_copy_restores_from_the_downloaded_image(endpoint, classes, tmp_path):
    """The local copy of a remote image cannot be made (its folder is not a folder: a broken local dir): the
    restore downloads the image into the worker's directory and opens it, rather than loading every row."""
    probe = Probe(classes, tmp_path)
    try:
        build(probe, "a", tmp_path / "ckpt", 0, s3_root(endpoint))
        probe.ok("open a 2")
        assert probe.ok("get a 5") == ["5"]
        probe.ok("filled a 60000")   # the background fill done: nothing of this store fetches after it
        [copy] = probe.cached()
        probe.ok("release a")
        folder = copy["local"].parent
        shutil.rmtree(folder)
        folder.write_text("not a folder")
        before = probe.fetched()
        probe.ok("open a 2")
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("check a 0 3 0") == ["3"]
        assert probe.fetched() == before, "no range read: the image was downloaded"
        probe.log.seek(0)
        log = probe.log.read()
        after = log[log.rindex("by range (java.nio.file.FileAlreadyExistsException"):]
        assert "loaded version 2 of" in after and "lazily" in after.split("loaded version 2 of", 1)[1].split("\n")[0], \
            after[-2000:]
    finally:
        probe.close()


@pytest.mark.parametrize("loss", ["deleted", "truncated"])
def test_an_image_the_checkpoint_lost_fails_the_read_clearly_and_the_retry_loads_rows(endpoint, classes, tmp_path,
                                                                                      loss):
    """The image's tail comes from the manifest, so its open needs no byte of the file: a file deleted or
    truncated after that (S3 answers a range past its end with 416) fails the first read that needs it, as
    damage (a retry would meet it again), and the store's next load reads the snapshot's rows instead, exactly."""
    probe = Probe(classes, tmp_path, "-Dspark_state.imageFillStreams=0", "-Dspark_state.imageCachePage=4096")
    try:
        root = s3_root(endpoint)
        build(probe, "a", tmp_path / "ckpt", 0, root)
        fs = fsspec.filesystem("s3")
        [image] = [p for p in fs.find(root.removeprefix("s3://")) if p.endswith(".img")]
        if loss == "deleted":
            fs.rm(image)
        else:
            fs.pipe_file(image, fs.cat_file(image, start=0, end=1024))
        probe.ok("open a 2")
        reply = probe.answer("get a 12345")
        assert reply.startswith("ERR") and "is not the file its manifest names" in reply \
            and ("is missing" if loss == "deleted" else "shorter than the manifest") in reply \
            and "will reload its state from the checkpoint" in reply, reply
        probe.ok("open a 2")   # the task's retry
        assert probe.ok("deferred a") == ["no"]
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("check a 0 3 0") == ["3"]
    finally:
        probe.close()


def test_a_restore_opens_before_its_changes_arrive_and_no_read_sees_the_image_without_them(endpoint, classes,
                                                                                          tmp_path):
    """A deferred load (the image's tail in the manifest): the store opens when the manifest is read; the changes
    after the image (version 2 deleted keys 0, 1, 2) come with its first use, whatever that is, and a worker
    killed in between costs nothing: the new one reads them again."""
    probe = Probe(classes, tmp_path)
    try:
        root = s3_root(endpoint)
        build(probe, "a", tmp_path / "ckpt", 0, root)
        for first, expected in [("get a 1 7", ["null", "7"]), ("check a 0 3 0", ["3"]),
                                ("scan a", [str(KEYS - 3), str(sum(range(3, KEYS)))])]:
            probe.ok("open a 2")
            assert probe.ok("deferred a") == ["pending"]
            assert probe.ok(first) == expected
            assert probe.ok("deferred a") == ["settled"]
        probe.ok("open a 2")
        assert probe.ok("killworker") == ["1"]
        assert probe.ok("get a 2 19999") == ["null", "19999"]
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        # with deferral off (the A/B switch), the changes come with the load
        # changes that cannot be read fail the first use, not the store: the next use reads them again
        fs = fsspec.filesystem("s3")
        [delta] = [p for p in fs.find(root.removeprefix("s3://")) if "-delta-" in p and p.endswith(".arrow")
                   and "/v0000000002-" in p]
        saved = fs.cat_file(delta)
        fs.rm(delta)
        probe.ok("open a 2")
        reply = probe.answer("get a 1 7")
        assert reply.startswith("ERR") and "is missing" in reply, reply
        fs.pipe_file(delta, saved)
        assert probe.ok("deferred a") == ["pending"]
        assert probe.ok("get a 1 7") == ["null", "7"]
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        (tmp_path / "off").mkdir()
        off = Probe(classes, tmp_path / "off", "-Dspark_state.deferChanges=false")
        try:
            off.provider("a", tmp_path / "ckpt", 0, f"checkpointRoot={root}", *IMAGES)
            off.ok("open a 2")
            assert off.ok("deferred a") == ["no"] and off.ok("get a 1 7") == ["null", "7"]
        finally:
            off.close()
    finally:
        probe.close()


def test_a_deferred_restore_reports_the_changes_it_read_in_its_batch_metrics(endpoint, classes, tmp_path):
    """The changes after the image arrive after the store opened (a deferred load); the batch's metrics still
    count them: sparkStateRowsLoaded the rows decoded, each key once (version 2 deleted keys 0, 1, 2, version 3
    put key 0 back: three keys from four changes) and sparkStateBytesRead the bytes of the two delta files they
    came from (the image's tail came in the manifest). The same figures as a load that waits for the changes."""
    probe = Probe(classes, tmp_path)
    try:
        root = s3_root(endpoint)
        build(probe, "a", tmp_path / "ckpt", 0, root)
        assert probe.ok("write a 2 0 1 1") == ["3"]
        fs = fsspec.filesystem("s3")
        fs.invalidate_cache()   # build() listed the store before version 3: s3fs's info() would use that listing
        deltas = [p for p in fs.find(root.removeprefix("s3://")) if "-delta-" in p and p.endswith(".arrow")
                  and ("/v0000000002-" in p or "/v0000000003-" in p)]
        assert len(deltas) == 2, deltas
        deferred, rows, read, images = probe.ok("metrics a 3 5")
        assert (deferred, int(rows), int(read), int(images)) == ("pending", 3, sum(map(fs.size, deltas)), 1)
        (tmp_path / "off").mkdir()
        off = Probe(classes, tmp_path / "off", "-Dspark_state.deferChanges=false")
        try:
            off.provider("a", tmp_path / "ckpt", 0, f"checkpointRoot={root}", *IMAGES)
            assert off.ok("metrics a 3 5") == ["no", rows, read, images], "deferral changes what the metrics say"
        finally:
            off.close()
    finally:
        probe.close()


def test_a_local_checkpoint_is_read_in_place_without_the_cache(classes, tmp_path):
    probe = Probe(classes, tmp_path)
    try:
        probe.provider("a", tmp_path / "ckpt", 0, *IMAGES)
        assert probe.ok(f"write a 0 0 {KEYS} 1") == ["1"]
        probe.ok("drain")
        assert probe.ok("remove a 1 0 1 2") == ["2"]
        probe.ok("open a 2")
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.cached() == [] and probe.fetched() == (0, 0)
    finally:
        probe.close()


@pytest.mark.parametrize("jvm", [(), ("-Dspark_state.imageCachePage=4096",)], ids=["defaults", "small-pages"])
def test_the_executor_plugins_warm_up_runs_a_restore_and_leaves_nothing_behind(endpoint, classes, tmp_path, jvm):
    """The executor plugin runs one restore of a small image of its own when the executor starts (Engine.warmUp),
    so the first task that restores a store does not load the engine's classes. It must leave no copy, file,
    cached block or reservation behind, count no fetch from storage, log no complaint, and a real restore after it
    is exact. With small pages its image spans many pages of the local copy."""
    probe = Probe(classes, tmp_path, *jvm)
    try:
        ms, copies, files, cache_bytes, budget_used = map(int, probe.ok("warmup"))
        assert (copies, files, cache_bytes, budget_used) == (0, 0, 0, 0), (copies, files, cache_bytes, budget_used)
        assert probe.fetched() == (0, 0), "the warm-up's own image counted as bytes read from storage"
        time.sleep(0.5)   # its fill, had it failed, logs that it stopped
        probe.log.seek(0)
        complaints = [line for line in probe.log.read().splitlines() if "warm-up" in line and " WARN " in line]
        assert complaints == [], complaints
        build(probe, "a", tmp_path / "ckpt", 0, s3_root(endpoint))
        probe.ok("open a 2")
        assert probe.ok("get a 7 0") == ["7", "null"]
        assert probe.ok(f"check a 3 {KEYS} 1") == [str(KEYS - 3)]
        assert probe.ok("scan a") == [str(KEYS - 3), str(sum(range(3, KEYS)))]
    finally:
        probe.close()
