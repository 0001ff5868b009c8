"""`dlverify rules check`: fuzz the View rules of a rule set numerically.

Each trial builds a random tiny program pair (dlverify/rules/gen.py), runs the rule set on
it with every View rule traced (dlverify/rules/provenance.py: the head tuples each rule
derives and the premises its body used), runs both programs on random inputs with
the shared interpreter and checks every derived view: a view without a partial tag must
equal scale x the sequential block; the partial terms of one family held by ranks whose
ranges tile the family must sum to it. A rule is unsound when it derives a wrong view
from premises that are all derivable without any wrong view: the first such firing is its
counterexample. (A wrong premise of another relation, e.g. a helper of the rule, is blamed
on the View rule that uses it.) Deterministic for a seed; bounded by a trial count and a time.
"""
from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from dlverify.errors import InputError
from dlverify.numeric import Run, reduced_size, run_both, view_error
from dlverify.ops.semantics import NotExecutable
from dlverify.problem import Problem
from dlverify.rules.gen import Generator
from dlverify.rules.provenance import TracedModel, traced_run
from dlverify.rules.ruleset import RuleRef, RuleSet
from dlverify.verdict import ViewFact, parse_views, scale_value

VIEW = "View"
NUMERIC_SEEDS = (0, 1)
TOLERANCE = 1e-9  # relative to max(1, |value|): the interpreter runs in float64


@dataclass(frozen=True)
class WrongView:
    """A derived view that random data refutes."""

    view: ViewFact
    error: float
    how: str  # "block" (the view itself) or "partial sum over ranks r..."


@dataclass
class Counterexample:
    rule: RuleRef
    trial: int
    seed: int
    program: str
    wrong: WrongView
    premises: list[ViewFact]


@dataclass
class CheckReport:
    rules: RuleSet
    view_rules: list[RuleRef]
    trials: int = 0
    refused: int = 0  # programs the export refused (InputError) or the interpreter cannot run
    fired: dict[RuleRef, int] = field(default_factory=dict)  # firings over all trials
    unsound: dict[RuleRef, Counterexample] = field(default_factory=dict)
    wrong_views: int = 0
    checked_views: int = 0
    seconds: float = 0.0

    @property
    def sound(self) -> bool:
        return not self.unsound


def _block(x: np.ndarray, offsets: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    return x[tuple(slice(max(o, 0), max(o, 0) + n) for o, n in zip(offsets, shape))]


def _finite(run: Run, v: ViewFact) -> bool:
    return bool(np.all(np.isfinite(np.asarray(run.dist[v.dist][v.rank], dtype=np.float64)))) and \
        bool(np.all(np.isfinite(np.asarray(run.seq[v.seq][0], dtype=np.float64))))


def numeric_runs(problem: Problem, seeds: tuple[int, ...] = NUMERIC_SEEDS) -> list[Run]:
    """Both programs on random inputs, once per seed (raises NotExecutable)."""
    return [run_both(problem, seed) for seed in seeds]


def wrong_views(problem: Problem, views: list[ViewFact], runs: list[Run]) -> list[WrongView]:
    """The views (and members of tiling partial families) that the runs refute."""
    out: dict[ViewFact, WrongView] = {}
    for run in runs:
        for v in views:
            if v.partial is not None or v in out or not _finite(run, v):
                continue
            d = np.asarray(run.dist[v.dist][v.rank], dtype=np.float64)
            if d.shape != _block(run.seq[v.seq][0], v.offsets, d.shape).shape:
                out[v] = WrongView(v, float("inf"), "block: shape outside the sequential tensor")
                continue
            err = view_error(run, problem, v)
            if err > TOLERANCE * max(1.0, float(np.max(np.abs(d))) if d.size else 1.0):
                out[v] = WrongView(v, err, "block")
        for members, err in _partial_groups(run, problem, views):
            for v in members:
                out.setdefault(v, WrongView(v, err, "partial sum over ranks "
                                            + ",".join(str(m.rank) for m in members)))
    return list(out.values())


def _partial_groups(run: Run, problem: Problem, views: list[ViewFact]) -> list[tuple[list[ViewFact], float]]:
    """Like numeric.partial_sum_errors, but failing families with their member views."""
    groups: dict[tuple, dict[tuple[int, int], ViewFact]] = defaultdict(dict)
    for v in views:
        if v.partial is None or v.partial.reducer != 0:
            continue
        key = (v.seq, v.dist, v.offsets, v.scale, v.partial.op, v.partial.axis)
        groups[key].setdefault((v.partial.lo, v.partial.hi), v)
    out = []
    for (s_id, d_id, offsets, scale, op_id, axis), ranges in groups.items():
        pos, members = 0, []
        while (lo_hi := next(((lo, hi) for lo, hi in ranges if lo == pos), None)) is not None:
            members.append(ranges[lo_hi])
            pos = lo_hi[1]
        try:
            full = reduced_size(problem, op_id, axis)
        except (KeyError, IndexError, ValueError, AttributeError):
            continue  # a tag naming nothing the interpreter knows: not checkable
        if pos != full or not all(_finite(run, m) for m in members):
            continue
        total = sum(np.asarray(run.dist[d_id][m.rank], dtype=np.float64) for m in members)
        want = float(scale_value(scale)) * _block(np.asarray(run.seq[s_id][0], dtype=np.float64),
                                                  offsets, np.shape(total))
        if want.shape != np.shape(total):
            continue
        err = float(np.max(np.abs(total - want))) if np.size(total) else 0.0
        if err > TOLERANCE * max(1.0, float(np.max(np.abs(want))) if want.size else 1.0):
            out.append((members, err))
    return out


def program_text(problem: Problem) -> str:
    """The pair as lines: inputs with their blocks, then each program's ops."""
    lines = [f"mesh {dict(zip(problem.mesh.axis_names, problem.mesh.axis_sizes))}"]
    for i, (s, d, rel) in enumerate(zip(problem.seq.inputs, problem.dist.inputs, problem.inputs)):
        lines.append(f"input {i}: seq t{s}{rel.seq_shape}, dist t{d}{rel.dist_shape}, block offsets "
                     f"per rank {list(rel.offsets)}")
    for g in (problem.seq, problem.dist):
        lines.append(f"{g.name}:")
        for op in g.ops:
            params = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in op.params.items()}
            shape = g.tensors[op.output].shape
            args = ", ".join(f"t{x}" for x in op.inputs)
            lines.append(f"  t{op.output}{shape} = {op.kind}({args}) {params if params else ''}".rstrip())
    return "\n".join(lines)


def view_text(v: ViewFact) -> str:
    tag = "" if v.partial is None else f", term {v.partial}"
    return f"View(seq t{v.seq}, dist t{v.dist}, rank {v.rank}, offsets {v.offsets}{tag}, scale {v.scale})"


@dataclass
class _Trial:
    """One random program, its facts and the numeric runs its views are checked against."""

    index: int
    problem: Problem
    tables: dict
    runs: list[Run]

    def wrong(self, rules: RuleSet) -> tuple[TracedModel, dict[tuple, WrongView]]:
        """The model with every one-step derivation of every rule, and its wrong View rows."""
        model = traced_run(rules, self.tables, heads=None, premises=None)
        rows = model.relations[VIEW]
        views = parse_views(rows)
        by_view = dict(zip(views, rows))
        return model, {by_view[w.view]: w for w in wrong_views(self.problem, views, self.runs)}


Key = tuple[str, tuple]  # (relation, row)


def clean_tuples(model: TracedModel, wrong: set[Key]) -> set[Key]:
    """The tuples derivable without ever using a wrong view: the least fixpoint of the
    recorded one-step derivations, starting from the tuples no rule derives (inputs and
    facts) and never passing through a wrong View tuple."""
    derived: set[Key] = {(r.head, f.head) for r, fs in model.firings.items() for f in fs}
    waiting: dict[Key, list[int]] = {}
    missing: list[int] = []
    heads: list[Key] = []
    for rule, firings in model.firings.items():
        for f in firings:
            need = {p for p in f.premises if p in derived}  # others are inputs or facts: clean
            heads.append((rule.head, f.head))
            missing.append(len(need))
            for p in need:
                waiting.setdefault(p, []).append(len(heads) - 1)
    clean: set[Key] = set()
    todo = [i for i, n in enumerate(missing) if n == 0]
    while todo:
        h = heads[todo.pop()]
        if h in clean or h in wrong:
            continue
        clean.add(h)
        for i in waiting.get(h, []):
            missing[i] -= 1
            if missing[i] == 0:
                todo.append(i)
    return clean


def _blame(model: TracedModel, wrong: dict[tuple, WrongView], report: CheckReport, trial: _Trial,
           seed: int) -> None:
    """A View rule is unsound when one of its firings derives a wrong view from premises that
    are all derivable without any wrong view (so rules downstream of the culprit, e.g. the
    assembler reading helper relations built from a wrong view, are not blamed). A wrong
    premise of another relation that no wrong view explains is blamed on the View rule."""
    for rule, firings in model.firings.items():
        if rule.head == VIEW:
            report.fired[rule] = report.fired.get(rule, 0) + len(firings)
    if not wrong:
        return
    clean = clean_tuples(model, {(VIEW, row) for row in wrong})
    derived = {(r.head, f.head) for r, fs in model.firings.items() for f in fs}
    for rule, firings in model.firings.items():
        if rule.head != VIEW or rule in report.unsound:
            continue
        culprit = next((f for f in firings if f.head in wrong
                        and all(p in clean or p not in derived for p in f.premises)), None)
        if culprit is not None:
            views = [row for rel, row in culprit.premises if rel == VIEW]
            report.unsound[rule] = Counterexample(rule, trial.index, seed, program_text(trial.problem),
                                                  wrong[culprit.head], parse_views(views))


def check_rules(rules: RuleSet, trials: int = 200, seconds: float | None = 60.0, seed: int = 0,
                max_steps: int = 6, first: bool = False) -> CheckReport:
    """Fuzz every View rule of `rules` over `trials` random programs (or until `seconds`;
    or, with `first`, until an unsound rule is found)."""
    from dlverify.api import problem_tables

    start = time.monotonic()
    view_rules = [r for r in rules.rules() if r.head == VIEW]
    report = CheckReport(rules, view_rules)
    gen = Generator(random.Random(seed))
    for trial in range(trials):
        if (seconds is not None and time.monotonic() - start > seconds) or (first and report.unsound):
            break
        problem = gen.program(trial, max_steps)
        report.trials += 1
        try:
            tables = problem_tables(problem)
        except InputError:
            report.refused += 1
            continue
        try:
            runs = numeric_runs(problem)
        except NotExecutable:
            report.refused += 1
            continue
        one = _Trial(trial, problem, tables, runs)
        model, wrong = one.wrong(rules)
        report.checked_views += len(model.relations[VIEW])
        report.wrong_views += len(wrong)
        _blame(model, wrong, report, one, seed)
    report.seconds = time.monotonic() - start
    return report
