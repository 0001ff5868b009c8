"""Size-1 dims placed alike on the two sides around transposes and the dots that read
them (more of dlverify/unit_layouts.py's pass after the normal form).

A transpose of a reshape that only inserts, deletes or moves size-1 dims has many equal
forms: the size-1 dims may sit anywhere in the reshape's result, the transpose putting
them where the result has them. Which one a program holds depends on which dot read the
value first: with one KV head (g = 1 in the program too) the sequential normal form holds
k^T as [b, s, d] -> [b, 1, s, d] moved by (0, 1, 3, 2) and v^T as [b, s, d] -> [b, s, 1, d]
moved by (0, 2, 3, 1). The rules pair a transpose with a transpose of the same
permutation (datalog/layout.dl), and unit_layouts' chains take the sequential program's
form for the distributed one, which is ambiguous when the sequential program holds both.

* `canonical_units` (both graphs, before the chains are read): such a pair is written
  with its size-1 dims where the result has them and a transpose fixing them
  (canonical_form), one form per data movement. Where the sequential dim is sized the
  distributed chain then takes the sequential pair's form as before (unit_layouts'
  chains); where both are size 1 both sides now hold one form. Likewise a reshape of a
  transpose that moves size-1 dims only is one reshape (unit_move_reshaped; on the
  distributed graph not where it is written as a sequential transpose-then-reshape
  whose dim is sized there): with one KV head the program moves g before flattening the
  attention output, [b, 1, s, j, d] -> [b, s, 1, j, d] -> [b, s, 1, j*d], which the
  rank's module writes as the reshape alone.
* `deleted_units_transposed` (the distributed graph): a dot operand reshape(y) that only
  deletes size-1 dims of y reads transpose(y, P) instead, the deleted dims free dims of
  the dot (the result reshaped back), when P is the permutation of a transpose that a
  sequential dot reads on that side and the new dot could compute a block of that dot
  (unit_layouts._fits) where the old one could not, and when P keeps y's sized dims in
  their order (so reshape(transpose(y, P)) is reshape(y): size-1 dims hold one index).
  With one head per rank XLA deletes the head dim before the query's weight gradient
  x^T dq, [D, b*s] x [b*s, j*d]; the program transposes dq [b, g, s, j, d] to
  [b, s, g, j, d] and keeps g free ([D, g, j, d]).

* `merged_dims_split` (the distributed graph, in the normal form's pass, from
  unit_layouts.lone_units_batched): a dot operand transpose(reshape(y)) whose reshape
  deletes size-1 dims and merges free dims reads transpose(y, Q) with the runs apart and
  the size-1 dims free, where that fits a sequential dot and the dot as it is does not
  (the attention output's [b, s, j*d] for the output projection's weight gradient, where
  the program reads [g, j, d, b, s]); the transpose then meets the dot under it
  (simplify_layouts.transposed_dot) as the program's does.

* `free_units_placed` (the distributed graph, after the normal form): a dot operand
  reshape(transpose(y, P)) with its size-1 dims elsewhere than a sequential reshape of a
  transpose by P puts them (the flattened attention output before the output projection,
  [b, 1, s, j*d] against the program's [b, s, 1, j*d]) is reshaped to put them there.

* `unit_reduction_as_reshape` (the sequential graph, in the normal form's pass): a reduction
  whose axes all have size 1 combines one element with the reducer's identity (the HLO
  frontend admits no other init), so it is the reshape deleting those dims; reshapes
  then sink past elementwise ops and into broadcasts as the other side's deletions do.
  With one KV head the program sums the softmax gradient's row term over its size-1
  group dim g, then negates it; the rank's module has no g to sum over and negates the
  term itself. On the distributed graph too where the sequential program reduces no such
  axis (`reduced_axes`): right after the SPMD partitioner the rank's module still sums
  its one KV head where the program, with two, does not.

* `unit_move_under_transpose` (both graphs, in the normal form's pass): a transpose of
  a reshape that moves size-1 dims only, as many as its operand has, is one transpose of
  the operand, which then meets the elementwise ops and the dot under it. XLA's scores of
  one query head per rank, k q^T [b, g, s_k, j, s_q], reach the program's layout
  [b, g, j, s_q, s_k] by such a pair (dlverify/unit_insertion.py inserts g and j).

* `units_placed_as_operand` (the sequential graph, after the normal form, and the
  distributed one where that lets a dot fit a sequential dot it did not): a dot
  operand reshape(y) that merges y's sized dims and keeps its size-1 dims, all free
  dims of the dot, reads them where y has them (unit_order), the result reshaped back.
  With one KV head the program flattens the attention output [b, g, s, j, d] to
  [b, s, g, j*d] for the output projection (a transpose moving g, which
  canonical_units writes as one reshape) and the query's gradient to [b, g, s, j*d]:
  one form now, and the rank's XLA module writes both as the latter.

Each is an identity of data movement; the sequential program only chooses among equal
forms, so a wrong choice costs a relation, never soundness. tests/test_unit_layouts.py
and tests/test_unit_placement.py check each numerically and where it must not fire.
"""
from __future__ import annotations

import itertools
from typing import Callable, NamedTuple

from dlverify.ir import Graph, IdAllocator, Op
from dlverify.rewrites import _Rewriter
from dlverify.simplify_forms import _FormRules, _merge_groups, _unit_deletion


def _sized(shape: tuple[int, ...]) -> list[int]:
    """The dims of `shape` of size > 1, in order."""
    return [d for d, n in enumerate(shape) if n != 1]


def canonical_form(ys: tuple[int, ...], mid: tuple[int, ...], perm: tuple[int, ...],
                   out: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """For transpose(reshape(y, mid), perm) of shape `out`, the reshape only inserting,
    deleting or moving size-1 dims of y and the transpose moving sized dims: (C, P), the
    shape of y reshaped with its sized dims in order at out's sized places and its
    size-1 dims at out's, and the transpose of it giving the same result (fixing the
    size-1 dims). None when the pair is no such pair."""
    if [n for n in ys if n != 1] != [n for n in mid if n != 1]:
        return None
    rank = {d: k for k, d in enumerate(_sized(mid))}
    places = _sized(out)
    order = [rank[perm[j]] for j in places]      # out's i-th sized dim is mid's order[i]-th
    if order == sorted(order):
        return None                                # (moves no element: one reshape)
    ysized = [n for n in ys if n != 1]
    c = list(out)
    p = list(range(len(out)))
    for i, j in enumerate(places):
        c[j] = ysized[i]                           # (y's sized dims in y's order)
        p[j] = places[order[i]]
    return tuple(c), tuple(p)


class _CanonicalUnits(_Rewriter):
    """canonical_units' pass: each transpose(reshape(y)) of the module docstring in its
    canonical form (canonical_form), and each reshape of a unit move as one reshape,
    except the pairs `keep` (y's shape, the middle shape, the permutation, the result's;
    `first`: the pair's first op kind) holds."""

    def __init__(self, graph: Graph, ids: IdAllocator,
                 keep: Callable[..., bool] | None = None) -> None:
        super().__init__(graph, ids)
        self.keep = keep

    def apply(self, op: Op) -> bool:
        """Write a transpose(reshape(y)) in its canonical form, or a reshape(transpose(y))
        as one reshape (True), or leave `op`; the pass itself is _Rewriter.run's."""
        if op.kind == "reshape":
            return self.unit_move_reshaped(op)
        r = self.producer.get(op.inputs[0]) if op.kind == "transpose" else None
        if r is None or r.kind != "reshape":
            return False
        y, perm = r.inputs[0], tuple(op.params["permutation"])
        shapes = (self.shape(y), self.shape(r.output), perm, self.shape(op.output))
        form = canonical_form(*shapes)
        if form is None or form == shapes[1:3] or self.keep is not None and self.keep(
                *shapes, first="reshape"):
            return False
        c, p = form
        dtype = self.g.tensors[op.output].dtype
        x = y if c == self.shape(y) else self.new_op("reshape", [y], c, dtype, {}, r)
        self.new_op("transpose", [x], self.shape(op.output), dtype, {"permutation": p}, op,
                    output=op.output)
        return True

    def unit_move_reshaped(self, op: Op) -> bool:
        """reshape(transpose(y, P)) where P keeps y's sized dims in their order (it moves
        size-1 dims only, so it moves no element) is reshape(y): the canonical form of a
        unit move under a reshape, unless `keep` holds the pair (y's shape, the
        transpose's, P, the result's; the distributed side keeps the form of a
        sequential transpose-then-reshape whose dim is sized there)."""
        tr = self.producer.get(op.inputs[0]) if op.inputs else None
        if tr is None or tr.kind != "transpose":
            return False
        y, perm = tr.inputs[0], tuple(tr.params["permutation"])
        ys = self.shape(y)
        moved = [d for d in perm if ys[d] != 1]
        if moved != sorted(moved) or self.g.tensors[y].dtype != self.g.tensors[op.output].dtype:
            return False
        if self.keep is not None and self.keep(ys, self.shape(tr.output), perm,
                                               self.shape(op.output), first="transpose"):
            return False
        self.new_op("reshape", [y], self.shape(op.output), self.g.tensors[op.output].dtype, {},
                    op, output=op.output)
        return True


def canonical_units(g: Graph, ids: IdAllocator, keep: Callable[..., bool] | None = None) -> bool:
    """Rewrite `g` in place (see the module docstring), not the pairs `keep` holds (see
    _CanonicalUnits); whether anything changed."""
    return _CanonicalUnits(g, ids, keep).run()


class TransposedOperand(NamedTuple):
    """A sequential dot reading a transpose on one side: the side, the permutation, the
    transpose's operand shape, and the dot's sizes by role (unit_layouts._dot_sizes)."""

    side: int
    perm: tuple[int, ...]
    source: tuple[int, ...]
    sizes: tuple


def transposed_operands(g: Graph) -> list[TransposedOperand]:
    """Each (dot, side) of g whose operand is a transpose, once."""
    from dlverify.unit_layouts import _dot_sizes
    producer = g.producer()
    found: list[TransposedOperand] = []
    for op in g.ops:
        if op.kind != "dot_general" or len(op.inputs) != 2:
            continue
        shapes = [g.tensors[t].shape for t in op.inputs]
        for side, t in enumerate(op.inputs):
            tr = producer.get(t)
            if tr is None or tr.kind != "transpose":
                continue
            entry = TransposedOperand(side, tuple(tr.params["permutation"]),
                                      g.tensors[tr.inputs[0]].shape,
                                      _dot_sizes(op.params, *shapes))
            if entry not in found:
                found.append(entry)
    return found


def deleted_units_transposed(rw, op: Op, targets: list[TransposedOperand]) -> bool:
    """See the module docstring: `rw` a rewriter of the distributed graph (new_op, shape,
    producer, _dot_then_unit_reshape), `targets` the sequential transposed_operands."""
    from dlverify.unit_layouts import _fits
    if op.kind != "dot_general" or len(op.inputs) != 2 or not targets:
        return False
    shapes = [rw.shape(t) for t in op.inputs]
    for side, key in ((0, "lhs"), (1, "rhs")):
        r = rw.producer.get(op.inputs[side])
        if r is None or r.kind != "reshape":
            continue
        y = r.inputs[0]
        ys = rw.shape(y)
        found = _unit_deletion(ys, shapes[side])
        if found is None:
            continue
        kept, _ = found
        for target in targets:
            if target.side != side or len(target.source) != len(ys) or any(
                    m % n for n, m in zip(ys, target.source)):
                continue
            perm = target.perm
            sized = [d for d in perm if ys[d] != 1]
            if sized != sorted(sized):
                continue                           # (moves elements: no unit move)
            at = {d: perm.index(d) for d in range(len(ys))}     # y's dim -> transposed dim
            q = dict(op.params)
            for role in ("batch", "contract"):
                q[f"{key}_{role}"] = tuple(at[kept[d]] for d in op.params[f"{key}_{role}"])
            new_shapes = list(shapes)
            new_shapes[side] = tuple(ys[d] for d in perm)
            one = _one_dot(*target.sizes)
            if _fits(op.params, *shapes, one) or not _fits(q, *new_shapes, one):
                continue
            x = rw.new_op("transpose", [y], new_shapes[side], rw.g.tensors[y].dtype,
                          {"permutation": perm}, r)
            ins = list(op.inputs)
            ins[side] = x
            return rw._dot_then_unit_reshape(op, ins, q)
    return False

def _insertions(mine: tuple[int, ...], theirs: tuple[int, ...]) -> list[int] | None:
    """Where len(theirs) - len(mine) size-1 dims go among `mine` (for each: how many of
    mine precede it) so that the sizes in order divide `theirs` (a rank's block), the
    leftmost choice; None when none does."""
    extra = len(theirs) - len(mine)
    if extra < 0:
        return None
    for places in itertools.combinations(range(len(theirs)), extra):
        it = iter(mine)
        grown = [1 if j in places else next(it) for j in range(len(theirs))]
        if all(t % n == 0 for n, t in zip(grown, theirs)):
            return [j - i for i, j in enumerate(places)]
    return None


def merged_dims_split(rw, op: Op, partner) -> bool:
    """A dot operand transpose(reshape(y)) (or reshape(y)) whose reshape deletes size-1
    dims of y and merges runs of its sized dims into free dims of the dot reads
    transpose(y, Q) instead: each merged free dim its run of y's dims again, y's size-1
    dims free dims where the sizes in order divide a sequential dot's (unit_layouts._fits),
    which the dot as it is could not; the result reshaped back (the runs merged, the
    size-1 dims deleted: row-major order is kept). With one head per rank the attention
    output o [b, 1, s, j, d] reaches the output projection's weight gradient as
    [b, s, j*d] transposed to [j*d, b, s]; the program's dot reads [g, j, d, b, s].
    `rw` a rewriter of the distributed graph, `partner` the sequential dot_roles."""
    from dlverify.unit_layouts import _dot_sizes, _fits
    if op.kind != "dot_general" or len(op.inputs) != 2:
        return False
    p = op.params
    shapes = [rw.shape(t) for t in op.inputs]
    if _fits(p, *shapes, partner):
        return False
    for side, key in ((0, "lhs"), (1, "rhs")):
        t = op.inputs[side]
        tr = rw.producer.get(t)
        perm = tuple(range(len(shapes[side])))
        if tr is not None and tr.kind == "transpose":
            perm, tr = tuple(tr.params["permutation"]), rw.producer.get(tr.inputs[0])
        if tr is None or tr.kind != "reshape":
            continue
        y = tr.inputs[0]
        ys, mid = rw.shape(y), rw.shape(tr.output)
        runs = _merge_groups(ys, mid)
        if runs is None or 1 in mid:
            continue
        units = [d for d, n in enumerate(ys) if n == 1]
        runs = [[d for d in run if ys[d] != 1] for run in runs]
        roles = set(p[f"{key}_batch"]) | set(p[f"{key}_contract"])
        if any(len(runs[perm[i]]) != 1 for i in roles) or not units and all(
                len(run) == 1 for run in runs):
            continue                                # (batch and contracted dims unmerged)
        free = [i for i in range(len(perm)) if i not in roles]
        sized_free = tuple(ys[d] for i in free for d in runs[perm[i]])
        other = shapes[1 - side]
        b = _dot_sizes(p, *shapes)[0]
        for tb, tl, tr_sizes, tc in sorted(partner.shapes):
            theirs = tl if side == 0 else tr_sizes
            places = _insertions(sized_free, theirs) if len(units) == len(theirs) - len(
                sized_free) else None
            if places is None:
                continue
            # the operand in the dot's standard order: batch, then free (lhs) or
            # contracted (rhs), then the other; the free dims expanded, units placed
            order_free: list[int] = []
            it = iter(units)
            for k, d in enumerate(x for i in free for x in runs[perm[i]]):
                order_free += [next(it) for _ in range(places.count(k))] + [d]
            order_free += list(it)
            batch = [runs[perm[i]][0] for i in p[f"{key}_batch"]]
            contract = [runs[perm[i]][0] for i in p[f"{key}_contract"]]
            q_perm = batch + (order_free + contract if side == 0 else contract + order_free)
            q = dict(p)
            q[f"{key}_batch"] = tuple(range(len(batch)))
            at = len(batch) + (len(order_free) if side == 0 else 0)
            q[f"{key}_contract"] = tuple(range(at, at + len(contract)))
            new_shape = tuple(ys[d] for d in q_perm)
            new_shapes = [new_shape, other] if side == 0 else [other, new_shape]
            one = _one_dot(tb, tl, tr_sizes, tc)
            if not _fits(q, *new_shapes, one):
                continue
            dtype = rw.g.tensors[op.output].dtype
            x = rw.new_op("transpose", [y], new_shape, rw.g.tensors[y].dtype,
                          {"permutation": tuple(q_perm)}, op)
            ins = [x, op.inputs[1]] if side == 0 else [op.inputs[0], x]
            lfree = [n for d, n in enumerate(rw.shape(ins[0])) if d not in q["lhs_batch"]
                     and d not in q["lhs_contract"]]
            rfree = [n for d, n in enumerate(rw.shape(ins[1])) if d not in q["rhs_batch"]
                     and d not in q["rhs_contract"]]
            inner = rw.new_op("dot_general", ins, tuple(b) + tuple(lfree) + tuple(rfree), dtype,
                              q, op)
            rw.new_op("reshape", [inner], rw.shape(op.output), dtype, {}, op, output=op.output)
            return True
    return False


def transposed_reshapes(g: Graph) -> set[tuple]:
    """Each reshape of a transpose in g: (the permutation, the transpose's result shape,
    the reshape's result shape)."""
    producer = g.producer()
    found = set()
    for op in g.ops:
        tr = producer.get(op.inputs[0]) if op.kind == "reshape" and op.inputs else None
        if tr is not None and tr.kind == "transpose":
            found.add((tuple(tr.params["permutation"]), g.tensors[tr.output].shape,
                       g.tensors[op.output].shape))
    return found


def free_units_placed(rw, op: Op, merges: set[tuple]) -> bool:
    """A dot operand reshape(transpose(y, P)) whose size-1 dims sit elsewhere than in a
    sequential reshape of a transpose by P (`merges`, transposed_reshapes) of the same
    rank, whose sizes the rank's divide: the operand reshaped with its size-1 dims where
    the sequential one has them (a reshape: a size-1 dim holds one index), the dot's
    result reshaped back. With one KV head the program flattens the attention output to
    [b, s, 1, j*d] before the output projection; the rank's reshape writes [b, 1, s, j*d].
    `rw` a rewriter of the distributed graph."""
    if op.kind != "dot_general" or len(op.inputs) != 2 or not merges:
        return False
    for side in (0, 1):
        t = op.inputs[side]
        r = rw.producer.get(t)
        tr = rw.producer.get(r.inputs[0]) if r is not None and r.kind == "reshape" else None
        shape = rw.shape(t)
        if tr is None or tr.kind != "transpose" or 1 not in shape:
            continue
        mid = rw.shape(tr.output)
        for perm, seq_mid, end in sorted(merges):
            if perm != tuple(tr.params["permutation"]) or len(seq_mid) != len(mid) or any(
                    m % n for n, m in zip(mid, seq_mid)) or len(end) != len(shape) \
                    or end.count(1) != shape.count(1):
                continue
            it = iter(n for n in shape if n != 1)
            placed = tuple(1 if n == 1 else next(it) for n in end)
            if placed == shape or any(m % n for n, m in zip(placed, end)):
                continue
            x = rw.new_op("reshape", [t], placed, rw.g.tensors[t].dtype, {}, op)
            ins = list(op.inputs)
            ins[side] = x
            return rw._dot_then_unit_reshape(op, ins, dict(op.params))
    return False


# reductions whose result over size-1 axes is the one element (init: the identity); the
# boolean ones too in arithmetic, but masks keep the forms their rules read
_UNIT_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"})


def reduced_axes(g: Graph) -> frozenset[tuple[str, int, int]]:
    """(kind, operand rank, axis) of every axis a reduction of g reduces: the sequential
    program's, read by unit_reduction_as_reshape on the distributed graph."""
    return frozenset((op.kind, len(g.tensors[op.inputs[0]].shape), a) for op in g.ops
                     if op.kind in _UNIT_REDUCTIONS and len(op.inputs) == 1
                     for a in op.params["axes"])


def unit_reduction_as_reshape(rw, op: Op) -> bool:
    """A reduction over size-1 axes only is the reshape deleting them (module docstring);
    `rw` the normal form's rewriter. On the sequential graph (`partner_dots` None) always.
    On the distributed one a size-1 dim may be a rank's block of one element of a sized
    sequential dim, and its reduction a partial term of the sequential reduction (the
    FSDP loss's sum over a batch of one per rank), which the partial-sum rules read as a
    reduction: there only where the sequential program (`rw.partner_reductions`, its
    reduced_axes) reduces no operand of that rank over any of those axes with that
    reducer, so the reduction deletes a dim the program keeps. JAX's transpose of a
    broadcast sums every size-1 dim of its operand: with one KV head per rank, the
    softmax gradient's row term [b, 1, j, q, 1] is summed over the rank's KV head too,
    where the program (two KV heads) sums the trailing dim only, and the sequential
    normal form deletes that sum. Either form is the same function: a wrong choice costs
    a relation, never soundness."""
    if op.kind not in _UNIT_REDUCTIONS or len(op.inputs) != 1:
        return False
    x = op.inputs[0]
    axes = op.params["axes"]
    if not axes or any(rw.shape(x)[a] != 1 for a in axes):
        return False   # (a reduction over no axes is left to the reduction-chain rules)
    if getattr(rw, "partner_dots", None) is not None:
        reduced = getattr(rw, "partner_reductions", None)
        rank = len(rw.shape(x))
        if reduced is None or any((op.kind, rank, a) in reduced for a in axes):
            return False
    out = rw.g.tensors[op.output]
    if rw.g.tensors[x].dtype != out.dtype:
        return False
    rw.new_op("reshape", [x], out.shape, out.dtype, {}, op, output=op.output)
    return True


def unit_order(ys: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """For a reshape of y (shape ys) to `shape` that merges runs of y's sized dims and
    keeps as many size-1 dims as y has: the shape with the same sized dims and each
    size-1 dim where y has it among them (a merged dim at its run's first dim); None for
    any other reshape."""
    sized_y, sized = tuple(n for n in ys if n != 1), tuple(n for n in shape if n != 1)
    if ys.count(1) != shape.count(1) or not ys.count(1):
        return None
    runs = _merge_groups(sized_y, sized) if sized else ([] if not sized_y else None)
    if runs is None:
        return None
    first = {run[0]: sized[i] for i, run in enumerate(runs)}
    placed, k = [], 0
    for n in ys:
        if n == 1:
            placed.append(1)
            continue
        if k in first:
            placed.append(first[k])
        k += 1
    return tuple(placed)


def units_placed_as_operand(rw, op: Op, partner=None) -> bool:
    """See the module docstring: `rw` a rewriter of either graph (new_op, shape,
    producer, _dot_then_unit_reshape); `partner` the sequential dot_roles on the
    distributed graph (the move then only where the dot fits a sequential dot only so),
    None on the sequential one."""
    from dlverify.unit_layouts import _fits
    if op.kind != "dot_general" or len(op.inputs) != 2:
        return False
    p = op.params
    shapes = [rw.shape(t) for t in op.inputs]
    if partner is not None and _fits(p, *shapes, partner):
        return False
    for side, key in ((0, "lhs"), (1, "rhs")):
        r = rw.producer.get(op.inputs[side])
        if r is None or r.kind != "reshape":
            continue
        shape = shapes[side]
        roles = set(p[f"{key}_batch"]) | set(p[f"{key}_contract"])
        if any(shape[d] == 1 for d in roles):
            continue                               # (a size-1 dim paired with the other side)
        placed = unit_order(rw.shape(r.inputs[0]), shape)
        if placed is None or placed == shape:
            continue
        sized_at = [d for d, n in enumerate(placed) if n != 1]
        at = {d: sized_at[i] for i, d in enumerate(d for d, n in enumerate(shape) if n != 1)}
        q = dict(p)
        for role in ("batch", "contract"):
            q[f"{key}_{role}"] = tuple(at[d] for d in p[f"{key}_{role}"])
        new_shapes = list(shapes)
        new_shapes[side] = placed
        if partner is not None and not _fits(q, *new_shapes, partner):
            continue
        y = r.inputs[0]
        x = y if rw.shape(y) == placed else rw.new_op("reshape", [y], placed,
                                                     rw.g.tensors[y].dtype, {}, r)
        ins = list(op.inputs)
        ins[side] = x
        return rw._dot_then_unit_reshape(op, ins, q)
    return False


class _PlacedOperands(_FormRules):
    """units_placed_as_operand's pass over the sequential graph."""

    def apply(self, op: Op) -> bool:
        """The dot `op` reading its operands' size-1 dims where their reshapes' operands
        have them (True), or left; the pass itself is _Rewriter.run's."""
        return units_placed_as_operand(self, op)


def units_placed_as_operands(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite the sequential graph `g` in place (units_placed_as_operand on every dot);
    whether anything changed."""
    return _PlacedOperands(g, ids).run()


def unit_move_under_transpose(rw, op: Op) -> bool:
    """transpose(reshape(y), P) where the reshape moves y's size-1 dims only (as many of
    them, y's sized dims in their order) is transpose(y, Q o P), Q the permutation that
    moves y's size-1 dims where the reshape puts them: one transpose, which then meets
    the elementwise ops and the dot under it (simplify_layouts.transposed_dot). XLA
    scales a rank's scores k q^T as [b, g, s_k, j, s_q], moves j to [b, g, j, s_k, s_q]
    by a reshape and transposes to the program's [b, g, j, s_q, s_k] for the masked
    softmax. `rw` the normal form's rewriter (either graph)."""
    if op.kind != "transpose":
        return False
    r = rw.producer.get(op.inputs[0])
    if r is None or r.kind != "reshape":
        return False
    y = r.inputs[0]
    ys, mid = rw.shape(y), rw.shape(r.output)
    if len(ys) != len(mid) or ys == mid or [n for n in ys if n != 1] != [n for n in mid if n != 1]:
        return False
    sized, units = iter(_sized(ys)), iter(d for d, n in enumerate(ys) if n == 1)
    q = [next(units) if n == 1 else next(sized) for n in mid]   # mid's dim i is y's q[i]
    perm = tuple(q[d] for d in op.params["permutation"])
    rw.new_op("transpose", [y], rw.shape(op.output), rw.g.tensors[op.output].dtype,
              {"permutation": perm}, op, output=op.output)
    return True


def _one_dot(*sizes):
    """A PartnerDots holding one sequential dot's sizes (for _fits)."""
    from dlverify.unit_layouts import PartnerDots
    one = PartnerDots([])
    one.shapes = frozenset([tuple(sizes)])
    return one



__all__ = ["canonical_form", "canonical_units", "deleted_units_transposed", "free_units_placed",
           "merged_dims_split", "transposed_operands", "transposed_reshapes",
           "reduced_axes", "unit_move_under_transpose", "unit_order", "unit_reduction_as_reshape",
           "units_placed_as_operand",
           "units_placed_as_operands"]
