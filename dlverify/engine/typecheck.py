"""Soufflé's type rules for one clause of the subset, checked as Soufflé 2.x checks them.

The types of one base kind form a small lattice: the constant type of the kind
(what a literal, an arithmetic result or a `count` has) above the primitive
(`number`, `symbol`), above its declared subtypes, which are pairwise distinct.
A variable's type is the meet of its upper bounds: the column types of the
positive body atoms it occurs in, the constant type when it equals a literal,
an arithmetic term or a `count`, and the types of the variables it is compared
with (comparisons unify). Then, as Soufflé's sink rules require:
- a head argument must be a subtype of its column type, or of a constant type
  above it (`T(x + 1)` and `T(1)` may fill a `T <: number` column; a variable
  bound by a `number` column may not: Soufflé reports "Atom's argument type is
  not a subtype of its declared type");
- a negated atom's argument only needs the same base kind (records: the same type).
"""
from __future__ import annotations

from dataclasses import dataclass

from dlverify.engine.syntax import (PRIMITIVE_TYPES, Agg, Atom, BinOp, Clause, Neg, Num, Program, Record,
                                    Str, Var, aggs, lit_terms, subterms)
from dlverify.errors import DialectError

# The constant types: above `number` / `symbol` (not nameable in a program).
NUMBER_CONSTANT = "a number constant"
SYMBOL_CONSTANT = "a symbol constant"


@dataclass
class _Bound:
    """An upper bound on a variable's type, and the line that imposed it."""
    type: str
    line: int


@dataclass
class _Deduced:
    """A variable class's type, or a conflict between two of its bounds."""
    type: str
    line: int
    conflict: str = ""  # the type that has no meet with `type` ('' when consistent)
    conflict_line: int = 0


class _Lattice:
    def __init__(self, prog: Program) -> None:
        self.prog = prog

    def base(self, ty: str) -> str:
        """number / symbol for constant, primitive and subtypes; the record type itself for records."""
        if ty == NUMBER_CONSTANT:
            return "number"
        if ty == SYMBOL_CONSTANT:
            return "symbol"
        k = self.prog.kind(ty)
        return ty if k == "record" else k

    def level(self, ty: str) -> int:
        """2 for a constant type, 1 for a primitive, 0 for a subtype or record."""
        if ty in (NUMBER_CONSTANT, SYMBOL_CONSTANT):
            return 2
        return 1 if ty in PRIMITIVE_TYPES else 0

    def meet(self, a: str, b: str) -> str | None:
        if a == b:
            return a
        if self.base(a) != self.base(b):
            return None
        la, lb = self.level(a), self.level(b)
        if la == lb:
            return None  # two different subtypes (or records)
        return b if la > lb else a

    def below(self, a: str, b: str) -> bool:
        """a is a subtype of b (or equal)."""
        return self.meet(a, b) == a


def check_types(prog: Program, c: Clause) -> None:
    """Raise DialectError where Soufflé's type checker rejects clause `c` (already grounded)."""
    lat = _Lattice(prog)
    f = c.file
    parent: dict[str, str] = {}

    def find(v: str) -> str:
        while parent.get(v, v) != v:
            v = parent[v]
        return v

    bounds: dict[str, list[_Bound]] = {}

    def add(v: Var, ty: str) -> None:
        bounds.setdefault(v.name, []).append(_Bound(ty, v.line))

    def constrain(t, ty: str) -> None:
        if isinstance(t, Var):
            add(t, ty)
        elif isinstance(t, Record) and prog.kind(ty) == "record":
            for x, (_, fty) in zip(t.items, prog.types[ty].fields):
                constrain(x, fty)

    def numeric_operands(t) -> None:
        for s in subterms(t):
            if isinstance(s, (BinOp, Neg)):
                for x in (s.left, s.right) if isinstance(s, BinOp) else (s.arg,):
                    if isinstance(x, Var):
                        add(x, NUMBER_CONSTANT)

    def unify(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    lits = list(c.body) + [x for agg in aggs(c.body) for x in agg.body]
    record_eqs: list[tuple[Var, Record]] = []
    for t in c.head.args:
        numeric_operands(t)
    for lit in lits:
        for t in lit_terms(lit):
            numeric_operands(t)
        if isinstance(lit, Atom):
            if not lit.negated:
                for t, (_, ty) in zip(lit.args, prog.decls[lit.rel].columns):
                    constrain(t, ty)
            continue
        l, r = lit.left, lit.right
        if isinstance(l, Var) and isinstance(r, Var):
            unify(l.name, r.name)
        for a, b in ((l, r), (r, l)):
            if not isinstance(a, Var):
                continue
            if isinstance(b, (Num, BinOp, Neg)):
                add(a, NUMBER_CONSTANT)
            elif isinstance(b, Str):
                add(a, SYMBOL_CONSTANT)
            elif isinstance(b, Agg):
                target = b.target
                if b.kind == "count" or not isinstance(target, Var):
                    add(a, NUMBER_CONSTANT)  # count, or an arithmetic/constant target
                else:
                    unify(a.name, target.name)  # sum/min/max of a variable: the variable's type
            elif isinstance(b, Record) and lit.op == "=":
                record_eqs.append((a, b))
        for side in (l, r):
            if isinstance(side, Agg) and isinstance(side.target, Var):
                add(side.target, NUMBER_CONSTANT)

    def deduce() -> dict[str, _Deduced]:
        out: dict[str, _Deduced] = {}
        for name, lst in bounds.items():
            root = find(name)
            for b in lst:
                cur = out.get(root)
                if cur is None:
                    out[root] = _Deduced(b.type, b.line)
                    continue
                if cur.conflict:
                    continue
                m = lat.meet(cur.type, b.type)
                if m:
                    cur.type = m
                else:
                    cur.conflict, cur.conflict_line = b.type, b.line
        return out

    done: set[int] = set()
    progress = True
    while progress:  # record destructuring: `l = [h, t]` types h and t from l's type
        progress = False
        typed = deduce()
        for v, rec in record_eqs:
            d = typed.get(find(v.name))
            if id(rec) in done or d is None or d.conflict or lat.level(d.type) or prog.kind(d.type) != "record":
                continue
            fields = prog.types[d.type].fields
            if len(fields) != len(rec.items):
                raise DialectError(f"record of {len(rec.items)} element(s) where {d.type} has "
                                   f"{len(fields)} field(s)", f, rec.line)
            constrain(rec, d.type)
            done.add(id(rec))
            progress = True
    typed = deduce()
    for name in sorted(bounds):
        d = typed[find(name)]
        if d.conflict:
            raise DialectError(f"cannot deduce a type for variable {name}: it is used as {d.type} "
                               f"(line {d.line}) and as {d.conflict} (line {d.conflict_line})", f, d.conflict_line)

    def sink(t, ty: str, negated: bool, rel: str) -> None:
        if isinstance(t, Record) and prog.kind(ty) == "record":
            for x, (_, fty) in zip(t.items, prog.types[ty].fields):
                sink(x, fty, negated, rel)
            return
        if not isinstance(t, Var) or find(t.name) not in typed:
            return
        vt = typed[find(t.name)].type
        if negated:
            ok = vt == ty or (prog.kind(ty) != "record" and lat.base(vt) == lat.base(ty))
        else:
            ok = lat.below(vt, ty) or (lat.level(vt) == 2 and lat.below(ty, vt))
        if not ok:
            raise DialectError(f"variable {t.name} has type {vt} but {rel} expects {ty}", f, t.line)

    for atom in [c.head] + [x for x in lits if isinstance(x, Atom) and x.negated]:
        for t, (_, ty) in zip(atom.args, prog.decls[atom.rel].columns):
            sink(t, ty, atom.negated, atom.rel)
