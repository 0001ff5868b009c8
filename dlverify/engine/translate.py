"""Translation of a checked Program (syntax.py) into clingo text.

Relations become predicates with their first letter lowercased, records become
tuples, `%` becomes clingo's `\\`, aggregates become clingo's `#count/#sum/#min/#max`
over the aggregate's local variables (so that they count distinct tuples as
Soufflé does). `.plan` clauses are dropped: clingo has no join plans.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from dlverify.engine.syntax import Agg, Atom, BinOp, Clause, Neg, Nil, Num, Program, Record, Str, Var, Wild
from dlverify.errors import DialectError


def predicate_name(rel: str) -> str:
    return rel[0].lower() + rel[1:]


def predicate_names(prog: Program) -> dict[str, str]:
    """Relation -> clingo predicate (first letter lowercased); refuses collisions."""
    out: dict[str, str] = {}
    back: dict[str, str] = {}
    for name, d in prog.decls.items():
        pred = predicate_name(name)
        if pred == "not" or not re.fullmatch(r"[a-z][A-Za-z0-9_]*", pred):
            raise DialectError(f"relation name {name} cannot be translated to a clingo predicate",
                               d.file, d.line)
        if pred in back:
            raise DialectError(f"relations {back[pred]} and {name} both translate to the clingo "
                               f"predicate {pred}", d.file, d.line)
        back[pred] = name
        out[name] = pred
    return out


@dataclass
class Translation:
    text: str
    origins: list[tuple[str, int] | None]  # per line of `text` (1-based line i -> origins[i-1])
    predicates: dict[str, str]  # relation -> clingo predicate

    def origin(self, line: int) -> tuple[str, int] | None:
        return self.origins[line - 1] if 1 <= line <= len(self.origins) else None


class _Emitter:
    def __init__(self, preds: dict[str, str]) -> None:
        self.preds = preds
        self.fresh = 0

    def term(self, t, wild_vars: list[str] | None = None) -> str:
        if isinstance(t, Var):
            return "V_" + t.name
        if isinstance(t, Wild):
            if wild_vars is not None:
                self.fresh += 1
                name = f"W_{self.fresh}"
                wild_vars.append(name)
                return name
            return "_"
        if isinstance(t, Num):
            return str(t.value)
        if isinstance(t, Str):
            return f'"{t.value}"'
        if isinstance(t, Nil):
            return "nil"
        if isinstance(t, Record):
            items = [self.term(x, wild_vars) for x in t.items]
            return "(" + ",".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(t, BinOp):
            op = "\\" if t.op == "%" else t.op
            return f"({self.term(t.left)} {op} {self.term(t.right)})"
        if isinstance(t, Neg):
            return f"-({self.term(t.arg)})"
        raise AssertionError(t)

    def atom(self, a: Atom, wild_vars: list[str] | None = None) -> str:
        s = self.preds[a.rel] + "(" + ",".join(self.term(x, wild_vars) for x in a.args) + ")"
        return "not " + s if a.negated else s

    def literal(self, lit, guards: list[str]) -> str:
        if isinstance(lit, Atom):
            return self.atom(lit)
        agg = lit.left if isinstance(lit.left, Agg) else lit.right if isinstance(lit.right, Agg) else None
        if agg is None:
            return f"{self.term(lit.left)} {lit.op} {self.term(lit.right)}"
        var = self.term(lit.right if agg is lit.left else lit.left)
        wild_vars: list[str] | None = [] if agg.kind == "count" else None
        body = ", ".join(self.atom(x, wild_vars if isinstance(x, Atom) and not x.negated else None)
                         if isinstance(x, Atom) else self.literal(x, guards) for x in agg.body)
        tup = ["V_" + n for n in agg.locals] + (wild_vars or [])
        if agg.kind != "count":
            tup = [self.term(agg.target)] + tup
        if agg.kind == "min":
            guards.append(f"{var} != #sup")
        elif agg.kind == "max":
            guards.append(f"{var} != #inf")
        return f"{var} = #{agg.kind}{{ {','.join(tup)} : {body} }}"

    def clause(self, c: Clause) -> str:
        head = self.atom(c.head)
        if not c.body:
            return head + "."
        guards: list[str] = []
        lits = [self.literal(x, guards) for x in c.body]
        return head + " :- " + ", ".join(lits + guards) + "."


def translate(prog: Program, shown: Sequence[str] | None = None) -> Translation:
    """clingo text for `prog`, one line per clause; `#show` for `shown` (default: every .output)."""
    preds = predicate_names(prog)
    em = _Emitter(preds)
    lines: list[str] = []
    origins: list[tuple[str, int] | None] = []
    for c in prog.clauses:
        lines.append(em.clause(c))
        origins.append((c.file, c.line))
    shown = list(prog.outputs) if shown is None else list(shown)
    for name in shown:
        lines.append(f"#show {preds[name]}/{len(prog.decls[name].columns)}.")
        origins.append(prog.outputs.get(name))
    if not shown:
        lines.append("#show.")
        origins.append(None)
    return Translation("\n".join(lines) + "\n", origins, preds)