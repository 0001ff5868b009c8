"""Which rule derived which tuple: the final model, with each rule's body evaluated once more.

Every rule `H(x) :- B.` gets a twin `Dlv_Fired_i(x, p...) :- B.` whose head is a fresh
relation. The twins read the same relations as the rules and nothing reads the twins, so
the model of the program is unchanged and `Dlv_Fired_i` holds exactly the head tuples
whose body holds in the final model: the tuples rule i derives (alone or with other
rules). With `premises`, the twin of a rule deriving one of those relations also records
the tuples of its positive body atoms over those relations (wildcards named; every rule and
every positive atom outside aggregates when `premises` is None): the one-step derivations,
so that a wrong conclusion can be told from a wrong premise.

This runs on the embedded clingo only (the translation of the engine, with the twins
shown), as one fixpoint: no segments.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dlverify import schema as S
from dlverify.engine import clingo_runner
from dlverify.engine.facts_io import sort_rows, validate_rows
from dlverify.engine.syntax import Atom, Clause, Decl, Program, Record, Var, Wild
from dlverify.engine.translate import translate
from dlverify.rules.ruleset import RuleRef, RuleSet, rule_ref

FIRED = "Dlv_Fired_"


@dataclass(frozen=True)
class Firing:
    """A head tuple rule `rule` derives, with the premise tuples its body used."""

    head: tuple
    premises: tuple[tuple[str, tuple], ...] = ()  # (relation, row) of each recorded body atom


@dataclass
class TracedModel:
    """The output relations of a run and, per rule, the tuples it derives."""

    relations: dict[str, list[tuple]]
    firings: dict[RuleRef, list[Firing]] = field(default_factory=dict)
    facts: dict[str, int] = field(default_factory=dict)  # head relation -> tuples stated as facts
    seconds: float = 0.0

    def derived(self, rule: RuleRef) -> set[tuple]:
        return {f.head for f in self.firings.get(rule, [])}


def _named(t, counter: list[int]):
    """`t` with every wildcard replaced by a fresh variable (for recording a premise)."""
    if isinstance(t, Wild):
        counter[0] += 1
        return Var(f"dlv_w{counter[0]}", t.line)
    if isinstance(t, Record):
        return Record([_named(x, counter) for x in t.items], t.line)
    return t


def _recorded(lit, premises: frozenset[str] | None) -> bool:
    return isinstance(lit, Atom) and not lit.negated and (premises is None or lit.rel in premises)


def instrument(program: Program, heads: set[str] | None, premises: frozenset[str] | None = frozenset()
               ) -> tuple[Program, dict[str, RuleRef], dict[str, int]]:
    """A copy of `program` with a twin per rule whose head is in `heads` (all when None), recording the body atoms over `premises` (every
    positive atom outside aggregates when None). Returns the copy, twin relation -> rule,
    and twin relation -> number of head columns."""
    prog = copy.copy(program)
    prog.decls = dict(program.decls)
    prog.clauses = list(program.clauses)
    twins: dict[str, RuleRef] = {}
    head_width: dict[str, int] = {}
    for i, c in enumerate(program.clauses):
        if not c.body or (heads is not None and c.head.rel not in heads):
            continue
        name = f"{FIRED}{i}"
        columns = list(program.decls[c.head.rel].columns)
        args = list(c.head.args)
        body = list(c.body)
        if premises is None or c.head.rel in premises:
            counter = [0]
            for k, lit in enumerate(body):
                if _recorded(lit, premises):
                    named = Atom(lit.rel, [_named(a, counter) for a in lit.args], lit.line)
                    body[k] = named
                    args += named.args
                    columns += list(program.decls[lit.rel].columns)
        cols = tuple((f"c{j}", ty) for j, (_, ty) in enumerate(columns))
        prog.decls[name] = Decl(name, cols, c.file, c.line)
        prog.clauses.append(Clause(Atom(name, args, c.head.line), body, c.file, c.line))
        twins[name] = rule_ref(i, c)
        head_width[name] = len(c.head.args)
    return prog, twins, head_width


def _split(row: tuple, width: int, atoms: list[tuple[str, int]]) -> Firing:
    head, rest, out = row[:width], row[width:], []
    for rel, w in atoms:
        out.append((rel, rest[:w]))
        rest = rest[w:]
    return Firing(head, tuple(out))


def traced_run(rules: RuleSet, tables: Mapping[S.Relation, Sequence[tuple]],
               heads: set[str] | None = None, premises: frozenset[str] | None = frozenset(),
               timeout: float | None = None) -> TracedModel:
    """Evaluate the rule set on `tables` with clingo;
    every output relation and every traced rule's derived tuples (see the module doc)."""
    start = time.perf_counter()
    program = rules.program
    prog, twins, head_width = instrument(program, heads, premises)
    flat = {rel.name: validate_rows(rel.name, program.column_kinds(rel.name), rows)
            for rel, rows in tables.items()}
    shown = [r.name for r in S.OUTPUTS] + list(twins)
    tr = translate(prog, shown=shown)
    rows = clingo_runner.run_clingo(prog, flat, shown, tr, timeout=timeout)
    model = TracedModel({r.name: sort_rows(rows[r.name]) for r in S.OUTPUTS})
    for name, rule in twins.items():
        clause = program.clauses[rule.index]
        atoms = [(lit.rel, len(lit.args)) for lit in clause.body if _recorded(lit, premises)] \
            if premises is None or clause.head.rel in premises else []
        model.firings[rule] = [_split(r, head_width[name], atoms) for r in rows[name]]
    for c in program.clauses:
        if not c.body:
            model.facts[c.head.rel] = model.facts.get(c.head.rel, 0) + 1
    model.seconds = time.perf_counter() - start
    return model
