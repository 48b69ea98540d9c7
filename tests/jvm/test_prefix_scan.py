"""The engine's prefix-scan store (session windows' state: keys of two columns, the first the prefix, hashed by
the prefix, so all rows of a prefix share one sort key on local disk) against a dict model, through a real JVM
(tests/jvm/PrefixProbe.java), under a budget of 4 KiB with spill checks every 8 writes: puts spill to runs, the
runs merge in the background, and prefix scans read the heap's rows of the prefix (its PrefixIndex) and that sort
key in every run. Rows of the scanned prefix and of others are put and removed while a scan's rows are walked
(Spark's session merging does); the store is restored lazily over a row image of its rows, with the changes after
the image applied blind, and goes on spilling over it. Every write's answer (absent, held, or changed earlier in
the batch) and the key count are checked against the model too."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.jvm.test_row_arena import Probe, h, unh
from tests.support.jvm_probes import probe_command

PREFIXES = [b"a", b"b", b"cc", b"", bytes(range(1, 30))]
SECONDS = range(4)
#: Budget 4 KiB, spill checks every 8 writes, no minimum spill, 4 key groups (prefixes share neighbourhoods),
#: pages of 256 bytes and compaction from 512 bytes of garbage.
OPTIONS = ("-ea", "-Dprobe.budget=4096", "-Dprobe.maxParallelism=4", "-Dspark_state.spillCheckEvery=8",
           "-Dspark_state.minSpillBytes=0", "-Dspark_state.arenaPageBytes=256", "-Dspark_state.arenaMinGarbage=512")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefix-tmp")
    cmd = probe_command("PrefixProbe.java", "io.sparkstate.shim.engine.PrefixProbe",
                        tmp_path_factory.mktemp("prefix-probe"), *OPTIONS, f"-Djava.io.tmpdir={tmp}", heap="256m")
    probe = Probe(cmd)
    yield probe
    probe.close()


def k(key: tuple) -> str:
    return f"{h(key[0])} {key[1]}"


prefixes = st.sampled_from(PREFIXES)
keys = st.tuples(prefixes, st.sampled_from(SECONDS))
values = st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=700))
#: What runs after a scanned row: nothing, remove or update that row, remove or put a row of the same prefix,
#: remove or put a row of any prefix.
actions = st.one_of(
    st.just((".",)), st.just(("r",)), st.tuples(st.just("u"), values),
    st.tuples(st.just("d"), st.sampled_from(SECONDS)), st.tuples(st.just("p"), st.sampled_from(SECONDS), values),
    st.tuples(st.just("D"), keys), st.tuples(st.just("P"), keys, values))
ops = st.one_of(
    st.tuples(st.just("put"), keys, values),
    st.tuples(st.just("get"), keys),
    st.tuples(st.just("remove"), keys),
    st.tuples(st.just("scan"), prefixes, st.lists(actions, max_size=8)),
    st.tuples(st.just("iter")),
    st.tuples(st.just("spill")),
    st.tuples(st.just("batch")),
    st.tuples(st.just("size")),
    st.tuples(st.just("restore"), st.integers(0, 2**31), st.booleans()),
)


def token(a: tuple) -> str:
    if a[0] in (".", "r"):
        return a[0]
    if a[0] == "u":
        return f"u:{h(a[1])}"
    if a[0] == "d":
        return f"d:{a[1]}"
    if a[0] == "p":
        return f"p:{a[1]}:{h(a[2])}"
    if a[0] == "D":
        return f"D:{h(a[1][0])}:{a[1][1]}"
    return f"P:{h(a[1][0])}:{a[1][1]}:{h(a[2])}"


def rows(probe: Probe) -> list[tuple]:
    out = []
    while (line := probe.read()) != "END":
        _, p, s, v = line.split(" ")
        out.append(((unh(p), int(s)), v))
    return out


def write(model: dict, changed: set, key: tuple, value: bytes | None) -> None:
    if value is None:
        if key in model:
            changed.add(key)
        model.pop(key, None)
    else:
        model[key] = value
        changed.add(key)


def scan(probe: Probe, model: dict, changed: set, prefix: bytes, acts: list) -> None:
    """A prefix scan gathers the prefix's rows when called: exactly the model's rows of the prefix then, each
    once with its value then, whatever the actions after each row do to the store."""
    probe.send(f"scan {h(prefix)} " + " ".join(token(a) for a in acts))
    got = rows(probe)
    expected = sorted((key, h(v)) for key, v in model.items() if key[0] == prefix)
    assert sorted(got) == expected, (prefix, got, expected)
    for i, (key, _) in enumerate(got):
        a = acts[i] if i < len(acts) else (".",)
        if a[0] == "r":
            write(model, changed, key, None)
        elif a[0] == "u":
            write(model, changed, key, a[1])
        elif a[0] == "d":
            write(model, changed, (prefix, a[1]), None)
        elif a[0] == "p":
            write(model, changed, (prefix, a[1]), a[2])
        elif a[0] == "D":
            write(model, changed, a[1], None)
        elif a[0] == "P":
            write(model, changed, a[1], a[2])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ops, max_size=100))
def test_a_prefix_scan_store_behaves_as_a_dict(probe, script):
    probe.reset()
    model: dict[tuple, bytes] = {}
    changed: set[tuple] = set()   # keys written since the batch began
    for op in script:
        if op[0] == "put":
            expected = "CHANGED" if op[1] in changed else "HELD" if op[1] in model else "ABSENT"
            answer = probe.ask(f"put {k(op[1])} {h(op[2])}")
            # UNCHANGED: not changed in this batch, whether held is settled when the size is asked (below)
            assert answer == expected or (answer == "UNCHANGED" and expected != "CHANGED"), (op, answer, expected)
            write(model, changed, op[1], op[2])
        elif op[0] == "get":
            old = model.get(op[1])
            assert probe.ask(f"get {k(op[1])}") == ("NULL" if old is None else h(old)), op
        elif op[0] == "remove":
            expected = "ABSENT" if op[1] not in model else "CHANGED" if op[1] in changed else "HELD"
            assert probe.ask(f"remove {k(op[1])}") == expected, op
            write(model, changed, op[1], None)
        elif op[0] == "scan":
            scan(probe, model, changed, op[1], op[2])
        elif op[0] == "iter":
            probe.send("iter")
            assert sorted(rows(probe)) == sorted((key, h(v)) for key, v in model.items())
        elif op[0] == "spill":
            assert probe.ask("spill") == f"OK {len(model)}"
        elif op[0] == "batch":
            assert probe.ask("batch") == "OK"
            changed.clear()
        elif op[0] == "size":   # asked now and then: until then puts may leave keys to settle
            assert probe.ask("size") == str(len(model))
        else:
            assert probe.ask(f"restore {op[1]} {int(op[2])}") == f"OK {len(model)}"
            changed.clear()
    assert probe.ask("size") == str(len(model))
    for prefix in PREFIXES:
        scan(probe, model, changed, prefix, [])
    assert probe.ask("held") == "OK"


def test_many_sessions_per_key_spill_merge_and_scan(probe):
    """Hundreds of prefixes of a few rows each over many batches: the store spills hundreds of times and merges
    in the background; each batch scans some prefixes, removes their rows and puts them back merged (session
    windows merging sessions), and every scan and the final state match the model."""
    probe.reset()
    model: dict[tuple, bytes] = {}
    changed: set = set()
    for batch in range(12):
        for i in range(400):
            p = f"key-{(i * 7 + batch * 13) % 300}".encode()
            key = (p, (i + batch) % 5)
            v = f"b{batch}-{i}".encode() * (1 + i % 7)
            probe.ask(f"put {k(key)} {h(v)}")
            write(model, changed, key, v)
        for j in range(0, 300, 11):
            p = f"key-{(j + batch) % 300}".encode()
            # the prefix's rows removed while walked, one put back with a new value (sessions merged)
            acts = [("r",), ("p", 0, f"merged-{batch}".encode()), ("r",), ("r",), ("r",)]
            scan(probe, model, changed, p, acts)
        assert probe.ask("batch") == "OK"
        changed.clear()
        assert probe.ask("size") == str(len(model))
    state, runs, spills, merges, _, size = probe.ask("settle").split()
    assert state == "OK" and int(size) == len(model)
    assert int(spills) > 50 and int(merges) > 0, (spills, merges)
    for p in {key[0] for key in model} | {b"key-0", b"absent"}:
        scan(probe, model, changed, p, [])
    probe.send("iter")
    assert sorted(rows(probe)) == sorted((key, h(v)) for key, v in model.items())
    assert probe.ask("held") == "OK"
