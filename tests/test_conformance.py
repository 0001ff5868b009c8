"""Conformance of the subset checker with Soufflé, and of the two engines with each other.

Each program below uses constructs of the subset (datalog/README.md). Always: the
checker accepts it, or rejects it with the expected message and line. When `souffle`
is on PATH: Soufflé accepts exactly the programs the checker accepts (its semantic
checks run through `souffle -g`, no evaluation), and every accepted program gives the
same output rows on Soufflé (interpreter) and on clingo.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dlverify.engine import run_program, souffle_runner
from dlverify.engine.dialect import parse_program
from dlverify.errors import DialectError
from dlverify.schema import Column, Relation

SOUFFLE = shutil.which("souffle")
needs_souffle = pytest.mark.skipif(SOUFFLE is None, reason="`souffle` is not on PATH "
                                   "(../shared/tools/souffle/setup.sh, then put its bin/ on PATH)")

TYPES = """\
.type T <: number
.type U <: number
.type Name <: symbol
.type L = [h: number, t: L]
.type P = [a: T, b: Name]
"""


@dataclass
class Case:
    id: str
    text: str                       # after TYPES; the first line of text is line 6
    error: str | None = None        # a substring of the checker's message; None: accepted
    line: int = 0                   # the line of the error (0: not checked)
    inputs: dict[str, list[tuple]] = field(default_factory=dict)
    subset_only: bool = False       # refused by the subset although Soufflé accepts it
    files: dict[str, str] = field(default_factory=dict)  # more files beside the main one


ACCEPTED = [
    Case("facts_and_rule", """\
.decl E(x: number, y: number)
E(1, 2). E(2, 3). E(3, 1). E(4, -5).
.decl Out(x: number, y: number)
.output Out
Out(x, y) :- E(x, y), x < y.
"""),
    Case("transitive_closure_with_plan", """\
.decl E(x: number, y: number)
E(1, 2). E(2, 3). E(3, 4).
.decl Out(x: number, y: number)
.output Out
Out(x, y) :- E(x, y).
Out(x, z) :- Out(x, y), Out(y, z).
.plan 0:(1,2), 1:(2,1)
"""),
    Case("mutual_recursion_and_plan", """\
.decl E(x: number, y: number)
E(1, 2). E(2, 3). E(3, 4). E(4, 5).
.decl Even(x: number, y: number)
.decl Out(x: number, y: number)
.output Out
Out(x, y) :- E(x, y).
Even(x, z) :- Out(x, y), E(y, z).
.plan 0:(2,1)
Out(x, z) :- Even(x, y), E(y, z).
"""),
    Case("negation_stratified", """\
.decl A(x: number)
A(1). A(2). A(3).
.decl B(x: number)
B(2).
.decl Out(x: number)
.output Out
Out(x) :- A(x), !B(x), x != 3.
"""),
    Case("negation_with_wildcard", """\
.decl E(x: number, y: number)
E(1, 2). E(2, 3).
.decl Out(x: number)
.output Out
Out(x) :- E(x, _), !E(_, x).
"""),
    Case("arithmetic_truncates_like_c", """\
.decl A(x: number)
A(7). A(-7). A(3).
.decl Out(x: number, q: number, r: number, e: number)
.output Out
Out(x, q, r, e) :- A(x), q = x / 2, r = x % 2, e = (-x + 1) * 3 - 2.
"""),
    Case("subtypes_constants_and_arithmetic", """\
.decl N(x: number)
N(1). N(2).
.decl R(x: T)
R(5).
.decl Out(x: T)
.output Out
Out(x + 1) :- R(x), x < 7.
Out(x) :- N(y), x = y + 10.
Out(x) :- R(x), N(y), x > y.
Out(x) :- x = count : N(_).
Out(3).
"""),
    Case("subtype_into_primitive_and_negation_kind", """\
.decl R(x: T)
R(1). R(2).
.decl Q(x: U)
Q(2).
.decl Out(x: number)
.output Out
Out(x) :- R(x), !Q(x).
"""),
    Case("symbols_and_subtypes", """\
.decl Who(n: Name, age: number)
Who("ann", 31). Who("bob b", 20).
.decl Out(n: Name, s: symbol)
.output Out
Out(n, s) :- Who(n, a), a > 25, s = "old".
Out(n, n) :- Who(n, a), a <= 25.
"""),
    Case("records_recursive_and_nil", """\
.decl Len(l: L, n: number)
Len(nil, 0).
Len([3, [2, [1, nil]]], -1).
.decl Suffix(l: L, n: number)
Suffix(l, 0) :- Len(l, -1).
Suffix(t, i + 1) :- Suffix([_, t], i).
.decl Out(n: number, l: L)
.output Out
Out(n, l) :- Suffix(l, n).
Out(h, [h + 1, nil]) :- Suffix(l, _), l = [h, t], t != nil.
"""),
    Case("record_of_subtypes", """\
.decl Q(p: P)
Q([1, "x"]).
.decl R(x: T)
R(4).
.decl Out(p: P)
.output Out
Out([x, "y"]) :- R(x).
Out(p) :- Q(p).
"""),
    Case("aggregates", """\
.decl E(x: number, y: number)
E(1, 2). E(1, 3). E(2, 3). E(3, 3).
.decl Out(k: symbol, x: number, v: number)
.output Out
Out("count", x, n) :- E(x, _), n = count : { E(x, _) }.
Out("sum", x, s) :- E(x, _), s = sum y : { E(x, y) }.
Out("min", 0, m) :- m = min y : E(_, y).
Out("max", 0, m) :- m = max y + x : { E(x, y) }.
Out("pairs", 0, n) :- n = count : { E(a, b), E(c, a) }.
Out("tuples", x, n) :- E(x, _), n = count : { E(x, _), x > 1 }.
Out("neg", 0, n) :- n = count : { E(a, _), !E(1, a) }.
"""),
    Case("empty_min_has_no_value", """\
.decl E(x: number)
.decl Out(x: number)
.output Out
Out(m) :- m = min y : E(y).
Out(c) :- c = count : E(_).
"""),
    Case("input_relations", """\
.decl E(x: T, s: symbol)
.input E
.decl Out(x: T, s: symbol)
.output Out
Out(x, s) :- E(x, s), x > 1.
""", inputs={"E": [(1, "a"), (2, "b c"), (3, "d")]}),
    Case("plan_on_a_rule_soufflé_drops", """\
.decl Empty(x: number, y: number)
.decl Out(x: number, y: number)
.output Out
Out(1, 2).
Out(x, z) :- Out(x, y), Empty(y, z).
.plan 1:(2,1)
"""),
    Case("includes_and_pragma_once", """\
#include "lib/a.dl"
#include "lib/b.dl"
.decl Out(x: T)
.output Out
Out(x) :- A(x), B(x).
""", files={"lib/a.dl": "#pragma once\n.decl A(x: T)\nA(1). A(2).\n",
            "lib/b.dl": '#include "a.dl"\n.decl B(x: number)\nB(x) :- A(x), x > 1.\n'}),
    Case("comments_and_equalities", """\
/* a block
   comment */
.decl A(x: number) // trailing
A(1). A(2).
.decl Out(x: number, y: number)
.output Out
Out(x, y) :- A(x), y = x, x = 2.
Out(y, x) :- A(x), x + 1 = y.
"""),
]

REJECTED = [
    Case("relation_and_type_share_a_name", """\
.decl T(x: number)
""", "has the name of a type", 6),
    Case("number_variable_into_subtype", """\
.decl N(x: number)
.decl R(x: T)
R(x) :- N(x).
""", "variable x has type number but R expects T", 8),
    Case("number_variable_bound_to_constant_into_subtype", """\
.decl N(x: number)
.decl R(x: T)
R(x) :- N(x), x = 1.
""", "variable x has type number but R expects T", 8),
    Case("two_subtypes_do_not_meet", """\
.decl R(x: T)
.decl Q(x: U)
.decl Out(x: number)
Out(x) :- R(x), Q(y), x = y.
""", "cannot deduce a type", 9),
    Case("comparison_of_two_subtypes", """\
.decl R(x: T)
.decl Q(x: U)
.decl Out(x: number)
Out(x) :- R(x), Q(y), x < y.
""", "cannot deduce a type", 9),
    Case("sum_of_a_subtype_into_another", """\
.decl R(x: T)
.decl Q(x: U)
R(x) :- x = sum y : Q(y).
""", "variable x has type U but R expects T", 8),
    Case("subtype_into_other_subtype", """\
.decl R(x: T)
.decl Q(x: U)
R(x) :- Q(x).
""", "variable x has type U but R expects T", 8),
    Case("symbol_into_number", """\
.decl S(x: symbol)
.decl N(x: number)
N(x) :- S(x).
""", "variable x has type symbol but N expects number", 8),
    Case("plan_version_out_of_range", """\
.decl E(x: number, y: number) E(1, 2).
.decl Out(x: number, y: number) .output Out
Out(x, y) :- E(x, y).
Out(x, z) :- Out(x, y), E(y, z).
.plan 1:(2,1)
""", "only versions 0..0 exist", 10),
    Case("plan_on_non_recursive_rule", """\
.decl E(x: number, y: number) E(1, 2).
.decl Out(x: number, y: number) .output Out
Out(x, z) :- E(x, y), E(y, z).
.plan 0:(2,1)
""", "non-recursive rule", 9),
    Case("plan_order_too_short", """\
.decl E(x: number, y: number) E(1, 2).
.decl Out(x: number, y: number) .output Out
Out(x, y) :- E(x, y).
Out(x, z) :- Out(x, y), E(y, z).
.plan 0:(1)
""", "order of 1 atom(s)", 10),
    Case("plan_order_not_a_permutation", """\
.decl E(x: number, y: number) E(1, 2).
.decl Out(x: number, y: number) .output Out
Out(x, y) :- E(x, y).
Out(x, z) :- Out(x, y), E(y, z).
.plan 0:(1,1)
""", "not a permutation", 10),
    Case("plan_counts_no_negated_atoms", """\
.decl E(x: number, y: number) E(1, 2).
.decl N(x: number) N(2).
.decl Out(x: number, y: number) .output Out
Out(x, y) :- E(x, y).
Out(x, z) :- Out(x, y), E(y, z), !N(z).
.plan 0:(2,1,3)
""", "order of 3 atom(s)", 11),
    Case("ungrounded_variable", """\
.decl A(x: number)
.decl Out(x: number)
Out(y) :- A(x), y > x.
""", "not grounded", 8),
    Case("arithmetic_does_not_ground", """\
.decl A(x: number)
.decl Out(x: number)
Out(x) :- A(x + 1).
""", "not grounded", 8),
    Case("arity_mismatch", """\
.decl A(x: number)
.decl Out(x: number)
Out(x) :- A(x, x).
""", "arity 1", 8),
    Case("undeclared_relation", """\
.decl Out(x: number)
Out(x) :- Nope(x).
""", "not declared", 7),
    Case("negation_not_stratified", """\
.decl A(x: number)
.decl Out(x: number)
Out(x) :- A(x), !Out(x).
""", "not stratified", 8),
    Case("aggregate_not_stratified", """\
.decl Out(x: number)
Out(n) :- Out(m), n = count : Out(_), n > m.
""", "not stratified", 7),
    Case("count_wildcard_over_several_atoms", """\
.decl E(x: number, y: number)
.decl Out(x: number)
Out(n) :- n = count : { E(a, _), E(_, a) }.
""", "`_` inside a count over several atoms", 8, subset_only=True),
    Case("string_into_number_column", """\
.decl N(x: number)
N("a").
""", "a string where N expects type number", 7),
    Case("variable_in_fact", """\
.decl N(x: number)
N(x).
""", "variable x in a fact", 7),
    Case("wrong_record_size", """\
.decl Q(l: L)
Q([1, nil, 2]).
""", "record of 3 element(s)", 7),
    Case("duplicate_declaration", """\
.decl N(x: number)
.decl N(x: number)
""", "declared twice", 7),
    Case("unknown_column_type", """\
.decl N(x: Nope)
""", "unknown type Nope", 6),
]

CASES = ACCEPTED + REJECTED


def _write(tmp_path: Path, case: Case) -> Path:
    main = tmp_path / f"{case.id}.dl"
    main.write_text(TYPES + case.text)
    for name, text in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return main


def _souffle_accepts(main: Path, tmp_path: Path) -> tuple[bool, str]:
    """Soufflé's verdict on the program: all of its semantic checks, code generation, no run."""
    proc = subprocess.run([SOUFFLE, "-w", "-g", str(tmp_path / "gen.cpp"), str(main)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode == 0, proc.stderr


def _relations(main: Path, case: Case) -> tuple[dict[Relation, list[tuple]], list[Relation]]:
    prog = parse_program(main)

    def rel(name: str, role: str) -> Relation:
        cols = tuple(Column(n, t) for n, t in prog.decls[name].columns)
        return Relation(name, cols, f"conformance relation {name}", role)

    facts = {rel(n, "input"): rows for n, rows in case.inputs.items()}
    return facts, [rel(n, "output") for n in prog.outputs]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_checker_verdict(case, tmp_path):
    main = _write(tmp_path, case)
    if case.error is None:
        parse_program(main)
        return
    with pytest.raises(DialectError) as e:
        parse_program(main)
    assert case.error in e.value.message
    if case.line:
        assert e.value.line == case.line, e.value


@needs_souffle
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_souffle_agrees_with_the_checker(case, tmp_path):
    if case.subset_only:
        pytest.skip("the subset refuses this on purpose (datalog/README.md); Soufflé accepts it")
    accepted, stderr = _souffle_accepts(_write(tmp_path, case), tmp_path)
    assert accepted == (case.error is None), stderr


@needs_souffle
@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_both_engines_give_the_same_rows(case, tmp_path, monkeypatch):
    monkeypatch.setenv("DLVERIFY_SOUFFLE_MODE", "interpreted")  # one program each: no compile
    main = _write(tmp_path, case)
    facts, outputs = _relations(main, case)
    clingo_res = run_program(main, facts, outputs, engine="clingo")
    souffle_res = run_program(main, facts, outputs, engine="souffle")
    assert souffle_res.engine == "souffle"
    assert souffle_res.relations == clingo_res.relations
    assert any(clingo_res.relations.values()), "the case derives nothing: it compares nothing"


def test_every_case_is_checked_against_the_subset():
    """The accepted programs use every construct the subset allows."""
    text = "".join(c.text + "".join(c.files.values()) for c in ACCEPTED) + TYPES
    for construct in ("#include", "#pragma once", "/*", "//", ".type", "<: number", "<: symbol", "= [", ".decl", ".input", ".output",
                      ".plan", "!", "nil", "count :", "sum ", "min ", "max ", " / ", " % ", "_",
                      "!=", "<=", " < ", " > ", "\"", "-"):
        assert construct in text, construct


@needs_souffle
def test_souffle_accepts_the_shipped_rules(tmp_path):
    main = Path(__file__).resolve().parent.parent / "datalog" / "main.dl"
    parse_program(main)
    accepted, stderr = _souffle_accepts(main, tmp_path)
    assert accepted, stderr


@needs_souffle
@pytest.mark.skipif(not souffle_runner.compiler_available(), reason="no C++ compiler for Soufflé's compiled mode")
def test_compiled_mode_builds_once_and_agrees(tmp_path, monkeypatch):
    """The compile path for real, on a tiny program: built once into the cache dir, then reused."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(souffle_runner.MODE_ENV, "compiled")
    case = next(c for c in ACCEPTED if c.id == "transitive_closure_with_plan")
    main = _write(tmp_path, case)
    facts, outputs = _relations(main, case)
    program = parse_program(main)
    assert souffle_runner.cached_binary(program, SOUFFLE) is None
    res = run_program(main, facts, outputs, engine="souffle")
    binary = souffle_runner.cached_binary(program, SOUFFLE)
    assert binary is not None and binary.parent == tmp_path / "cache" / "dlverify" / "souffle"
    assert not [p for p in binary.parent.iterdir() if p.name.startswith("build-")]  # no build dir left
    assert res.relations == run_program(main, facts, outputs, engine="clingo").relations
    plan = souffle_runner.plan_run(program, main)
    assert plan.mode == "compiled" and plan.binary == binary  # reused, not rebuilt
