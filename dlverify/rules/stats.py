"""`dlverify rules stats`: how many tuples each rule derives, per model.

Targets are expanded as `dlverify zoo` expands them (manifests, case files, folders, globs,
HLO pairs and dump folders of a manifest). Each model is turned into facts by the same
pipeline as a verification (dlverify.api.problem_tables) and evaluated once with every rule
traced (dlverify/rules/provenance.py): a rule's count is the number of distinct head tuples
whose body holds in the final model. A tuple derived by several rules counts for each, so
counts per relation may add up to more than the relation's size; `only` counts the tuples
no other rule derives. Models run in this process, one after the other, on clingo, as one
fixpoint each (no segments), so a large model takes longer than its verification.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dlverify.errors import InputError
from dlverify.ir import IdAllocator
from dlverify.limits import OutOfTime
from dlverify.problem import Problem
from dlverify.rules.provenance import traced_run
from dlverify.rules.ruleset import RuleRef, RuleSet


@dataclass
class ModelStats:
    """One model's run: per rule, the tuples it derives and those only it derives."""

    name: str
    counts: dict[RuleRef, int] = field(default_factory=dict)
    only: dict[RuleRef, int] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""  # the model could not be run: one line (file:line: message)


@dataclass
class StatsReport:
    rules: RuleSet
    models: list[ModelStats] = field(default_factory=list)

    def total(self, rule: RuleRef) -> int:
        return sum(m.counts.get(rule, 0) for m in self.models)

    def rows(self) -> list[RuleRef]:
        """Every rule, most productive first (ties in file order)."""
        return sorted(self.rules.rules(), key=lambda r: (-self.total(r), r.file, r.line))

    def to_json(self) -> dict:
        ok = [m for m in self.models if not m.error]
        return {
            "rules_dir": str(self.rules.folder),
            "rules_hash": self.rules.digest,
            "models": [{"name": m.name, "seconds": round(m.seconds, 3), "error": m.error or None}
                       for m in self.models],
            "rules": [{"file": self.rules.name(r).rsplit(":", 1)[0], "line": r.line, "head": r.head,
                       "total": self.total(r),
                       "counts": {m.name: m.counts.get(r, 0) for m in ok},
                       "only": {m.name: m.only.get(r, 0) for m in ok}}
                      for r in self.rows()],
        }


def model_stats(rules: RuleSet, name: str, problem: Problem, timeout: float | None = None) -> ModelStats:
    from dlverify.api import problem_tables

    t0 = time.perf_counter()
    model = traced_run(rules, problem_tables(problem), timeout=timeout)
    out = ModelStats(name)
    derivers: dict[tuple[str, tuple], int] = {}
    sets = {rule: model.derived(rule) for rule in model.firings}
    for rule, heads in sets.items():
        out.counts[rule] = len(heads)
        for h in heads:
            key = (rule.head, h)
            derivers[key] = derivers.get(key, 0) + 1
    for rule, heads in sets.items():
        out.only[rule] = sum(1 for h in heads if derivers[(rule.head, h)] == 1)
    out.seconds = time.perf_counter() - t0
    return out


def problems_of(targets: list[str]) -> Iterator[tuple[str, Callable[[], list[tuple[str, Problem]]]]]:
    """(label, build) per zoo entry; build() returns the entry's named problems (several for
    a case file or a dump folder) and raises InputError for bad input."""
    from dlverify.zoo.items import CaseEntry, DumpEntry, HloEntry, entries_of

    for e in entries_of(targets):
        if isinstance(e, CaseEntry):
            yield str(e.path), (lambda e=e: _case_problems(e.path, e.name))
        elif isinstance(e, HloEntry):
            yield e.label, (lambda e=e: [(e.label, _hlo_problem(e))])
        elif isinstance(e, DumpEntry):
            yield str(e.path), (lambda e=e: _dump_problems(e.path, e.custom_calls))


def _case_problems(path: Path, name: str | None) -> list[tuple[str, Problem]]:
    from dlverify.api import jax_problem
    from dlverify.cases import build_case, load_cases

    out = []
    for case_name, fn in load_cases(path, name):
        c = build_case(path, case_name, fn)
        try:
            problem, _ = jax_problem(c.seq, c.dist, *c.args, name=case_name)
            if problem.scans and problem.unroll is not None:  # every iteration's rules counted
                problem = problem.unroll()
        except InputError as e:
            if not e.file:
                e.file = str(path)
            raise
        out.append((f"{path.stem}::{case_name}", problem))
    return out


def _hlo_problem(e) -> Problem:
    from dlverify.hlo_api import _registry, hlo_problem, relate_elided_constants
    from dlverify.spec import load_spec

    spec = load_spec(e.spec) if e.spec is not None else None
    problem = hlo_problem(e.seq, e.dist, spec, e.ranks, IdAllocator(), custom_calls=_registry(e.custom_calls))
    relate_elided_constants(problem)
    return problem


def _dump_problems(path: Path, custom_calls: Path | None) -> list[tuple[str, Problem]]:
    """The pairs verify_dump would verify (see dlverify/hlo_api.py)."""
    from dlverify.frontends.hlo import root_output_relations
    from dlverify.frontends.hlo.pairing import pair_modules
    from dlverify.hlo_api import _registry, dump_modules, read_hlo_module, relate_elided_constants

    registry = _registry(custom_calls)
    out = []
    for mod in dump_modules(path):
        if mod.after is None:
            continue
        dist_mod = read_hlo_module(mod.after)
        n = (dist_mod.num_partitions or 1) * (dist_mod.replica_count or 1)
        if n <= 1:
            continue
        seq_mod = read_hlo_module(mod.before)
        problem = pair_modules(seq_mod, dist_mod, IdAllocator(), ranks=n,
                               expected_outputs=root_output_relations(seq_mod, n),
                               custom_calls=registry, instruction_frames=True, name=mod.name)
        relate_elided_constants(problem)
        out.append((f"{path.name}/{mod.name}", problem))
    return out


def rule_stats(rules: RuleSet, targets: list[str], timeout: float | None = None,
               progress: Callable[[str], None] | None = None) -> StatsReport:
    """Run every model the targets name; a model that fails is recorded with its error."""
    report = StatsReport(rules)
    for label, build in problems_of(targets):
        try:
            problems = build()
        except InputError as e:
            report.models.append(ModelStats(label, error=str(e)))
            continue
        for name, problem in problems:
            if progress is not None:
                progress(name)
            try:
                report.models.append(model_stats(rules, name, problem, timeout))
            except InputError as e:
                report.models.append(ModelStats(name, error=str(e)))
            except OutOfTime as e:
                report.models.append(ModelStats(name, error=f"out of time: {e}"))
    return report
