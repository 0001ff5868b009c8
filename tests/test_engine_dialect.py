"""The Soufflé subset: parsing, includes, refusals (with file and line) and the clingo translation."""
from __future__ import annotations

from pathlib import Path

import pytest

from dlverify import schema
from dlverify.engine.dialect import parse_program, predicate_names, translate
from dlverify.errors import DialectError

REPO = Path(__file__).resolve().parent.parent

# Declarations shared by the snippets below: 8 lines, so a snippet starts at line 9.
HEADER = """\
.type OffList = [head: number, tail: OffList]
.decl A(x: number)
.decl B(x: number, y: number)
.decl C(x: number)
.decl S(s: symbol)
.decl L(l: OffList)
.input A
.output C
"""
SNIPPET_LINE = HEADER.count("\n") + 1


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path / next(iter(files))


def program(tmp_path: Path, body: str):
    return parse_program(write(tmp_path, {"main.dl": HEADER + body}))


def clingo_text(tmp_path: Path, body: str) -> list[str]:
    return translate(program(tmp_path, body)).text.splitlines()


# ---------------------------------------------------------------------------- schema.dl round trip


def test_generated_schema_parses_and_matches_python_schema():
    prog = parse_program(REPO / "datalog" / "schema.dl")
    assert set(prog.decls) == {r.name for r in schema.RELATIONS} | {c.name for c in schema.CONSTANTS}
    for const in schema.CONSTANTS:  # one fact each, of the declared type
        assert [t for _, t in prog.decls[const.name].columns] == [const.column.type], const.name
    for rel in schema.RELATIONS:
        decl = prog.decls[rel.name]
        assert len(decl.columns) == rel.arity, rel.name
        assert [t for _, t in decl.columns] == [c.type for c in rel.columns], rel.name
    assert set(prog.inputs) == {r.name for r in schema.INPUTS}
    assert set(prog.outputs) == {r.name for r in schema.OUTPUTS}
    assert set(prog.types) == {name for name, _, _ in schema.TYPES}
    assert prog.types["OffList"].kind == "record"
    assert prog.types["OffList"].fields == (("head", "number"), ("tail", "OffList"))
    assert prog.types["TensorId"].kind == "number"
    assert prog.column_kinds("View") == ("number", "number", "number", "record", "record", "record")
    text = translate(prog).text
    assert "#show view/6." in text and "#show output_Ok/3." in text
    assert "#show seqTensor/1." not in text  # inputs are not shown
    assert predicate_names(prog)["Dist_Frontier"] == "dist_Frontier"


# ---------------------------------------------------------------------------- includes


def test_include_resolution_relative_to_including_file(tmp_path):
    main = write(tmp_path, {
        "main.dl": '#include "lib/types.dl"\n#include "lib/rules.dl"\n.output R\n',
        "lib/types.dl": "#pragma once\n.decl E(a: number, b: number)\n.input E\n",
        "lib/rules.dl": '#include "types.dl"\n#include "../more/r.dl"\n',
        "more/r.dl": "/** doc */\n.decl R(a: number, b: number)\nR(a, b) :- E(a, b).\n",
    })
    prog = parse_program(main)
    assert set(prog.decls) == {"E", "R"}
    assert [p.name for p in prog.files] == ["main.dl", "types.dl", "rules.dl", "r.dl"]
    clause = prog.clauses[0]
    assert clause.file == str((tmp_path / "more" / "r.dl").resolve()) and clause.line == 3


def test_including_a_file_twice_without_pragma_once_is_refused(tmp_path):
    main = write(tmp_path, {
        "main.dl": '#include "a.dl"\n\n#include "a.dl"\n',
        "a.dl": ".decl E(a: number)\n",
    })
    with pytest.raises(DialectError) as e:
        parse_program(main)
    assert e.value.file == str(main.resolve()) and e.value.line == 3
    assert "#pragma once" in e.value.message


def test_missing_include(tmp_path):
    main = write(tmp_path, {"main.dl": '\n#include "nope.dl"\n'})
    with pytest.raises(DialectError) as e:
        parse_program(main)
    assert e.value.line == 2 and "not found" in e.value.message


# ---------------------------------------------------------------------------- accepted constructs


def test_translation_of_accepted_constructs(tmp_path):
    lines = clingo_text(tmp_path, """\
/* block
   comment */ C(x) :- A(x), !B(x, _), x != 3. // trailing
C(x) :- B(x, y), C(y), x = (y + -2) * 3 / 2 % 5, y >= -x.
.plan 0:(2,1), 0:(1,2)
L([1, [2, nil]]).
L([h + 1, t]) :- L(l), l = [h, t], h < 10.
S("a b").
C(n) :- A(y), n = count : { B(y, _), y > 0 }.
C(n) :- A(y), n = sum z : { B(y, z), A(z) }.
C(n) :- n = min z + 1 : B(_, z).
C(n) :- A(n), n = max z : { B(n, z) }.
""")
    assert lines[:10] == [
        "c(V_x) :- a(V_x), not b(V_x,_), V_x != 3.",
        "c(V_x) :- b(V_x,V_y), c(V_y), V_x = ((((V_y + -2) * 3) / 2) \\ 5), V_y >= -(V_x).",
        "l((1,(2,nil))).",
        "l(((V_h + 1),V_t)) :- l(V_l), V_l = (V_h,V_t), V_h < 10.",
        's("a b").',
        "c(V_n) :- a(V_y), V_n = #count{ W_1 : b(V_y,W_1), V_y > 0 }.",
        "c(V_n) :- a(V_y), V_n = #sum{ V_z,V_z : b(V_y,V_z), a(V_z) }.",
        "c(V_n) :- V_n = #min{ (V_z + 1),V_z : b(_,V_z) }, V_n != #sup.",
        "c(V_n) :- a(V_n), V_n = #max{ V_z,V_z : b(V_n,V_z) }, V_n != #inf.",
        "#show c/1.",
    ]
    assert len(lines) == 10


def test_one_element_record_and_predicate_names(tmp_path):
    main = write(tmp_path, {"main.dl": """\
.type One = [x: number]
.decl View_Dim(o: One)
.decl view_dim(o: One)
.output View_Dim
View_Dim([1]).
view_dim(o) :- View_Dim(o).
"""})
    tr = translate(parse_program(main), shown=["View_Dim"])
    assert tr.text.splitlines() == ["view_Dim((1,)).", "view_dim(V_o) :- view_Dim(V_o).", "#show view_Dim/1."]
    assert tr.origin(2) == (str(main.resolve()), 6)


def test_predicate_collision_is_refused(tmp_path):
    with pytest.raises(DialectError) as e:
        parse_program(write(tmp_path, {"main.dl": ".decl Ab(x: number)\n.decl ab(x: number)\n"}))
    assert e.value.line == 2 and "both translate" in e.value.message


def test_show_nothing_when_no_outputs(tmp_path):
    main = write(tmp_path, {"main.dl": ".decl A(x: number)\nA(1).\n"})
    assert translate(parse_program(main)).text.splitlines() == ["a(1).", "#show."]


# ---------------------------------------------------------------------------- types

TYPED = """\
.type TensorId <: number
.type OpId <: number
.type OffList = [head: number, tail: OffList]
.decl T(t: TensorId)
.decl O(o: OpId)
.decl N(n: number)
.decl S(s: symbol)
.decl L(l: OffList)
"""


@pytest.mark.parametrize("rule, error", [
    ("N(x) :- T(x), O(x).", "cannot deduce a type for variable x: it is used as TensorId (line 9) and as OpId"),
    ("O(x) :- T(x).", "variable x has type TensorId but O expects OpId"),
    ("N(x) :- S(x).", "variable x has type symbol but N expects number"),
    ("N(x) :- T(x), S(y), x = y.", "cannot deduce a type for variable"),
    ("N(x) :- L(l), x = l + 1.", "cannot deduce a type for variable l"),
    ("N(h) :- L(l), l = [h, t], S(t).", "cannot deduce a type for variable t"),
    ("N(x) :- L(l), l = [x, t], !O(t).", "variable t has type OffList but O expects OpId"),
    ("N(x) :- T(x), !O(x).", None),          # negation: same base type is enough
    ("T(x + 1) :- T(x).", None),             # an arithmetic result (a constant type) fills a TensorId column
    ("T(x) :- N(y), x = y + 1.", None),
    ("N(x) :- T(x).", None),                 # TensorId into number is allowed
    ("T(x) :- N(x).", "variable x has type number but T expects TensorId"),  # Soufflé: not a subtype
    ("T(x) :- N(x), x = 1.", "variable x has type number but T expects TensorId"),
    ("T(x) :- x = sum y : O(y).", "variable x has type OpId but T expects TensorId"),
    ("T(x) :- x = count : O(_).", None),
    ("T(x) :- T(x), O(y), x < y.", "cannot deduce a type for variable"),
    ("T(x) :- T(x), N(y), x < y.", None),    # comparisons unify: y is a TensorId
    ("T(x) :- T(x), !O(x).", None),
    ("N(h) :- L(l), l = [h, t], L(t).", None),
    ("T(x) :- T(x), x = count : O(_).", None),
])
def test_type_checks_like_souffle(tmp_path, rule, error):
    main = write(tmp_path, {"main.dl": TYPED + rule + "\n"})
    if error is None:
        parse_program(main)
        return
    with pytest.raises(DialectError) as e:
        parse_program(main)
    assert error in e.value.message and e.value.line == 9


# ---------------------------------------------------------------------------- refusals

REFUSED = [
    ("C(x) :- A(x), x = max(x, 1).", "functor `max(...)`"),
    ('S(s) :- S(t), s = cat(t, "a").', "functor `cat(...)`"),
    ("S(s) :- A(x), s = to_string(x).", "functor `to_string(...)`"),
    ("C(x) :- A(x); B(x, _).", "disjunction"),
    ("C(x) :- (A(x); B(x, _)).", "parenthesised body group"),
    ("C(x), A(x) :- B(x, _).", "several head atoms"),
    (".comp Foo { }", "`.comp`"),
    (".init foo = Foo", "`.init`"),
    (".functor f(x: number): number", "`.functor`"),
    ('.pragma "legacy"', "`.pragma`"),
    (".decl E(x: number) eqrel", "qualifier `eqrel`"),
    (".decl E(x: number) btree", "qualifier `btree`"),
    (".decl E(x: number, y: number) choice-domain x", "choice-domain"),
    ("C(x) :- A(x), x < 1.5.", "floating-point literal"),
    (".decl F(x: float)", "type float"),
    (".type U <: unsigned", "type unsigned"),
    ("C(x) :- A(x), x = $Foo(1).", "`$`"),
    ("C(x) :- A(x), x = @f(1).", "`@`"),
    ("C(x) :- A(y), x = y as number.", "`as`"),
    ("C(x) :- A(y), x = y band 1.", "`band`"),
    ("C(x) :- A(y), x = y ^ 2.", "`^`"),
    ("C(x) <= C(y) :- A(x), A(y).", "subsumptive rule"),
    ("#define N 3", "`#define`"),
    ("C(x) :- Nope(x).", "relation Nope is not declared"),
    ("C(x) :- B(x).", "B has arity 2 but is used with 1"),
    ("C(x, y) :- B(x, y).", "C has arity 1 but is used with 2"),
    (".output Nope", ".output of undeclared relation Nope"),
    (".input Nope", ".input of undeclared relation Nope"),
    (".input A(IO=file)", "I/O parameters"),
    (".decl E()", "nullary relation"),
    ("C(x) :- A(y), x = mean y : A(y).", "aggregate `mean`"),
    ("C(x) :- A(y), x = count : { A(z), z = count : A(_) }.", "nested aggregate"),
    ("C(x) :- A(y), x + 1 = count : A(_).", "aggregate other than as `x = <aggregate>`"),
    ("C(count : A(_)) :- A(1).", "aggregate in a head atom"),
    ("C(x) :- A(x), x = sum y : { B(y, _) }.", "`_` inside a sum aggregate"),
    ('S("a\\tb").', "backslash escape"),
    ("C(x) :- A(x), x < 0x10.", "only decimal integers"),
    ("C(x) :- A(x), x < 2147483648.", "outside the 32-bit range"),
    ("C(x) :- B(x, y).", None),  # fine: control case
    ("C(x) :- B(y, _).", "variable x is not grounded"),
    ("C(x) :- A(x + 1).", "variable x is not grounded"),
    ("C(x) :- A(y), !B(y, x).", "variable x is not grounded"),
    ("C(x) :- A(y), x = count : { B(y, z), z > w }.", "variable w is not grounded inside the aggregate"),
    ("C(x) :- A(_), x = min y : { B(x, y) }.", "result variable x"),
    ("C(y) :- A(_), x = min z : { B(y, z) }.", "variable y is not grounded"),
    ("C(_) :- A(1).", "`_` in a head atom"),
    ("C(x) :- A(x), x != _.", "`_` is only allowed as an atom argument"),
    ("C(x).", "variable x in a fact"),
    ("C(x) :- A(x), !C(x).", "not stratified"),
    ("C(x) :- A(x), x = count : C(_).", "not stratified"),
    ("C(x) :- A(y), z = count : B(y, _), x = count : { B(z, _) }.", "grounded outside aggregates"),
    ('C("a").', "a string where C expects type number"),
    ("L([1, 2, 3]).", "record of 3 element(s) where OffList has 2"),
    ("C(nil).", "nil where C expects type number"),
    ("C(x) :- A(x), true.", "literal `true`"),
]


@pytest.mark.parametrize("snippet, expected", REFUSED)
def test_refused_construct_names_file_and_line(tmp_path, snippet, expected):
    main = write(tmp_path, {
        "main.dl": '// main\n#include "rules.dl"\n',
        "rules.dl": HEADER + snippet + "\n",
    })
    if expected is None:
        parse_program(main)
        return
    with pytest.raises(DialectError) as e:
        parse_program(main)
    err = e.value
    assert expected in err.message
    assert err.file == str((tmp_path / "rules.dl").resolve())
    assert err.line == SNIPPET_LINE
    assert str(err).startswith(f"{err.file}:{SNIPPET_LINE}: ")


def test_refusal_message_points_to_the_readme(tmp_path):
    with pytest.raises(DialectError) as e:
        program(tmp_path, "C(x) :- A(y), x = max(y, 1).")
    assert "not in the supported Soufflé subset" in e.value.message
    assert "datalog/README.md" in e.value.message


def test_error_line_inside_a_multiline_rule(tmp_path):
    with pytest.raises(DialectError) as e:
        program(tmp_path, "C(x) :-\n  A(x),\n  x = cat(x, x).\n")
    assert e.value.line == SNIPPET_LINE + 2


def test_plan_must_follow_a_rule(tmp_path):
    with pytest.raises(DialectError) as e:
        program(tmp_path, "C(1).\n.plan 0:(1)\n")
    assert e.value.line == SNIPPET_LINE + 1 and ".plan" in e.value.message


def test_aggregate_wildcard_placement(tmp_path):
    with pytest.raises(DialectError) as e:
        program(tmp_path, "C(x) :- A(y), x = count : { A(z), !B(z, _) }.")
    assert "negated atom inside an aggregate" in e.value.message
    with pytest.raises(DialectError) as e:
        program(tmp_path, "C(x) :- x = count : { B(y, _) }, x = count : { A(y) }.")
    assert "shared by two aggregates" in e.value.message


def test_unterminated_comment_and_string(tmp_path):
    with pytest.raises(DialectError) as e:
        program(tmp_path, "C(1).\n/* never closed\n")
    assert e.value.line == SNIPPET_LINE + 1 and "unterminated" in e.value.message
    with pytest.raises(DialectError) as e:
        program(tmp_path, 'S("abc).\n')
    assert e.value.line == SNIPPET_LINE and "unterminated string" in e.value.message
