"""Sums of several terms, re-associated: the sequential add trees (datalog/sum_trees.dl).

Programs add the same terms in different orders: Megatron's parallel residual
(GPT-NeoX, GPT-J, PaLM) computes x + attn + mlp sequentially as (x + (A + bo)) +
(M + bb), while the distributed block sums the partials first and adds the
biases after the collective, ((x + psum(A + M)) + bo) + bb. Addition is
associative and commutative over the reals, so both are the sum of the leaves
{x, A, bo, M, bb}; the rules, which pair one op with one op, never meet.

This module finds each *sum tree* of the sequential graph: a maximal tree of
adds whose inner adds are read by exactly one op, an add of the same tree (a
sum read elsewhere too is a leaf: its value is needed on its own, and trees
stay disjoint, so the facts are linear in the graph). Each node of a tree (a
leaf or an add) gets the bit mask of the leaf positions under it,
Sum_Part(root, node, mask, n); the rules then add up distributed values equal to
disjoint sets of leaves in any order (datalog/sum_trees.dl).

Only trees of MIN_LEAVES to MAX_LEAVES leaves whose nodes all have the root's
shape are listed (two leaves are one add: the ordinary rules pair it; the mask
is an integer of the engines).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from dlverify import schema as S
from dlverify.ir import Graph, Op

MIN_LEAVES, MAX_LEAVES = 3, 16


def _leaves(root: Op, producer: dict[int, Op], inner: set[int]) -> list[int] | None:
    """The leaves of root's tree left to right (an inner add is any add in `inner`), or
    None past MAX_LEAVES."""
    out: list[int] = []
    stack = list(reversed(root.inputs))
    while stack:
        t = stack.pop()
        p = producer.get(t)
        if p is not None and p.output in inner:
            stack.extend(reversed(p.inputs))
        else:
            out.append(t)
        if len(out) > MAX_LEAVES:
            return None
    return out


def sum_parts(g: Graph) -> list[tuple[int, int, int, int]]:
    """(root op, node tensor, mask of the leaf positions under it, number of those
    leaves) for every node of every sum tree of g."""
    uses: Counter = Counter(g.outputs)
    readers: dict[int, Op] = {}
    for op in g.ops:
        uses.update(op.inputs)
        for t in op.inputs:
            readers[t] = op
    adds = [op for op in g.ops if op.kind == "add" and len(op.inputs) == 2]
    add_out = {op.output for op in adds}
    # an inner add: read once, by an add, and no output (its leaves' shapes are checked per tree)
    inner = {op.output for op in adds if uses[op.output] == 1 and op.output not in g.outputs
             and readers.get(op.output) is not None and readers[op.output].output in add_out}
    producer = {op.output: op for op in adds}
    rows: list[tuple[int, int, int, int]] = []
    for root in adds:
        if root.output in inner:
            continue
        leaves = _leaves(root, producer, inner)
        if leaves is None or len(leaves) < MIN_LEAVES:
            continue
        shape = g.tensors[root.output].shape
        if any(g.tensors[t].shape != shape for t in leaves):
            continue
        pos = 0

        def mask_of(t: int) -> int:   # post-order: the leaves in the order _leaves lists them
            nonlocal pos
            p = producer.get(t)
            if p is not None and (t == root.output or t in inner):
                m = mask_of(p.inputs[0]) | mask_of(p.inputs[1])
            else:
                m, pos = 1 << pos, pos + 1
            rows.append((root.id, t, m, bin(m).count("1")))
            return m
        mask_of(root.output)
    return rows


def export_all(add: Callable[..., Any], seq: Graph) -> None:
    """Hook for dlverify.facts.export: the sequential graph's sum trees."""
    for row in sum_parts(seq):
        add(S.SUM_PART, *row)
