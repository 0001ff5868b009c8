"""The semantic checks of the Soufflé subset: what Soufflé itself would reject.

`check_program(program)` checks declarations and I/O, name clashes between
types and relations (Soufflé's one namespace), arities and constants, the
placement of wildcards and aggregates, groundedness, types (typecheck.py),
stratified negation and aggregates, and `.plan` clauses, raising
`DialectError(message, file, line)` at the first problem.
"""
from __future__ import annotations

import networkx as nx

from dlverify.engine.syntax import (INT_MAX, INT_MIN, PRIMITIVE_TYPES, Agg, Atom, BinOp, Clause, Cmp,
                                    Neg, Nil, Num, Program, Record, Str, Var, Wild, agg_vars, aggs,
                                    refuse, subterms, vars_of_lits)
from dlverify.engine.translate import predicate_names
from dlverify.engine.typecheck import check_types
from dlverify.errors import DialectError


def _grounded_vars(lits, pre: set[str], aggregates_ground: bool = True) -> set[str]:
    """Soufflé's groundedness: positive atom arguments are grounded; a grounded record grounds its
    elements and a record whose elements are grounded is grounded; arithmetic is grounded when its
    operands are (never the reverse); `a = b` grounds either side from the other; an aggregate's
    result is grounded."""
    g = set(pre)

    def mark(t) -> None:
        if isinstance(t, Var):
            g.add(t.name)
        elif isinstance(t, Record):
            for x in t.items:
                mark(x)

    def grounded(t) -> bool:
        if isinstance(t, Var):
            return t.name in g
        if isinstance(t, Wild):
            return False
        if isinstance(t, Record):
            return all(grounded(x) for x in t.items)
        if isinstance(t, BinOp):
            return grounded(t.left) and grounded(t.right)
        if isinstance(t, Neg):
            return grounded(t.arg)
        if isinstance(t, Agg):
            return aggregates_ground
        return True  # constants, nil

    for lit in lits:
        if isinstance(lit, Atom) and not lit.negated:
            for a in lit.args:
                mark(a)
    eqs = [lit for lit in lits if isinstance(lit, Cmp) and lit.op == "="]
    changed = True
    while changed:
        before = len(g)
        for c in eqs:
            if grounded(c.left):
                mark(c.right)
            if grounded(c.right):
                mark(c.left)
        changed = len(g) != before
    return g


class _Checker:
    def __init__(self, prog: Program) -> None:
        self.prog = prog

    def run(self) -> None:
        p = self.prog
        for td in p.types.values():
            for fname, fty in td.fields:
                self.known_type(fty, td.file, td.line)
        for d in p.decls.values():
            for _, ty in d.columns:
                self.known_type(ty, d.file, d.line)
        for kind, io in (("input", p.inputs), ("output", p.outputs)):
            for name, (file, line) in io.items():
                if name not in p.decls:
                    raise DialectError(f".{kind} of undeclared relation {name}", file, line)
        self.name_clashes()
        predicate_names(p)  # collisions in the clingo translation
        for c in p.clauses:
            self.clause(c)
        components = self.stratify()
        empty = {name for name in p.decls if name not in p.inputs} - {c.head.rel for c in p.clauses}
        for c in p.clauses:
            # Soufflé drops a rule over a relation without rules, facts or .input before it
            # checks plans (it only warns "No rules/facts defined"), so its plan is not checked
            dead = any(isinstance(lit, Atom) and not lit.negated and lit.rel in empty for lit in c.body)
            if c.plans and not dead:
                self.plans(c, components)

    def known_type(self, ty: str, file: str, line: int) -> None:
        if ty in PRIMITIVE_TYPES or ty in self.prog.types:
            return
        if ty in ("float", "unsigned"):
            raise refuse(f"the type {ty}", file, line)
        raise DialectError(f"unknown type {ty}", file, line)

    # ------------------------------------------------------------ clauses
    def atom(self, a: Atom, file: str) -> None:
        d = self.prog.decls.get(a.rel)
        if d is None:
            raise DialectError(f"relation {a.rel} is not declared", file, a.line)
        if len(a.args) != len(d.columns):
            raise DialectError(f"{a.rel} has arity {len(d.columns)} but is used with {len(a.args)} "
                               "argument(s)", file, a.line)
        for arg, (_, ty) in zip(a.args, d.columns):
            self.const_type(arg, ty, a, file)

    def const_type(self, t, ty: str, a: Atom, file: str) -> None:
        """Type-check the constants of an atom argument against its declared column type."""
        kind = self.prog.kind(ty)
        bad = None
        if isinstance(t, (Num, Neg, BinOp)) and kind != "number":
            bad = "a number"
        elif isinstance(t, Str) and kind != "symbol":
            bad = "a string"
        elif isinstance(t, Nil) and kind != "record":
            bad = "nil"
        elif isinstance(t, Record):
            if kind != "record":
                bad = "a record"
            else:
                fields = self.prog.types[ty].fields
                if len(fields) != len(t.items):
                    raise DialectError(f"record of {len(t.items)} element(s) where {ty} has {len(fields)} "
                                       f"field(s) (in {a.rel})", file, t.line)
                for x, (_, fty) in zip(t.items, fields):
                    self.const_type(x, fty, a, file)
        if bad:
            raise DialectError(f"{bad} where {a.rel} expects type {ty}", file, t.line)

    def term(self, t, file: str, in_atom: bool, in_agg: Agg | None) -> None:
        """Placement rules for wildcards, aggregates and integer range."""
        if isinstance(t, Num):
            if not INT_MIN <= t.value <= INT_MAX:
                raise DialectError(f"integer literal {t.value} is outside the 32-bit range "
                                   "[-2^31, 2^31)", file, t.line)
        elif isinstance(t, Wild):
            if not in_atom:
                raise DialectError("`_` is only allowed as an atom argument", file, t.line)
        elif isinstance(t, Agg):
            raise refuse("an aggregate other than as `x = <aggregate>`", file, t.line)
        elif isinstance(t, Record):
            for x in t.items:
                self.term(x, file, in_atom, in_agg)
        elif isinstance(t, BinOp):
            self.term(t.left, file, False, in_agg)
            self.term(t.right, file, False, in_agg)
        elif isinstance(t, Neg):
            self.term(t.arg, file, False, in_agg)

    def literals(self, lits, file: str, in_agg: Agg | None) -> None:
        for lit in lits:
            if isinstance(lit, Atom):
                self.atom(lit, file)
                for x in lit.args:
                    self.term(x, file, True, in_agg)
                if in_agg is not None:
                    wild = any(isinstance(s, Wild) for x in lit.args for s in subterms(x))
                    if wild and lit.negated:
                        raise refuse("`_` in a negated atom inside an aggregate", file, lit.line)
                    if wild and in_agg.kind == "sum":
                        raise refuse("`_` inside a sum aggregate (Soufflé sums over tuples or over "
                                      "variable bindings depending on its materialisation: name the "
                                      "variable)", file, lit.line)
                    several = sum(isinstance(x, Atom) and not x.negated for x in in_agg.body) > 1
                    if wild and in_agg.kind == "count" and several:
                        raise refuse("`_` inside a count over several atoms (Soufflé counts the tuples "
                                      "of one atom but only the named variables of several: name the "
                                      "variable)", file, lit.line)
            else:
                agg_side = [s for s in (lit.left, lit.right) if isinstance(s, Agg)]
                if agg_side:
                    if in_agg is not None:
                        raise refuse("a nested aggregate", file, lit.line)
                    other = lit.right if isinstance(lit.left, Agg) else lit.left
                    if lit.op != "=" or len(agg_side) != 1 or not isinstance(other, Var):
                        raise refuse("an aggregate other than as `x = <aggregate>`", file, lit.line)
                    agg = agg_side[0]
                    if agg.target is not None:
                        self.term(agg.target, file, False, agg)
                    self.literals(agg.body, file, agg)
                else:
                    self.term(lit.left, file, False, in_agg)
                    self.term(lit.right, file, False, in_agg)

    def clause(self, c: Clause) -> None:
        f = c.file
        self.atom(c.head, f)
        for x in c.head.args:
            for s in subterms(x):
                if isinstance(s, Wild):
                    raise DialectError("`_` in a head atom", f, s.line)
                if isinstance(s, Agg):
                    raise refuse("an aggregate in a head atom", f, s.line)
            self.term(x, f, False, None)
        if not c.body:
            for x in c.head.args:
                for s in subterms(x):
                    if isinstance(s, Var):
                        raise DialectError(f"variable {s.name} in a fact", f, s.line)
            return
        self.literals(c.body, f, None)
        self.grounding(c)
        check_types(self.prog, c)

    def grounding(self, c: Clause) -> None:
        f = c.file
        clause_aggs = list(aggs(c.body))
        outer_vars = list(vars_of_lits([c.head])) + list(vars_of_lits(c.body))
        outer_names = {v.name for v in outer_vars}
        g = _grounded_vars(c.body, set())
        for v in outer_vars:
            if v.name not in g:
                raise DialectError(f"variable {v.name} is not grounded (it must occur in a positive body "
                                   "atom, or be bound with `=` to a grounded term; aggregate witnesses "
                                   "are not in the subset)", f, v.line)
        g0 = _grounded_vars(c.body, set(), aggregates_ground=False)
        seen_in: dict[str, Agg] = {}
        for agg in clause_aggs:
            result = None
            for lit in c.body:
                if isinstance(lit, Cmp) and agg in (lit.left, lit.right):
                    result = lit.right if lit.left is agg else lit.left
            names = {v.name for v in agg_vars(agg)}
            if result is not None and result.name in names and result.name not in g0:
                raise DialectError(f"the result variable {result.name} of the aggregate occurs inside it "
                                   "but is not grounded elsewhere", f, agg.line)
            for v in agg_vars(agg):
                if v.name in outer_names and v.name not in g0:
                    raise DialectError(f"variable {v.name} used inside an aggregate must be grounded "
                                       "outside aggregates", f, v.line)
            for n in names - outer_names:
                if n in seen_in and seen_in[n] is not agg:
                    raise refuse(f"variable {n} shared by two aggregates but used nowhere else", f, agg.line)
                seen_in[n] = agg
            injected = names & outer_names
            gi = _grounded_vars(agg.body, injected)
            for v in agg_vars(agg):
                if v.name not in gi:
                    raise DialectError(f"variable {v.name} is not grounded inside the aggregate", f, v.line)
            agg.locals = sorted(names - outer_names)

    # ------------------------------------------------------------ names
    def name_clashes(self) -> None:
        """Soufflé keeps types and relations in one namespace (`Name clash on relation R`)."""
        for name, d in self.prog.decls.items():
            if name in self.prog.types or name in PRIMITIVE_TYPES:
                where = self.prog.types[name] if name in self.prog.types else None
                first = f" (the type is declared at {where.file}:{where.line})" if where else ""
                raise DialectError(f"relation {name} has the name of a type{first}: Soufflé "
                                   "rejects this name clash", d.file, d.line)

    # ------------------------------------------------------------ stratification
    def stratify(self) -> dict[str, int]:
        """Relation -> index of its strongly connected component in the dependency graph;
        refuses negation or aggregation inside a component."""
        deps = nx.DiGraph()
        deps.add_nodes_from(self.prog.decls)
        neg: list[tuple[str, str, Clause]] = []
        for c in self.prog.clauses:
            h = c.head.rel
            for lit in c.body:
                if isinstance(lit, Atom):
                    deps.add_edge(h, lit.rel)
                    if lit.negated:
                        neg.append((h, lit.rel, c))
            for agg in aggs(c.body):
                for lit in agg.body:
                    if isinstance(lit, Atom):
                        deps.add_edge(h, lit.rel)
                        neg.append((h, lit.rel, c))
        comp = {rel: i for i, members in enumerate(nx.strongly_connected_components(deps)) for rel in members}
        for h, b, c in neg:
            if comp[h] == comp[b]:
                raise DialectError(f"the program is not stratified: {h} depends through negation or an "
                                   f"aggregate on {b}, which depends on {h}", c.file, c.line)
        return comp

    # ------------------------------------------------------------ plans
    def plans(self, c: Clause, comp: dict[str, int]) -> None:
        """Soufflé's rules for `.plan`: only on a recursive rule; one version per positive body
        atom of the head's component (numbered from 0); each order a permutation of the
        positive body atoms (numbered from 1, aggregates and negations not counted)."""
        atoms = [lit for lit in c.body if isinstance(lit, Atom) and not lit.negated]
        recursive = sum(comp[a.rel] == comp[c.head.rel] for a in atoms)
        for plan in c.plans:
            if not recursive:
                raise DialectError("a `.plan` on a non-recursive rule (Soufflé ignores it and reports "
                                   "an error)", c.file, plan.line)
            if not 0 <= plan.version < recursive:
                raise DialectError(f"`.plan` version {plan.version}: this rule has {recursive} recursive "
                                   f"atom(s), so only versions 0..{recursive - 1} exist", c.file, plan.line)
            if len(plan.order) != len(atoms):
                raise DialectError(f"`.plan` order of {len(plan.order)} atom(s) for a rule with "
                                   f"{len(atoms)} positive body atom(s)", c.file, plan.line)
            if sorted(plan.order) != list(range(1, len(atoms) + 1)):
                raise DialectError(f"`.plan` order {plan.order} is not a permutation of "
                                   f"1..{len(atoms)}", c.file, plan.line)


def check_program(program: Program) -> None:
    """Raise DialectError for the first construct Soufflé would reject (or the subset refuses)."""
    _Checker(program).run()
