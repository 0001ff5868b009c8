"""lists.dl in isolation: the offset-list helpers (Suffix/Off_At, List_Add, Merge,
Wild_List), driven by a test-only main program that creates their demand from
flat input facts and outputs what they derive."""
from pathlib import Path

import pytest

from dlverify.engine import run_program
from dlverify.schema import Column, Relation

DATALOG = Path(__file__).resolve().parent.parent / "datalog"

MAIN = f"""
#include "{DATALOG / 'schema.dl'}"
#include "{DATALOG / 'lists.dl'}"
#include "{DATALOG / 'views.dl'}"

// Lists by id, of length 0..3 (input facts must be flat). The ids are TensorIds
// because they fill View's tensor columns (Soufflé: a `number` variable may not).
.decl T_L0(id: TensorId)
.input T_L0
.decl T_L1(id: TensorId, a: number)
.input T_L1
.decl T_L2(id: TensorId, a: number, b: number)
.input T_L2
.decl T_L3(id: TensorId, a: number, b: number, c: number)
.input T_L3
.decl T_List(id: TensorId, l: OffList)
T_List(id, nil) :- T_L0(id).
T_List(id, [a, nil]) :- T_L1(id, a).
T_List(id, [a, [b, nil]]) :- T_L2(id, a, b).
T_List(id, [a, [b, [c, nil]]]) :- T_L3(id, a, b, c).

// Every list is the offset list of a view, as in the real program: that is
// what makes lists.dl index into it (List_Need).
View(id, id, 0, l, nil, [0, 0, 0, 0]) :- T_List(id, l).

.decl T_OffAt(id: number, i: number, v: number)
.output T_OffAt
T_OffAt(id, i, v) :- T_List(id, l), Off_At(l, i, v).

.decl T_AddReq(id: number, k: number, delta: number)
.input T_AddReq
List_AddNeed(l, k, d) :- T_AddReq(id, k, d), T_List(id, l).
.decl T_Add(id: number, k: number, delta: number, out: OffList)
.output T_Add
T_Add(id, k, d, out) :- T_AddReq(id, k, d), T_List(id, l), List_Add(l, k, d, out).

.decl T_MergeReq(a: number, b: number)
.input T_MergeReq
Merge_Need(la, lb) :- T_MergeReq(a, b), T_List(a, la), T_List(b, lb).
.decl T_Merge(a: number, b: number, out: OffList)
.output T_Merge
T_Merge(a, b, out) :- T_MergeReq(a, b), T_List(a, la), T_List(b, lb), Merge(la, lb, out).

.decl T_WildReq(n: number)
.input T_WildReq
Wild_Need(n) :- T_WildReq(n).
.decl T_Wild(n: number, l: OffList)
.output T_Wild
T_Wild(n, l) :- Wild_List(n, l).
"""


def rel(name, *cols, role="input"):
    return Relation(name, tuple(Column(*c.split(":")) for c in cols), f"test relation {name}", role)


L0 = rel("T_L0", "id:TensorId")
L1 = rel("T_L1", "id:TensorId", "a:number")
L2 = rel("T_L2", "id:TensorId", "a:number", "b:number")
L3 = rel("T_L3", "id:TensorId", "a:number", "b:number", "c:number")
ADD_REQ = rel("T_AddReq", "id:number", "k:number", "delta:number")
MERGE_REQ = rel("T_MergeReq", "a:number", "b:number")
WILD_REQ = rel("T_WildReq", "n:number")
OFF_AT = rel("T_OffAt", "id:number", "i:number", "v:number", role="output")
ADD = rel("T_Add", "id:number", "k:number", "delta:number", "out:OffList", role="output")
MERGE = rel("T_Merge", "a:number", "b:number", "out:OffList", role="output")
WILD = rel("T_Wild", "n:number", "l:OffList", role="output")


def L(*xs):
    """A Python offset list as the engine returns it: (a, (b, (c, None)))."""
    out = None
    for x in reversed(xs):
        out = (x, out)
    return out


LISTS = {1: (4, 2, 6), 2: (-1, 0, 5), 3: (0, -1, 5), 4: (-1, -1, 5), 5: (0, 0, 6), 6: (7,),
         7: (3, 4), 8: (), 9: (), 10: (-1,), 11: (3, -1)}


@pytest.fixture(scope="module")
def lists_main(tmp_path_factory) -> Path:
    main = tmp_path_factory.mktemp("lists") / "main.dl"
    main.write_text(MAIN)
    return main


def run(main, **reqs):
    facts = {L0: [], L1: [], L2: [], L3: []}
    for i, xs in LISTS.items():
        facts[{0: L0, 1: L1, 2: L2, 3: L3}[len(xs)]].append((i, *xs))
    facts[ADD_REQ] = reqs.get("add", [])
    facts[MERGE_REQ] = reqs.get("merge", [])
    facts[WILD_REQ] = reqs.get("wild", [])
    res = run_program(main, facts, [OFF_AT, ADD, MERGE, WILD], engine="clingo")
    assert res.engine == "clingo"
    return res.relations


def test_off_at_indexes_every_list_of_a_view(lists_main):
    out = run(lists_main)
    by_id = {}
    for i, k, v in out["T_OffAt"]:
        by_id.setdefault(i, {})[k] = v
    for i, xs in LISTS.items():
        assert by_id.get(i, {}) == dict(enumerate(xs)), i
    assert 8 not in by_id     # the empty list has no elements


def test_list_add_adds_to_element_k(lists_main):
    out = run(lists_main, add=[(1, 0, 2), (1, 1, 3), (1, 2, -6), (6, 0, 5), (7, 1, 10)])
    assert set(out["T_Add"]) == {
        (1, 0, 2, L(6, 2, 6)),
        (1, 1, 3, L(4, 5, 6)),
        (1, 2, -6, L(4, 2, 0)),
        (6, 0, 5, L(12)),
        (7, 1, 10, L(3, 14)),
    }


def test_list_add_never_adds_to_a_wildcard(lists_main):
    out = run(lists_main, add=[(2, 0, 4), (10, 0, 1), (3, 1, 2), (4, 1, 2), (11, 1, 3)])
    assert set(out["T_Add"]) == set()


def test_list_add_keeps_wildcards_at_other_positions(lists_main):
    out = run(lists_main, add=[(2, 1, 4), (2, 2, 1), (3, 0, 2), (4, 2, 3)])
    assert set(out["T_Add"]) == {
        (2, 1, 4, L(-1, 4, 5)),
        (2, 2, 1, L(-1, 0, 6)),
        (3, 0, 2, L(2, -1, 5)),
        (4, 2, 3, L(-1, -1, 8)),
    }


def test_list_add_past_the_end_derives_nothing(lists_main):
    out = run(lists_main, add=[(6, 1, 1), (7, 5, 1), (8, 0, 1)])
    assert set(out["T_Add"]) == set()


def test_list_add_is_plain_arithmetic_even_below_zero(lists_main):
    # List_Add itself does not bound-check: callers with negative deltas (the iota
    # shift) check the result against the tensor bounds themselves
    out = run(lists_main, add=[(5, 0, -3)])
    assert set(out["T_Add"]) == {(5, 0, -3, L(-3, 0, 6))}


def test_merge_agrees_position_by_position_and_wildcards_yield(lists_main):
    out = run(lists_main, merge=[(1, 1), (2, 3), (3, 2), (2, 4), (4, 4), (8, 9), (10, 6),
                                 (11, 7), (7, 11)])
    assert set(out["T_Merge"]) == {
        (1, 1, L(4, 2, 6)),
        (2, 3, L(0, 0, 5)),       # [-1, 0, 5] with [0, -1, 5]: each wildcard yields
        (3, 2, L(0, 0, 5)),
        (2, 4, L(-1, 0, 5)),      # [-1, 0, 5] with [-1, -1, 5]
        (4, 4, L(-1, -1, 5)),     # a wildcard with a wildcard stays a wildcard
        (8, 9, None),             # two empty lists
        (10, 6, L(7)),
        (11, 7, L(3, 4)),
        (7, 11, L(3, 4)),
    }


def test_merge_of_disagreeing_or_unequal_length_lists_derives_nothing(lists_main):
    # (4,2,6)/(0,0,6) differ in concrete offsets; (-1,0,5)/(0,0,6) differ in the last
    # one only; (-1,)/(3,4) and ()/(7,) differ in length
    out = run(lists_main, merge=[(1, 5), (2, 5), (5, 2), (4, 5), (10, 7), (8, 6), (6, 8)])
    assert set(out["T_Merge"]) == set()


def test_wild_list_builds_all_wildcard_lists_down_to_length_0(lists_main):
    out = run(lists_main, wild=[(3,)])
    assert set(out["T_Wild"]) == {(0, None), (1, L(-1)), (2, L(-1, -1)), (3, L(-1, -1, -1))}
    out = run(lists_main, wild=[(0,)])
    assert set(out["T_Wild"]) == {(0, None)}
    out = run(lists_main)
    assert set(out["T_Wild"]) == set()      # demand-driven: nothing without a Wild_Need
