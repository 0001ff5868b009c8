"""The alphabet of bug patterns: the labels a distributed op can carry.

An op's labels are its kind, its family and algebraic class (read from the op-kind
table, dlverify/ops/table.py, never listed here), a few combinations, and the view
class its output has after the verification run (from the derived `View` facts).
A letter of a pattern is a conjunction of label tests: `partial`,
`elementwise_nonlinear&unrelated`, `!reducing_collective`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from dlverify.ir import Op
from dlverify.ops.table import KINDS, Algebra, Family, kinds
from dlverify.problem import Problem
from dlverify.verdict import UNIT_SCALE, ViewFact

# The collectives that sum (or max/min) over ranks: the ones that complete a partial value.
REDUCING_COLLECTIVES = frozenset({"all_reduce", "reduce_scatter"})
assert REDUCING_COLLECTIVES <= kinds(Family.COLLECTIVE)


def _class_name(algebra: Algebra) -> str:
    return algebra.value.replace(" ", "_")


def _static_labels() -> dict[str, frozenset[str]]:
    """Each op kind's labels that do not depend on the run: kind, family, class, combinations."""
    out = {}
    for name, kind in KINDS.items():
        labels = {"any", name, kind.family.value}
        if kind.algebra is not Algebra.NONE:
            labels.add(_class_name(kind.algebra))
        if kind.family is Family.ELEMENTWISE:
            labels.add(f"elementwise_{_class_name(kind.algebra)}")
        if name in REDUCING_COLLECTIVES:
            labels.add("reducing_collective")
        out[name] = frozenset(labels)
    return out


KIND_LABELS = _static_labels()

# What an op's output is related to, on some rank, by the views derived.
VIEW_LABELS = {
    "partial": "only partial terms (of a sum, max or min) of a sequential value",
    "complete": "a whole block of a sequential value, unscaled",
    "replicated": "the whole sequential value, unscaled",
    "sharded": "a proper block of a sequential value, unscaled",
    "scaled": "only scaled copies (a constant factor other than 1) of sequential values",
    "unrelated": "nothing: no view was derived",
    "frontier": "nothing, although every operand is related to something there: where "
                "derivation stops (a failure's own op, not one downstream of it)",
}
GRAPH_LABELS = {
    "output": "the op produces an output of the distributed program",
    "output_scaled": "the op produces an output that holds only scaled copies (a factor other "
                     "than 1) of the sequential output it must equal, on some rank",
    "any": "every op",
}
ALPHABET: frozenset[str] = frozenset(set().union(*KIND_LABELS.values()) | set(VIEW_LABELS)
                                     | set(GRAPH_LABELS))


@dataclass(frozen=True)
class LabelledOp:
    """One op of the searched region with its labels."""

    op: Op
    labels: frozenset[str]


def rank_view_class(views: list[ViewFact], problem: Problem) -> str:
    """The view class of a distributed tensor on one rank (VIEW_LABELS)."""
    if not views:
        return "unrelated"
    whole = [v for v in views if v.partial is None]
    if not whole:
        return "partial"
    unit = [v for v in whole if v.scale == UNIT_SCALE]
    if not unit:
        return "scaled"
    for v in unit:
        seq_shape = problem.seq.tensors[v.seq].shape
        dist_shape = problem.dist.tensors[v.dist].shape
        if seq_shape == dist_shape and all(o <= 0 for o in v.offsets):
            return "replicated"
    return "sharded"


def _only_scaled(views: list[ViewFact]) -> bool:
    whole = [v for v in views if v.partial is None]
    return bool(whole) and all(v.scale != UNIT_SCALE for v in whole)


def op_labels(problem: Problem, views: list[ViewFact], ops: list[Op]) -> list[LabelledOp]:
    """The labels of `ops` (distributed): static ones, `output`, and the view classes
    their outputs have on some rank."""
    by_tensor: dict[tuple[int, int], list[ViewFact]] = defaultdict(list)
    for v in views:
        by_tensor[(v.dist, v.rank)].append(v)
    paired: dict[int, set[int]] = defaultdict(set)   # distributed output -> its sequential ones
    for s, d in zip(problem.seq.outputs, problem.dist.outputs):
        paired[d].add(s)
    ranks = range(problem.mesh.size)
    out = []
    for op in ops:
        labels = set(KIND_LABELS.get(op.kind, {"any", op.kind}))
        if op.output in paired:
            labels.add("output")
            if any(_only_scaled([v for v in by_tensor.get((op.output, r), []) if v.seq in
                                 paired[op.output]]) for r in ranks):
                labels.add("output_scaled")
        classes = {rank_view_class(by_tensor.get((op.output, r), []), problem) for r in ranks}
        labels |= classes
        if any(not by_tensor.get((op.output, r)) and op.inputs
               and all(by_tensor.get((i, r)) for i in op.inputs) for r in ranks):
            labels.add("frontier")
        if classes & {"replicated", "sharded"}:
            labels.add("complete")
        out.append(LabelledOp(op, frozenset(labels)))
    return out
