"""The engine's layered map against a dict model, through a real JVM (tests/jvm/ArenaProbe.java): its rows
in the heap alone ("arena"), and under a budget so small that puts spill to runs on local disk, which merge
in the background ("layered"). Every write's answer (the key was absent, held, or changed earlier in the
batch: what a change log records) is checked against the model too.

Pages of 256 bytes and compaction from 512 bytes of garbage, so small examples cross pages, hold
records larger than a page, compact and grow the table, also while an iterator runs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.jvm_probes import ProbeProcess, probe_command

KEYS = [bytes([i]) * n for i in range(1, 9) for n in (1, 3, 9, 30)] + [b""]


#: The maps under test: the arena alone, and the layered map (tests/jvm/ArenaProbe.java) with a budget of
#: 4 KiB, spill checks every 8 puts and no minimum overlay, so small examples spill to row images often,
#: and 4 key groups, so keys share sort-key neighbourhoods and blocks.
MAPS = {
    "arena": (),
    "layered": ("-Dprobe.map=layered", "-Dprobe.budget=4096", "-Dprobe.maxParallelism=4",
                "-Dspark_state.spillCheckEvery=8", "-Dspark_state.minSpillBytes=0"),
}


@pytest.fixture(scope="module", params=sorted(MAPS))
def probe(request, tmp_path_factory):
    cmd = probe_command("ArenaProbe.java", "io.sparkstate.shim.engine.ArenaProbe", tmp_path_factory.mktemp("arena-probe"),
                        "-ea", "-Dspark_state.arenaPageBytes=256", "-Dspark_state.arenaMinGarbage=512",
                        f"-Djava.io.tmpdir={tmp_path_factory.mktemp('spill')}", *MAPS[request.param], heap="256m")
    probe = Probe(cmd)
    probe.kind = request.param
    yield probe
    probe.close()


class Probe(ProbeProcess):
    def reset(self) -> None:
        """A new map; skips any answer a failed example left unread."""
        self.nonce = getattr(self, "nonce", 0) + 1
        self.send(f"reset {self.nonce}")
        while self.read() != f"OK {self.nonce}":
            pass


def h(b: bytes) -> str:
    return b.hex() or "-"


def unh(s: str) -> bytes:
    return b"" if s == "-" else bytes.fromhex(s)


keys = st.sampled_from(KEYS)
values = st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=700))
actions = st.one_of(
    st.just((".",)), st.just(("r",)), st.tuples(st.just("u"), values),
    st.tuples(st.just("d"), keys), st.tuples(st.just("p"), keys, values))
ops = st.one_of(
    st.tuples(st.just("put"), keys, values),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("remove"), keys),
    st.tuples(st.just("iter"), st.lists(actions, max_size=12)),
    st.tuples(st.just("spill")),
    st.tuples(st.just("batch")),
    st.tuples(st.just("size")),
)


def token(a: tuple) -> str:
    if a[0] in (".", "r"):
        return a[0]
    if a[0] == "u":
        return f"u:{h(a[1])}"
    if a[0] == "d":
        return f"d:{h(a[1])}"
    return f"p:{h(a[1])}:{h(a[2])}"


def iterate(probe: Probe, model: dict, acts: list, changed: set | None = None) -> None:
    """Each visited row is live with its current value at that moment; a key nobody touched while the
    iterator ran is visited exactly once."""
    probe.send("iter " + " ".join(token(a) for a in acts))
    start = set(model)
    touched, visits, i = set(), [], 0
    lines = []
    while (line := probe.read()) != "END":
        lines.append(line)
    changed = set() if changed is None else changed
    for line in lines:
        _, k, v = line.split(" ")
        k = unh(k)
        assert k in model and h(model[k]) == v, (k, v, model.get(k))
        visits.append(k)
        a = acts[i] if i < len(acts) else (".",)
        i += 1
        if a[0] == "r":
            del model[k]
            touched.add(k)
            changed.add(k)
        elif a[0] == "u":
            model[k] = a[1]
            touched.add(k)
            changed.add(k)
        elif a[0] == "d":
            if a[1] in model:
                changed.add(a[1])
            model.pop(a[1], None)
            touched.add(a[1])
        elif a[0] == "p":
            model[a[1]] = a[2]
            touched.add(a[1])
            changed.add(a[1])
    for k in start - touched:
        assert visits.count(k) == 1, (k, visits)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, max_size=120))
def test_the_arena_map_behaves_as_a_dict(probe, script):
    probe.reset()
    model: dict[bytes, bytes] = {}
    changed: set[bytes] = set()   # keys written since the batch began
    for op in script:
        if op[0] == "put":
            expected = "CHANGED" if op[1] in changed else "HELD" if op[1] in model else "ABSENT"
            answer = probe.ask(f"put {h(op[1])} {h(op[2])}")
            # UNCHANGED: not changed in this batch, whether held is settled when the size is asked (below)
            assert answer == expected or (answer == "UNCHANGED" and expected != "CHANGED"), (answer, expected)
            model[op[1]] = op[2]
            changed.add(op[1])
        elif op[0] == "get":
            old = model.get(op[1])
            assert probe.ask(f"get {h(op[1])}") == ("NULL" if old is None else h(old))
        elif op[0] == "remove":
            expected = "ABSENT" if op[1] not in model else "CHANGED" if op[1] in changed else "HELD"
            assert probe.ask(f"remove {h(op[1])}") == expected
            if op[1] in model:
                changed.add(op[1])
            model.pop(op[1], None)
        elif op[0] == "spill":
            if probe.kind == "layered":
                assert probe.ask("spill") == f"OK {len(model)}"
        elif op[0] == "batch":
            assert probe.ask("batch") == "OK"
            changed.clear()
        elif op[0] == "size":   # asked now and then: until then puts may leave keys to settle
            assert probe.ask("size") == str(len(model))
        else:
            iterate(probe, model, op[1], changed)
    assert probe.ask("size") == str(len(model))
    iterate(probe, model, [])
    assert probe.ask("held") == "OK"


def test_many_keys_grow_compact_and_shrink(probe):
    """Thousands of keys: the table grows, repeated updates compact, removing most keys while
    iterating leaves exactly the others."""
    probe.reset()
    model = {}
    for round_ in range(3):
        for i in range(3000):
            k, v = f"key-{i}".encode(), f"v{round_}-{i}".encode() * (1 + i % 5)
            probe.ask(f"put {h(k)} {h(v)}")
            model[k] = v
    assert probe.ask("size") == "3000"
    iterate(probe, model, [("r",)] * 2000)
    assert probe.ask("size") == str(len(model)) == "1000"
    iterate(probe, model, [])
    assert probe.ask("held") == "OK"
    if probe.kind == "layered":
        assert int(probe.ask("spills")) > 0, "the budget never made the map spill"


def test_readers_on_other_threads_see_whole_rows_while_a_writer_changes_the_map(probe):
    """Read stores of other tasks read the map a write store changes (Spark runs them on other threads):
    every row a reader gets is whole and belongs to its key, rows it keeps never change, and the writer
    loses nothing (200k puts and removes over 3000 keys, pages of 256 bytes: many compactions)."""
    answer = probe.ask("race 3000 200000")
    assert answer.startswith("OK"), answer
    assert int(answer.split()[1]) > 0, "the readers read nothing while the writer ran"


def test_the_layered_map_holds_no_more_than_its_budget_however_many_rows(probe):
    """3,000 rows of 100-byte values (about 400 KB) under a 4 KiB budget (3 KiB for rows): the in-heap layer
    never holds more than the rows share plus what one check interval (8 puts) and a page add, because
    every check over the budget spills; the rows are all still there."""
    if probe.kind != "layered":
        pytest.skip("the arena has no budget")
    probe.reset()
    most, spills, size = map(int, probe.ask("fill 3000 100").split())
    assert size == 3000
    assert spills > 50
    assert most <= 3072 + 8 * 200 + 4096, f"the in-heap rows reached {most} bytes"


def test_spills_write_runs_that_merge_in_the_background_into_a_few(probe):
    """3,000 rows under a 4 KiB budget spill hundreds of times; the runs merge in the background (each merge
    at least doubles a run), so once merges settle the store keeps a few runs, not hundreds, and every row is
    still there exactly once."""
    if probe.kind != "layered":
        pytest.skip("the arena has no budget")
    probe.reset()
    probe.ask("fill 3000 100")
    assert probe.ask("batch") == "OK"
    state, runs, spills, merges, disk_rows, size = probe.ask("settle").split()
    assert state == "OK" and size == "3000"
    assert int(spills) > 50 and int(merges) > 0, (spills, merges)
    assert int(runs) <= 12, f"{runs} runs after {spills} spills and {merges} merges"
    model = {f"fill-{j}".encode(): bytes(100) for j in range(3000)}
    iterate(probe, model, [])
