"""Evaluate bug patterns on a program pair after its verification: export the
searched region of the distributed graph and each pattern's DFA as facts, run
datalog/patterns.dl (the product of the automata with the graph), and pair the
accepting paths it derives into matches (pattern, start op, end op).

The region is the ancestors of the failing outputs: a bug on no path to a failing
output explains nothing. The Datalog program carries no start op along a path
(that would be quadratic in the graph); the start reported for a match's end is the
earliest op (in program order) that begins an accepting path to it, found here by
one pass over the derived steps in program order.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

from dlverify import schema as S
from dlverify.engine import run_program
from dlverify.ir import Op
from dlverify.patterns.alphabet import op_labels
from dlverify.patterns.spec import Pattern
from dlverify.problem import Problem
from dlverify.verdict import PatternMatch, ViewFact

OUTPUTS = (S.PATTERN_FIRST, S.PATTERN_STEP, S.PATTERN_ACCEPT)


def patterns_path() -> Path:
    """The installed datalog/patterns.dl."""
    return Path(str(resources.files("dlverify.datalog").joinpath("patterns.dl")))


def region(problem: Problem, outputs: Iterable[int]) -> list[Op]:
    """The distributed ops the given output tensors depend on, in program order."""
    prod = problem.dist.producer()
    seen: set[int] = set()
    todo = [t for t in outputs if t in prod]
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        todo += [i for i in prod[t].inputs if i in prod and i not in seen]
    return [op for op in problem.dist.ops if op.output in seen]


def failing_outputs(problem: Problem, output_ok: set[tuple]) -> list[int]:
    """The distributed outputs not proved on some rank (`Output_Ok` rows (s, d, r))."""
    ranks = range(problem.mesh.size)
    return [d for s, d in zip(problem.seq.outputs, problem.dist.outputs)
            if any((s, d, r) not in output_ok for r in ranks)]


def pattern_facts(patterns: Sequence[Pattern]) -> dict[S.Relation, list[tuple]]:
    """Each pattern's DFA and the label tests of its letters."""
    letters: dict[str, tuple] = {}
    facts: dict[S.Relation, list[tuple]] = defaultdict(list)
    for p in patterns:
        facts[S.PATTERN_START].append((p.name, p.start))
        facts[S.PATTERN_FINAL] += [(p.name, q) for q in p.finals]
        facts[S.PATTERN_MOVE] += [(p.name, t.source, t.letter, t.target) for t in p.transitions]
        letters.update(p.letters)
    for letter, tests in letters.items():
        facts[S.PATTERN_LETTER].append((letter,))
        for t in tests:
            facts[S.LETTER_LACKS if t.negated else S.LETTER_HAS].append((letter, t.label))
    return facts


def graph_facts(problem: Problem, views: list[ViewFact], ops: list[Op]) -> dict[S.Relation, list[tuple]]:
    """The searched ops, their def-use edges inside the region and their labels."""
    producer = {op.output: op.id for op in ops}
    facts: dict[S.Relation, list[tuple]] = {
        S.PATGRAPH_OP: [(op.id,) for op in ops],
        S.PATGRAPH_EDGE: sorted({(producer[i], op.id) for op in ops for i in op.inputs
                                 if i in producer}),
        S.PATGRAPH_LABEL: [(lo.op.id, label) for lo in op_labels(problem, views, ops)
                           for label in sorted(lo.labels)],
    }
    return facts


def run_patterns(patterns: Sequence[Pattern], problem: Problem, views: list[ViewFact],
                 ops: list[Op], engine: str = "clingo") -> list[PatternMatch]:
    """The matches of `patterns` on `ops` (a region of the distributed graph)."""
    if not patterns or not ops:
        return []
    facts = graph_facts(problem, views, ops) | pattern_facts(patterns)
    for rel in S.PATTERN_RELATIONS:
        if rel.role == "input":
            facts.setdefault(rel, [])
    res = run_program(patterns_path(), facts, OUTPUTS, engine=engine)  # type: ignore[arg-type]
    return pair_matches(patterns, ops, res.relations)


def pair_matches(patterns: Sequence[Pattern], ops: list[Op],
                 rows: dict[str, list[tuple]]) -> list[PatternMatch]:
    """One match per (pattern, end op): the earliest op that begins an accepting path to it.
    The steps go from an op to a later one, so one pass in program order settles each
    product state before it is propagated."""
    order = {op.id: i for i, op in enumerate(ops)}
    by_id = {op.id: op for op in ops}
    earliest: dict[tuple, int] = {}
    for p, o, q in rows[S.PATTERN_FIRST.name]:
        key = (p, o, q)
        if key not in earliest or order[o] < order[earliest[key]]:
            earliest[key] = o
    for p, o, q, o2, q2 in sorted(rows[S.PATTERN_STEP.name], key=lambda r: order[r[1]]):
        start = earliest.get((p, o, q))
        if start is None:
            continue
        key = (p, o2, q2)
        if key not in earliest or order[start] < order[earliest[key]]:
            earliest[key] = start
    by_name = {p.name: p for p in patterns}
    ends: dict[tuple[str, int], int] = {}
    for p, o, q in rows[S.PATTERN_ACCEPT.name]:
        start = earliest.get((p, o, q))
        if start is not None and ((p, o) not in ends or order[start] < order[ends[(p, o)]]):
            ends[(p, o)] = start
    matches: dict[PatternMatch, None] = {}  # ends at the same line read the same: said once
    for (name, end), start in sorted(ends.items(), key=lambda kv: (order[kv[0][1]], kv[0][0])):
        pat, a, b = by_name[name], by_id[start], by_id[end]
        matches[PatternMatch(name, pat.explanation, pat.advice, a.kind, a.loc.file, a.loc.line,
                             b.kind, b.loc.file, b.loc.line, pat.file)] = None
    return list(matches)


def explain_failure(problem: Problem, views: list[ViewFact], output_ok: set[tuple],
                    patterns: Sequence[Pattern], engine: str = "auto",
                    timings: dict[str, float] | None = None) -> list[PatternMatch]:
    """The matches of `patterns` on the ancestors of the failing outputs. Engine
    `auto` unless clingo is asked for: Soufflé only when its compiled binary of
    patterns.dl is cached (the program is small: compiling it costs more than any run)."""
    t0 = time.perf_counter()
    ops = region(problem, failing_outputs(problem, output_ok))
    matches = run_patterns(patterns, problem, views, ops, "clingo" if engine == "clingo" else "auto")
    if timings is not None:
        timings["patterns"] = time.perf_counter() - t0
    return matches
