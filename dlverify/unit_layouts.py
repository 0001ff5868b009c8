"""Size-1 dims the distributed module never had, placed as the sequential program has
them: identities of the distributed graph, whose form is chosen by the other
program's (the normal form of dlverify/simplify.py sees one graph at a time).

A rank that holds one head of a dim the sequential program batches over (one KV
head per rank, replicated KV heads sliced out of the projection, a batch of one, a
decoding step of length 1) holds a block of size 1 there. The program as written keeps
that dim; XLA deletes it: it slices the rank's KV head straight out of the weight, so
its K and V never have the head dim, and the attention dots batch over the batch dim
alone, the query's head dim of one left free. Nothing in the distributed module says
where the dim was: a dot with a size-1 free dim in one operand is the same function
as the dot batching over it with a size-1 dim inserted into the other operand, and a
reshape that inserts size-1 dims is the same as a reshape to any order of them
followed by the transpose that moves them. Which form meets the sequential program
is read from that program:

* `lone_units_batched` (in the normal form's pass, distributed graph only): a dot
  with size-1 free dims in one operand and none in the other batches over the first
  k of them, a size-1 dim inserted into the other operand for each, when the
  sequential program has a dot with that many batch, free and contracted dims
  (its `dot_roles`) and none with the dot's own. The result differs by size-1 dims
  only and is reshaped back (simplify_forms._dot_then_unit_reshape). The datalog
  rules pair dots by their dimension numbers (datalog/contraction.dl), so a head
  dim batched on one side and absent on the other never met.
* `unit_layouts_as_sequential` (after the normal form, distributed graph only): the
  other way round, a dot's lone size-1 free dims deleted from their operand when that
  gives the dim counts of a sequential dot and its own are none's (the normal form
  takes a size-1 dim merged into a contraction out of it, simplify_merged.py, where the
  program merges the head dim into the output projection's contraction); and a
  chain of reshapes and transposes from x (a few ops) whose result is
  transpose(reshape(x, C), P) for a transpose P of a reshaped tensor of the sequential
  program (the program's [b, s, h*d] -> [b, s, h, d] -> [b, h, s, d]), or
  reshape(transpose(x, P)) for a reshape of a transposed one (the heads merged back),
  is written so, C read off the result (or x) and P, when it places every element
  alike (checked on the index array of x: data movement is fixed by where each
  element goes). The normal form writes a
  transpose that moves size-1 dims only as one reshape (simplify_layouts.py); on
  the sequential side the head dim is sized, the transpose stays, and the rules
  pair reshape with reshape (datalog/layout_algebra.dl) and transpose with
  transpose of the same permutation (datalog/layout.dl).

All rewrite the distributed graph by identities only; the sequential program only
chooses among equal forms, so a wrong choice costs a relation, never soundness.
tests/test_unit_layouts.py checks each numerically and where it must not fire.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from dlverify.ir import CHAIN_DEPTH, Graph, IdAllocator, Op
from dlverify.simplify_forms import _FormRules

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier

DotRoles = tuple[int, tuple[int, int], int]   # batch dims, free dims per operand (sorted), contracted


def _roles(params: dict, lrank: int, rrank: int) -> DotRoles:
    nb, nc = len(params["lhs_batch"]), len(params["lhs_contract"])
    return nb, tuple(sorted((lrank - nb - nc, rrank - nb - nc))), nc


def dot_roles(g: Graph) -> frozenset[DotRoles]:
    """How many batch, free (per operand, unordered) and contracted dims each dot of g has."""
    return frozenset(_roles(op.params, len(g.tensors[op.inputs[0]].shape),
                            len(g.tensors[op.inputs[1]].shape))
                     for op in g.ops if op.kind == "dot_general" and len(op.inputs) == 2)


def _lone_units(p: dict, shapes: list[tuple[int, ...]]) -> list[list[int]]:
    """Each operand's size-1 free dims, when one operand has some and the other none
    (else two empty lists)."""
    units = [[d for d, n in enumerate(shape) if n == 1
              and d not in p[f"{key}_batch"] and d not in p[f"{key}_contract"]]
             for shape, key in zip(shapes, ("lhs", "rhs"))]
    return units if bool(units[0]) != bool(units[1]) else [[], []]


def lone_units_batched(s: "_Simplifier", op: Op) -> bool:
    """See the module docstring; `s.partner_dots` is the sequential program's
    dot_roles (None: the rule is off, as on the sequential graph)."""
    partner = getattr(s, "partner_dots", None)
    if not partner or op.kind != "dot_general" or len(op.inputs) != 2:
        return False
    p = op.params
    ranks = [len(s.shape(t)) for t in op.inputs]
    units = _lone_units(p, [s.shape(t) for t in op.inputs])
    if not any(units) or _roles(p, *ranks) in partner:
        return False
    side = 0 if units[0] else 1
    key, okey = ("lhs", "rhs")[side], ("lhs", "rhs")[1 - side]
    for k in range(1, len(units[side]) + 1):
        grown = list(ranks)
        grown[1 - side] += k
        q = dict(p)
        q[f"{key}_batch"] = tuple(p[f"{key}_batch"]) + tuple(units[side][:k])
        # the other operand's k new size-1 dims go right after its batch dims
        at = max(p[f"{okey}_batch"], default=-1) + 1
        q[f"{okey}_batch"] = tuple(d + k * (d >= at) for d in p[f"{okey}_batch"]) + \
            tuple(range(at, at + k))
        q[f"{okey}_contract"] = tuple(d + k * (d >= at) for d in p[f"{okey}_contract"])
        if _roles(q, *grown) not in partner:
            continue
        other = op.inputs[1 - side]
        oshape = s.shape(other)
        ins = list(op.inputs)
        ins[1 - side] = s.new_op("reshape", [other], oshape[:at] + (1,) * k + oshape[at:],
                                 s.g.tensors[other].dtype, {}, op)
        return s._dot_then_unit_reshape(op, ins, q)
    return False


def _inverse_permuted(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """C with transpose(C, perm) of shape `shape`: C[perm[j]] = shape[j]."""
    out = [0] * len(perm)
    for j, d in enumerate(perm):
        out[d] = shape[j]
    return tuple(out)


class _Target(NamedTuple):
    """A sequential layout pair: `first` ("reshape" or "transpose") then the other op;
    the transpose's permutation, the shape between the two, and the ranks of the
    pair's operand and result."""

    first: str
    perm: tuple[int, ...]
    mid: tuple[int, ...]
    start_rank: int
    end_rank: int


class _UnitLayouts(_FormRules):
    """unit_layouts_as_sequential's pass over the distributed graph."""

    def __init__(self, graph: Graph, ids: IdAllocator, seq: Graph) -> None:
        super().__init__(graph, ids)
        self.partner_dots = dot_roles(seq)
        producer = seq.producer()
        self.targets: list[_Target] = []       # in program order, each once
        for op in seq.ops:
            under = producer.get(op.inputs[0]) if op.inputs else None
            if under is None or {op.kind, under.kind} != {"reshape", "transpose"}:
                continue
            perm = op if op.kind == "transpose" else under
            target = _Target(under.kind, tuple(perm.params["permutation"]),
                             seq.tensors[under.output].shape,
                             len(seq.tensors[under.inputs[0]].shape), len(seq.tensors[op.output].shape))
            if target not in self.targets:
                self.targets.append(target)

    def bases(self, op: Op):
        """(y, the ops from y's reader to op) for each tensor y that op's chain of
        reshapes and transposes (at most CHAIN_DEPTH of them) starts from, nearest first."""
        ops = [op]
        while len(ops) <= CHAIN_DEPTH:
            yield ops[-1].inputs[0], ops[::-1]
            under = self.producer.get(ops[-1].inputs[0])
            if under is None or under.kind not in ("reshape", "transpose"):
                return
            ops.append(under)

    def _moved(self, y: int, ops: list[Op]) -> np.ndarray:
        """The index array of y moved by `ops` (reshapes and transposes, in order)."""
        ys = self.shape(y)
        moved = np.arange(int(np.prod(ys, dtype=np.int64))).reshape(ys)
        for o in ops:
            moved = np.transpose(moved, o.params["permutation"]) if o.kind == "transpose" \
                else moved.reshape(self.shape(o.output))
        return moved

    def _form(self, ys: tuple[int, ...], out: tuple[int, ...], t: _Target) -> tuple[int, ...] | None:
        """The shape between the two ops when a tensor of shape ys goes to `out` in t's
        form, its blocks fitting t's (each dim dividing t's), else None."""
        if t.start_rank != len(ys) or t.end_rank != len(out) or len(t.perm) != len(
                out if t.first == "reshape" else ys):
            return None
        c = _inverse_permuted(out, t.perm) if t.first == "reshape" else \
            tuple(ys[d] for d in t.perm)
        if math.prod(c) != math.prod(ys) or any(m % n for n, m in zip(c, t.mid)):
            return None
        return c

    def rewrite(self, op: Op) -> bool:
        out = self.shape(op.output)
        chains = list(self.bases(op))
        if len(chains) > 1:
            near = chains[1][1]                    # (op and the op under it)
            if [o.kind for o in near] in (["reshape", "transpose"], ["transpose", "reshape"]) \
                    and any(self._form(self.shape(chains[1][0]), out, t)
                            == self.shape(near[0].output)
                            and tuple(near[near[0].kind == "reshape"].params["permutation"])
                            == t.perm and t.first == near[0].kind for t in self.targets):
                return False                       # (already so written)
        for y, ops in reversed(chains):            # (the longest chain first)
            ys = self.shape(y)
            if 1 not in ys and 1 not in out:
                continue
            moved = None
            for t in self.targets:
                c = self._form(ys, out, t)
                if c is None:
                    continue
                index = np.arange(math.prod(ys)).reshape(ys)
                form = np.transpose(index.reshape(c), t.perm) if t.first == "reshape" \
                    else np.transpose(index, t.perm).reshape(out)
                moved = self._moved(y, ops) if moved is None else moved
                if not np.array_equal(form, moved):
                    continue
                dtype = self.g.tensors[op.output].dtype
                if t.first == "reshape":
                    x = self.new_op("reshape", [y], c, dtype, {}, ops[0])
                    self.new_op("transpose", [x], out, dtype, {"permutation": t.perm}, op,
                                output=op.output)
                else:
                    x = self.new_op("transpose", [y], c, dtype, {"permutation": t.perm}, ops[0])
                    self.new_op("reshape", [x], out, dtype, {}, op, output=op.output)
                return True
        return False

    def lone_units_deleted(self, op: Op) -> bool:
        """A dot with size-1 free dims in one operand and none in the other reads that
        operand with the first k of them deleted (the result reshaped back) when the
        sequential program has a dot with the dim counts that gives and none with the
        dot's own: the normal form takes a size-1 dim merged into a contracted dim out
        of it (simplify_merged.unit_dims_out_of_contraction), where the program merges
        the head dim into the output projection's contraction ([b, s, g*j*d], a rank
        holding g = 1). After the normal form, so that no rule takes it out again."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        p = op.params
        ranks = [len(self.shape(t)) for t in op.inputs]
        units = _lone_units(p, [self.shape(t) for t in op.inputs])
        if not any(units) or _roles(p, *ranks) in self.partner_dots:
            return False
        side = 0 if units[0] else 1
        for k in range(1, len(units[side]) + 1):
            shrunk = list(ranks)
            shrunk[side] -= k
            if _roles(p, *shrunk) not in self.partner_dots:
                continue
            keep = [d for d in range(ranks[side]) if d not in units[side][:k]]
            t = op.inputs[side]
            x = self.new_op("reshape", [t], tuple(self.shape(t)[d] for d in keep),
                            self.g.tensors[t].dtype, {}, op)
            return self._dot_reading(op, side, ("lhs", "rhs")[side], x,
                                     {d: i for i, d in enumerate(keep)})
        return False

    def run(self) -> bool:
        changed = False
        readers = self.g.consumers()
        for op in self.g.ops:
            taken = readers.get(op.output, [])
            if op.kind in ("reshape", "transpose") and taken \
                    and all(r.kind in ("reshape", "transpose") for r in taken):
                pass                               # (its readers take it: the whole chain)
            elif op.kind in ("reshape", "transpose") and op.inputs and self.rewrite(op) \
                    or self.lone_units_deleted(op):
                changed = True
                continue
            self.out.append(op)
            self.producer[op.output] = op
        if changed:
            self.g.ops = self.out
        return changed


def unit_layouts_as_sequential(seq: Graph, dist: Graph, ids: IdAllocator) -> bool:
    """Rewrite `dist` in place (see the module docstring); whether anything changed."""
    return _UnitLayouts(dist, ids, seq).run()


__all__ = ["dot_roles", "lone_units_batched", "unit_layouts_as_sequential"]
