"""Running small Soufflé-subset programs with the embedded clingo."""
from __future__ import annotations

import math
import shutil
import threading
import time
from pathlib import Path

import clingo
import pytest

import dlverify.engine as engine
from dlverify import schema
from dlverify.engine import EngineResult, resolve_engine, run_program
from dlverify.engine.clingo_runner import collect_rows, run_clingo
from dlverify.engine.dialect import Translation, parse_program
from dlverify.errors import EngineError, InputError
from dlverify.limits import OutOfTime, time_limit
from dlverify.schema import Column, Relation

REPO = Path(__file__).resolve().parent.parent


def rel(name: str, *cols: str, role: str = "input") -> Relation:
    return Relation(name, tuple(Column(*c.split(":")) for c in cols), "", role)


def run(tmp_path: Path, text: str, facts: dict | None = None, outputs=(), **kw) -> dict[str, list[tuple]]:
    main = tmp_path / "main.dl"
    main.write_text(text)
    res = run_program(main, facts or {}, list(outputs), engine="clingo", **kw)
    assert isinstance(res, EngineResult) and res.engine == "clingo" and res.seconds >= 0
    return res.relations


EDGE = rel("Edge", "a:number", "b:number")
PATH = rel("Path", "a:number", "b:number", role="output")


def test_transitive_closure(tmp_path):
    out = run(tmp_path, """
.decl Edge(a: number, b: number)
.input Edge
.decl Path(a: number, b: number)
.output Path
Path(a, b) :- Edge(a, b).
Path(a, c) :- Path(a, b), Edge(b, c).
.plan 0:(2,1)
""", {EDGE: [(1, 2), (2, 3), (3, 1), (4, 5)]}, [PATH])
    cycle = [(a, b) for a in (1, 2, 3) for b in (1, 2, 3)]
    assert out == {"Path": sorted(cycle + [(4, 5)])}


def test_stratified_negation(tmp_path):
    node = rel("Node", "n:number")
    unreach = rel("Unreached", "n:number", role="output")
    out = run(tmp_path, """
.decl Node(n: number)
.input Node
.decl Edge(a: number, b: number)
.input Edge
.decl Reach(n: number)
.decl Unreached(n: number)
.output Unreached
Reach(0).
Reach(b) :- Reach(a), Edge(a, b).
Unreached(n) :- Node(n), !Reach(n).
""", {node: [(i,) for i in range(6)], EDGE: [(0, 1), (1, 2), (3, 4)]}, [unreach])
    assert out == {"Unreached": [(3,), (4,), (5,)]}


RECORDS = """
.type OffList = [head: number, tail: OffList]
.type Scale = [e2: number, e3: number, e5: number, e7: number]
.decl N(n: number)
.input N
.decl Lst(n: number, l: OffList)
.output Lst
.decl Split(h: number, t: OffList)
.output Split
.decl Bump(l: OffList, c: Scale)
.output Bump
.decl Name(n: number, s: symbol)
.output Name
Lst(0, nil).
Lst(n + 1, [n, l]) :- Lst(n, l), N(m), n < m.
Split(h, t) :- Lst(_, l), l = [h, t].
Bump([a + 1, b], [1, 0, -a, 0]) :- Lst(2, l), l = [a, b].
Name(n, "x") :- N(n).
"""


def test_records_build_destructure_and_arithmetic(tmp_path):
    outs = [rel("Lst", "n:number", "l:OffList", role="output"),
            rel("Split", "h:number", "t:OffList", role="output"),
            rel("Bump", "l:OffList", "c:Scale", role="output"),
            rel("Name", "n:number", "s:symbol", role="output")]
    out = run(tmp_path, RECORDS, {rel("N", "n:number"): [(3,)]}, outs)
    assert out["Lst"] == [(0, None), (1, (0, None)), (2, (1, (0, None))), (3, (2, (1, (0, None))))]
    assert out["Split"] == [(0, None), (1, (0, None)), (2, (1, (0, None)))]
    assert out["Bump"] == [((2, (0, None)), (1, 0, -1, 0))]
    assert out["Name"] == [(3, "x")]


def test_aggregates(tmp_path):
    r = rel("R", "k:number", "v:number")
    ks = rel("K", "k:number")
    outs = [rel(n, "k:number", "x:number", role="output") for n in ("Cnt", "Sum", "Min", "Max", "CntW", "SumD")]
    out = run(tmp_path, """
.decl R(k: number, v: number)
.input R
.decl K(k: number)
.input K
.decl Cnt(k: number, x: number)
.decl Sum(k: number, x: number)
.decl Min(k: number, x: number)
.decl Max(k: number, x: number)
.decl CntW(k: number, x: number)
.decl SumD(k: number, x: number)
.output Cnt
.output Sum
.output Min
.output Max
.output CntW
.output SumD
Cnt(k, x) :- K(k), x = count : { R(k, v), v > 0 }.
Sum(k, x) :- K(k), x = sum v * 10 : { R(k, v) }.
Min(k, x) :- K(k), x = min v : { R(k, v) }.
Max(k, x) :- K(k), x = max v : R(k, v).
CntW(k, x) :- K(k), x = count : { R(k, _) }.
SumD(k, x) :- K(k), x = sum v : { R(k, v), K(j) }.
""", {r: [(1, 5), (1, -2), (1, 7), (2, 4), (2, 9)], ks: [(1,), (2,), (3,)]}, outs)
    assert out["Cnt"] == [(1, 2), (2, 2), (3, 0)]
    assert out["Sum"] == [(1, 100), (2, 130), (3, 0)]
    assert out["Min"] == [(1, -2), (2, 4)]  # empty min for k=3: no row
    assert out["Max"] == [(1, 7), (2, 9)]  # empty max for k=3: no row
    assert out["CntW"] == [(1, 3), (2, 2), (3, 0)]  # `_` counts tuples, not distinct k
    assert out["SumD"] == [(1, 30), (2, 39), (3, 0)]  # over distinct bindings of (v, j)


def test_count_with_wildcard_counts_each_tuple(tmp_path):
    out = run(tmp_path, """
.decl R(a: number, b: number)
.decl C(n: number)
.output C
R(1, 1). R(1, 2). R(2, 2).
C(n) :- n = count : { R(_, _) }.
""", outputs=[rel("C", "n:number", role="output")])
    assert out == {"C": [(3,)]}


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def test_division_and_modulo_truncate_like_c(tmp_path):
    pairs = [(a, b) for a in range(-7, 8) for b in (-3, -2, -1, 1, 2, 3)]
    r = rel("P", "a:number", "b:number")
    out = run(tmp_path, """
.decl P(a: number, b: number)
.input P
.decl Q(a: number, b: number, q: number, m: number)
.output Q
Q(a, b, a / b, a % b) :- P(a, b).
""", {r: pairs}, [rel("Q", "a:number", "b:number", "q:number", "m:number", role="output")])
    expected = sorted((a, b, _c_div(a, b), a - b * _c_div(a, b)) for a, b in pairs)
    assert out["Q"] == expected
    assert (-7, 2, -3, -1) in out["Q"] and (7, -2, -3, 1) in out["Q"]
    assert all(q == math.trunc(a / b) for a, b, q, _ in out["Q"])


def test_symbols_round_trip(tmp_path):
    s = rel("S", "k:number", "s:symbol")
    weird = ['plain', 'with "quotes"', "back\\slash", "", "üñí €", "nil", "%d"]
    out = run(tmp_path, """
.decl S(k: number, s: symbol)
.input S
.decl T(s: symbol, k: number)
.output T
T(s, k) :- S(k, s), s != "plain".
T("lit", 0) :- S(0, "plain").
""", {s: [(i, w) for i, w in enumerate(weird)]}, [rel("T", "s:symbol", "k:number", role="output")])
    assert sorted(out["T"]) == sorted([(w, i) for i, w in enumerate(weird) if w != "plain"] + [("lit", 0)])


def test_include_and_schema_relations(tmp_path):
    shutil.copy(REPO / "datalog" / "schema.dl", tmp_path / "schema.dl")
    (tmp_path / "main.dl").write_text("""
#include "schema.dl"
#include "schema.dl"
View(s, d, r, [o, nil], nil, [0, 0, 0, 0]) :- Seed(id, s, d, r, _, _, _, _, _, _, _, _, _), Seed_Off(id, 0, o).
Output_Ok(s, d, r) :- Output_Pair(s, d, _), View(s, d, r, _, nil, [0, 0, 0, 0]).
""")
    facts = {schema.SEED: [(1, 1, 11, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0), (2, 1, 11, 1, -1, 0, 0, 0, 0, 0, 0, 0, 0)],
             schema.SEED_OFF: [(1, 0, 0), (2, 0, 4)], schema.OUTPUT_PAIR: [(1, 11, 0)]}
    res = run_program(tmp_path / "main.dl", facts, [schema.VIEW, schema.OUTPUT_OK, schema.SEQ_FRONTIER],
                      engine="clingo")
    assert res.relations == {"View": [(1, 11, 0, (0, None), None, (0, 0, 0, 0)),
                                      (1, 11, 1, (4, None), None, (0, 0, 0, 0))],
                             "Output_Ok": [(1, 11, 0), (1, 11, 1)], "Seq_Frontier": []}


def test_keep_dir_writes_sorted_facts_for_every_input(tmp_path):
    keep = tmp_path / "keep"
    run(tmp_path, """
.decl Edge(a: number, b: number)
.input Edge
.decl Other(s: symbol)
.input Other
.decl Path(a: number, b: number)
.output Path
Path(a, b) :- Edge(a, b).
""", {EDGE: [(3, 1), (1, 2), (1, 2), (-1, 10)]}, [PATH], keep_dir=keep)
    assert (keep / "Edge.facts").read_text() == "-1\t10\n1\t2\n3\t1\n"
    assert (keep / "Other.facts").read_text() == ""
    assert "path(V_a,V_b) :- edge(V_a,V_b)." in (keep / "program.lp").read_text()


def test_32_bit_range_and_symbol_checks(tmp_path):
    text = """
.decl Edge(a: number, b: number)
.input Edge
.decl Path(a: number, b: number)
.output Path
Path(a, b) :- Edge(a, b).
"""
    assert run(tmp_path, text, {EDGE: [(2**31 - 1, -(2**31))]}, [PATH]) == {"Path": [(2**31 - 1, -(2**31))]}
    with pytest.raises(InputError) as e:
        run(tmp_path, text, {EDGE: [(1, 2), (2**31, 0)]}, [PATH])
    assert "Edge" in str(e.value) and str(2**31) in str(e.value)
    with pytest.raises(InputError) as e:
        run(tmp_path, text, {EDGE: [(-(2**31) - 1, 0)]}, [PATH])
    assert str(-(2**31) - 1) in str(e.value)
    sym = rel("S", "s:symbol")
    with pytest.raises(InputError, match="tab"):
        run(tmp_path, ".decl S(s: symbol)\n.input S\n", {sym: [("a\tb",)]})
    with pytest.raises(InputError, match="newline"):
        run(tmp_path, ".decl S(s: symbol)\n.input S\n", {sym: [("a\nb",)]})


def test_facts_and_outputs_must_match_the_program(tmp_path):
    text = """
.decl Edge(a: number, b: number)
.input Edge
.decl Path(a: number, b: number)
.output Path
.decl Mid(a: number)
Path(a, b) :- Edge(a, b).
"""
    with pytest.raises(InputError, match="not an .input"):
        run(tmp_path, text, {rel("Path", "a:number", "b:number"): [(1, 2)]}, [PATH])
    with pytest.raises(InputError, match="not an .output"):
        run(tmp_path, text, {}, [rel("Mid", "a:number", role="output")])
    with pytest.raises(InputError, match="not declared"):
        run(tmp_path, text, {rel("Nope", "a:number"): [(1,)]}, [PATH])
    with pytest.raises(InputError, match="arity 3"):
        run(tmp_path, text, {rel("Edge", "a:number", "b:number", "c:number"): [(1, 2, 3)]}, [PATH])
    with pytest.raises(InputError, match="type symbol"):
        run(tmp_path, text, {rel("Edge", "a:number", "b:symbol"): [(1, "x")]}, [PATH])
    with pytest.raises(InputError, match="expected 2"):
        run(tmp_path, text, {EDGE: [(1, 2, 3)]}, [PATH])


def test_resolve_engine(monkeypatch):
    monkeypatch.setattr(engine.shutil, "which", lambda name: None)
    assert resolve_engine("auto") == "clingo"
    assert resolve_engine("clingo") == "clingo"
    with pytest.raises(InputError) as e:
        resolve_engine("souffle")
    assert str(e.value) == "engine 'souffle' requested but `souffle` is not on PATH"
    monkeypatch.setattr(engine.shutil, "which", lambda name: "/usr/bin/souffle")
    assert resolve_engine("auto") == "clingo"  # no rules given: no compiled Soufflé binary to use
    assert resolve_engine("souffle") == "souffle"
    with pytest.raises(InputError):
        resolve_engine("nemo")  # type: ignore[arg-type]


def test_fast_and_public_result_conversion_agree():
    ctl = clingo.Control(["--warn=none"])
    ctl.add("base", [], 'p(1..3). q(X, (X, (-X, nil)), "s\\"x", (a, (X,)), nil) :- p(X). '
                        "r(X) :- p(X). #show q/5. #show r/1.")
    ctl.ground([("base", [])])
    with ctl.solve(yield_=True) as h:
        syms = next(iter(h)).symbols(shown=True)
    by_pred = {"q": "Q", "r": "R"}
    fast = collect_rows(syms, by_pred, fast=True)
    public = collect_rows(syms, by_pred, fast=False)
    assert {k: sorted(v) for k, v in fast.items()} == {k: sorted(v) for k, v in public.items()}
    assert sorted(fast["Q"])[0] == (1, (1, (-1, None)), 's"x', ("a", (1,)), None)
    assert sorted(fast["R"]) == [(1,), (2,), (3,)]


def test_grounding_errors_map_back_to_the_dl_file(tmp_path):
    main = tmp_path / "main.dl"
    main.write_text(".decl A(x: number)\n.output A\nA(1).\n")
    prog = parse_program(main)
    # a hand-made translation clingo rejects (our checker would refuse the .dl form)
    tr = Translation("a(1).\na(X) :- not a(X).\n#show a/1.\n", [(str(main), 3), (str(main), 7), None],
                     {"A": "a"})
    with pytest.raises(EngineError) as e:
        run_clingo(prog, {}, ["A"], tr)
    assert f"{main}:7" in str(e.value) and "unsafe" in str(e.value)


def test_large_relation_loads(tmp_path):
    """Not a timing test: checks that the packed fact loader handles a large relation."""
    n = 200_000
    out = run(tmp_path, """
.decl Edge(a: number, b: number)
.input Edge
.decl Path(a: number, b: number)
.output Path
Path(a, b) :- Edge(a, b), a % 1000 = 0.
""", {EDGE: [(i, -i) for i in range(n)]}, [PATH])
    assert out["Path"] == [(i, -i) for i in range(0, n, 1000)]


SLOW_TO_GROUND = """
.decl Node(a: number)
.input Node
.decl Pair(a: number, b: number)
.output Pair
Pair(a, b) :- Node(a), Node(b), a < b.
"""
NODE = rel("Node", "a:number")
PAIR = rel("Pair", "a:number", "b:number", role="output")


@pytest.fixture
def slow_grounding(monkeypatch, tmp_path):
    """A program whose grounding takes 2 s: the fact table callback clingo calls while it
    grounds sleeps first (a sleeping callback needs no CPU, unlike a big program)."""
    from dlverify.engine import clingo_runner

    fetch = clingo_runner._Context.dlv_facts

    def slow(self, k):
        time.sleep(2)
        return fetch(self, k)

    monkeypatch.setattr(clingo_runner._Context, "dlv_facts", slow)
    main = tmp_path / "main.dl"
    main.write_text(SLOW_TO_GROUND)
    run_program(main, {}, [PAIR], engine="clingo")  # parsed and translated before any clock starts
    return main


def _grounding_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "clingo-ground" and t.is_alive()]


def test_time_limit_stops_clingo_while_it_grounds(slow_grounding):
    """SIGALRM (dlverify.limits.time_limit) raises OutOfTime while clingo is still grounding,
    not after: the engine evaluates in a worker thread and never swallows the exception."""
    with pytest.raises(OutOfTime) as e:
        with time_limit(0.3):
            run_program(slow_grounding, {NODE: [(1,), (2,)]}, [PAIR], engine="clingo")
    alive = _grounding_threads()
    assert any(entry.name == "_wait" for entry in e.traceback)  # raised while waiting for clingo
    assert alive, "OutOfTime came only after grounding ended"


def test_timeout_argument_raises_out_of_time(slow_grounding):
    with pytest.raises(OutOfTime, match="clingo"):
        run_program(slow_grounding, {NODE: [(1,), (2,)]}, [PAIR], engine="clingo", timeout=0.3)
    assert _grounding_threads()
    # the same run without a limit completes
    res = run_program(slow_grounding, {NODE: [(1,), (2,)]}, [PAIR], engine="clingo")
    assert res.relations == {"Pair": [(1, 2)]}


def test_rules_are_parsed_and_translated_once_per_text(tmp_path, monkeypatch):
    from dlverify.engine import clingo_runner, load_rules

    main = tmp_path / "main.dl"
    main.write_text(".decl Edge(a: number, b: number)\n.input Edge\n"
                    ".decl Path(a: number, b: number)\n.output Path\nPath(a, b) :- Edge(a, b).\n")
    calls = []
    translate = clingo_runner.program_text
    monkeypatch.setattr(clingo_runner, "program_text", lambda *a: calls.append(a) or translate(*a))
    first = load_rules(main)
    for i in range(3):
        assert run_program(main, {EDGE: [(i, i + 1)]}, [PATH], engine="clingo").relations == {"Path": [(i, i + 1)]}
    assert load_rules(main) is first and len(calls) == 1
    main.write_text(main.read_text() + "Path(a, c) :- Path(a, b), Edge(b, c).\n")  # new text: parsed again
    assert load_rules(main) is not first
    assert run_program(main, {EDGE: [(1, 2), (2, 3)]}, [PATH], engine="clingo").relations == {
        "Path": [(1, 2), (1, 3), (2, 3)]}
    assert len(calls) == 2
