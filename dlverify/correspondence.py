"""Localisation by correspondence: a distributed op that computes the wrong block
of a right value.

A wrong slice of a fused QKV product that stays inside one segment (the keys
read at the queries' columns) is still a valid block of a sequential value, so
the rules give it a view and the first op without one comes much later (the
product of queries with "keys" that are queries). When both programs carry
source locations, the op that went wrong can be found by its counterpart: the
sequential ops of the same kind written at the same source (the same chain of
user frames). A distributed op whose output has views, but none of its
counterparts' outputs, computes something its source line does not compute in
the sequential program. The earliest such op (in program order, before the
first op with no view at all, on the way to a failing output) is reported as a
diagnosis next to the failures; the verdict does not depend on it.

Frames are compared only in files both programs have frames in: an HLO module's
own instruction lines differ between the two files, the Python source they
were traced from does not.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from dlverify.ir import FoldedOp, Graph, Op
from dlverify.problem import Problem
from dlverify.verdict import Failure, ViewFact

KIND = "differs-from-counterpart"


def _files(g: Graph) -> set[str]:
    return {f.file for op in g.ops for f in op.loc.frames}


def _keys(op: Op | FoldedOp, shared: set[str]) -> list[tuple]:
    """The op's kind with its frames (in shared files) from the innermost outwards:
    the whole chain first, then ever shorter ones down to the innermost frame."""
    chain = tuple((f.file, f.line) for f in op.loc.frames if f.file in shared)
    return [(op.kind,) + chain[:j] for j in range(len(chain), 0, -1)]


def _squeeze_only(g: Graph, op: Op) -> bool:
    """op only inserts or removes size-1 dims (a broadcast, a reduction over size-1
    dims, a reshape or transpose keeping the other dims in order): it cannot misplace
    an element, and autodiff writes such ops where the other program has none (the
    transpose of a broadcast: a reduction over size-1 dims, then a broadcast
    reinserting them), so it is never the first op holding another value."""
    if not g.moves_no_element(op):
        return False
    big = [n for n in g.tensors[op.inputs[0]].shape if n > 1]
    return big == [n for n in g.tensors[op.output].shape if n > 1]


def counterpart_failure(problem: Problem, views: list[ViewFact], candidates: set[int],
                        before: int | None, describe: Callable[[int], str],
                        view_text: Callable[[ViewFact], str]) -> Failure | None:
    """The diagnosis for the earliest distributed op in `candidates` (op ids on the
    way to a failing output) placed before op id `before` (the first op with no
    view; None: anywhere), or None. `describe(seq_tensor)` names a sequential
    tensor, `view_text(view)` a view, for the message."""
    shared = _files(problem.seq) & _files(problem.dist)
    if not shared:
        return None
    counterparts: dict[tuple, set[int]] = defaultdict(set)
    for op in problem.seq.ops:
        for key in _keys(op, shared):
            counterparts[key].add(op.output)
    for f in problem.seq.folded:   # removed by a rewrite: the tensor holding its value
        for key in _keys(f, shared):
            counterparts[key].add(f.value)
    related: dict[int, set[int]] = defaultdict(set)
    first_view: dict[int, ViewFact] = {}
    for v in views:
        related[v.dist].add(v.seq)
        first_view.setdefault(v.dist, v)
    for op in problem.dist.ops:
        if op.id == before:
            return None
        if op.id not in candidates or not related.get(op.output) or _squeeze_only(problem.dist, op):
            continue
        # the sequential ops sharing the longest chain of frames (from the innermost):
        # the same code path, or at least the same line of a helper both programs call
        partners = next((counterparts[k] for k in _keys(op, shared) if k in counterparts), None)
        if not partners or related[op.output] & partners:
            continue
        want = sorted(partners)[0]
        shape = list(problem.seq.tensors[want].shape)
        return Failure(op.kind, op.loc.file, op.loc.line,
                       f"diagnosis: this {op.kind} holds {view_text(first_view[op.output])} (rank "
                       f"{first_view[op.output].rank}), but the sequential {op.kind} written at the "
                       f"same source computes another value, {shape} ({describe(want)}), which no "
                       "distributed value here equals: is a slice, index or offset wrong?",
                       "distributed", op.loc.frames, kind=KIND)
    return None
