"""Reshapes sink toward the outputs and out of dots (more of the algebraic normal
form of dlverify/simplify.py, whose `_Simplifier` runs these rules in its pass):

* sink_reshape: an elementwise op of reshapes of tensors of one shape (and
  splats) is the reshape of the op on that shape;
* reciprocal_of_moved: `x * M(1 / y)` is `x / M(y)` for a chain M of reshapes,
  transposes and broadcasts (each output element one input element, so M
  commutes with an elementwise 1/y): the reciprocal rule of dlverify/simplify.py
  (`x * (1/y)` is `x / y`) then meets the product whether the reshape sank past
  the reciprocal first or not. XLA fuses a silu's sigmoid and the product that
  reads it apart, on [b, s, f] after the split's size-1 dim is deleted; the
  program's sigmoid keeps that dim once the reshape sank, and `x * reshape(1/y)`
  never met `x / reshape(y)`;
* sink_dot_reshape: a dot of a reshape that only regroups an operand's free
  dims is a reshape of the dot of a reshape keeping them (XLA flattens
  [b, s, h, d] to [b*s, h*d] around a matmul; the program merges h*d only);
* split_contraction: a dot contracting dims that both operands merged alike
  from runs of the same sizes contracts the runs pairwise.

Each an identity of data movement over the reals; tests/test_simplify.py and
tests/test_gqa_train_compiled.py check them numerically and where they must
not fire.
"""
from __future__ import annotations

import math

from dlverify.ir import Op
from dlverify.ops.table import KINDS, Family
from dlverify.simplify_forms import _merge_groups
from dlverify.simplify_merged import refinement


# data movement a reciprocal is looked for under (reciprocal_of_moved), and how deep
_MOVES = ("reshape", "transpose", "broadcast_in_dim")
_MOVES_DEPTH = 4


def _sized(shape: tuple[int, ...], run: list[int]) -> list[int]:
    """The dims of `run` of size > 1."""
    return [d for d in run if shape[d] != 1]


def _merge_groups_moving_units(src: tuple[int, ...], to: tuple[int, ...]) -> list[list[int]] | None:
    """_merge_groups of a reshape that also moves size-1 dims: `to`'s size-1 dims get
    empty runs, src's join a neighbour's run ([b, s, h, 1, k] -> [b, s, 1, h*k]); None
    when the sized dims do not merge in runs."""
    sized = tuple(n for n in to if n != 1)
    runs = _merge_groups(src, sized) if sized else None
    if runs is None or len(sized) == len(to):
        return None
    it = iter(runs)
    return [[] if n == 1 else next(it) for n in to]


def _units_only_ambiguous(sides, pairs: list[tuple[int, int]]) -> bool:
    """Whether splitting the contracted runs would only take size-1 dims out of them (each
    run one sized dim at most), and a size-1 dim of some run could as well be the
    reshape's size-1 dim next to it (a neighbouring run of size-1 dims only). Then which
    of the operand's size-1 dims the reshape keeps is not fixed by the reshape: right
    after the SPMD partitioner a rank's q is [b, s, 1, 1, e] -> [b, s, 1, e], its slot of
    the fused [q | k | v] and its one head, and _merge_groups keeps the slot, putting the
    head into the contracted run, where the program batches over the head and squeezed
    the slot. The dot is left as written; the rules pair the reshape with the program's
    as its groups fall (datalog/layout_algebra.dl: a size-1 dim may sit in any group)."""
    ambiguous = False
    for side, (_, runs, shape) in enumerate(sides):
        for pair in pairs:
            run = runs[pair[side]]
            if len(_sized(shape, run)) > 1:
                return False
            if not run:
                continue
            # (the run's first or last dim of size 1, next to a run of size-1 dims only)
            ends = [d for d in (min(run), max(run)) if shape[d] == 1]
            ambiguous |= any(other is not run and other and all(shape[d] == 1 for d in other)
                             and (max(other) + 1 in ends or min(other) - 1 in ends)
                             for other in runs)
    return ambiguous


class _ReshapeRules:
    """Mixin of dlverify/simplify.py's _Simplifier (self.producer, self.shape,
    self.new_op, self.reshaped_operands and self.scalar_of_splat come from it)."""

    def sink_reshape(self, op: Op) -> bool:
        """An elementwise op whose operands are reshapes of tensors of one shape S (and
        splats) is the reshape of the same op on S: reshapes sink toward the
        outputs, so `reshape(r) / 32` and `reshape(r / 32)` meet, and reshape chains
        then collapse."""
        if KINDS[op.kind].family is not Family.ELEMENTWISE or not op.inputs:
            return False
        if self.reciprocal_of_moved(op):
            return True
        src_shape, ins = None, []
        for t in op.inputs:
            r = self.producer.get(t)
            if r is not None and r.kind == "reshape":
                s = self.shape(r.inputs[0])
                if src_shape is not None and s != src_shape:
                    return False
                src_shape = s
                ins.append(r.inputs[0])
            elif self.scalar_of_splat(t) is not None:
                ins.append(None)
            else:
                return False
        if src_shape is None or src_shape == self.shape(op.output):
            return False
        for i, t in enumerate(op.inputs):
            if ins[i] is None:
                scalar = self.scalar_of_splat(t)
                ins[i] = self.new_op("broadcast_in_dim", [scalar], src_shape,
                                     self.g.tensors[t].dtype, {"broadcast_dimensions": ()},
                                     self.producer[t])
        dtype = self.g.tensors[op.output].dtype
        inner = self.new_op(op.kind, ins, src_shape, dtype, op.params, op)
        self.new_op("reshape", [inner], self.shape(op.output), dtype, {}, op, output=op.output)
        return True

    def reciprocal_of_moved(self, op: Op) -> bool:
        """`x * M(1 / y)` is `x / M(y)`, M a chain of data movement (reshape, transpose,
        broadcast_in_dim; a few ops) with at least one reshape or transpose (a lone
        broadcast is simplify.py's `reciprocal`): M places each element of its operand,
        so it commutes with the elementwise reciprocal."""
        if op.kind != "mul" or len(op.inputs) != 2:
            return False
        for pos in (0, 1):
            chain, t = [], op.inputs[pos]
            while len(chain) < _MOVES_DEPTH:
                m = self.producer.get(t)
                if m is None or m.kind not in _MOVES or len(m.inputs) != 1:
                    break
                chain.append(m)
                t = m.inputs[0]
            r = self.producer.get(t)
            if not any(m.kind != "broadcast_in_dim" for m in chain) or r is None \
                    or r.kind != "div" or self.splat(r.inputs[0]) != 1.0 \
                    or self.shape(r.inputs[0]) != self.shape(r.inputs[1]):
                continue
            x, y = op.inputs[1 - pos], r.inputs[1]
            dtype = self.g.tensors[op.output].dtype
            if self.shape(x) != self.shape(op.output) or self.g.tensors[y].dtype != dtype \
                    or self.g.tensors[x].dtype != dtype:
                continue
            for m in reversed(chain):      # M applied to y: the same ops, innermost first
                y = self.new_op(m.kind, [y], self.shape(m.output), dtype, m.params, m)
            self.new_op("div", [x, y], self.shape(op.output), dtype, {}, op, output=op.output)
            return True
        return False

    def sink_dot_reshape(self, op: Op) -> bool:
        """A dot (operands in the standard order) of a reshape that regroups the
        operand's free dims (batch dims unchanged, the contracted ones regrouped
        among themselves at most) is the dot of a reshape that keeps the free
        dims, reshaped after: XLA flattens [b, s, h, d] to [b*s, h*d] before a
        matmul and back after it; the sequential program merges h*d only. Row-major
        order makes the regrouping of the leading and trailing groups independent
        as soon as their sizes agree."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        p = op.params
        for side, key, r in self.reshaped_operands(op):
            src, to = self.shape(r.inputs[0]), self.shape(op.inputs[side])
            nb, nc = len(p[f"{key}_batch"]), len(p[f"{key}_contract"])
            rank = len(to)
            if tuple(p[f"{key}_batch"]) != tuple(range(nb)) or tuple(p[f"{key}_contract"]) != (
                    tuple(range(rank - nc, rank)) if side == 0 else tuple(range(nb, nb + nc))):
                continue                            # not in the standard order (yet)
            if src[:nb] != to[:nb]:
                continue
            # to = batch + first + second; first: free dims (lhs) or contracted (rhs)
            n_first = rank - nb - nc if side == 0 else nc
            first, second = to[nb:nb + n_first], to[nb + n_first:]
            # (splits differ in the size-1 dims at the boundary. On the lhs the first
            # one moves them into the contracted dims: when another keeps the free dims,
            # the dot is left as it is, as simplify_merged.unit_dims_out_of_contraction
            # moved them out of the contracted run, taking them back would undo it)
            splits = [k for k in range(nb, len(src) + 1)
                      if math.prod(src[nb:k]) == math.prod(first)
                      and math.prod(src[k:]) == math.prod(second)]
            if not splits or side == 0 and any(src[nb:k] == first for k in splits):
                continue
            split = splits[0]
            src_free = src[nb:split] if side == 0 else src[split:]
            if src_free == (first if side == 0 else second):
                continue                            # the free dims are kept already
            mid = src[:split] + second if side == 0 else to[:nb + n_first] + src[split:]
            operand = r.inputs[0]
            dtype = self.g.tensors[op.output].dtype
            if mid != src:
                operand = self.new_op("reshape", [operand], mid, self.g.tensors[operand].dtype,
                                      {}, r)
            q = dict(p)
            q[f"{key}_contract"] = (tuple(range(len(mid) - nc, len(mid))) if side == 0
                                    else tuple(range(nb, nb + nc)))
            ins = list(op.inputs)
            ins[side] = operand
            out = self.shape(op.output)
            n_free = rank - nb - nc                  # this operand's free dims in `to`
            if side == 0:
                new_out = out[:nb] + src_free + out[nb + n_free:]
            else:
                new_out = out[:len(out) - n_free] + src_free
            inner = self.new_op("dot_general", ins, new_out, dtype, q, op)
            self.new_op("reshape", [inner], out, dtype, {}, op, output=op.output)
            return True
        return False

    def _unflattened(self, t: int) -> tuple[int, list[list[int]], tuple[int, ...]] | None:
        """t as a (transposed) reshape that only merges runs of dims: the reshape's
        operand, for each dim of t the dims of that operand it merges, and the
        operand's shape; None when t is no such reshape. A reshape that regroups
        (XLA's [b*s, j*d] -> [b, s*j, d]) merges its operand's dims split finest
        (simplify_merged.refinement: [b, s, j, d]); that shape is returned."""
        perm = None
        r = self.producer.get(t)
        if r is not None and r.kind == "transpose":
            perm, r = tuple(r.params["permutation"]), self.producer.get(r.inputs[0])
        if r is None or r.kind != "reshape":
            return None
        src, mid = self.shape(r.inputs[0]), self.shape(r.output)
        # (size-1 dims join a run like any other: a batch of one on a rank merges
        # as the whole batch does on the sequential side)
        runs = _merge_groups(src, mid) or _merge_groups_moving_units(src, mid)
        if runs is None:   # a regrouping: the merge of its operand's dims split finest
            src = refinement(src, mid)
            runs = None if src is None else _merge_groups(src, mid)
        if runs is None:
            return None
        order = perm if perm is not None else tuple(range(len(mid)))
        return r.inputs[0], [runs[j] for j in order], src

    def split_contraction(self, op: Op) -> bool:
        """A dot contracting dims that both operands merged alike from runs of the
        same sizes (each operand a reshape that merges runs of dims, perhaps
        transposed after; batch dims unmerged) is the dot contracting the runs
        pairwise: XLA flattens a [g, j, d, e] weight to [g*j*d, e], and [b, s, n]
        activations to [b*s, n] matrices for a weight gradient, which it
        contracts over b*s; the program contracts (b, s). The free runs stay
        merged here, under the transpose to the dot's order, and leave the dot
        next (simplify_sink.free_merge_under_transpose)."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        p = op.params
        sides = [self._unflattened(t) for t in op.inputs]
        if sides[0] is None or sides[1] is None:
            return False
        pairs = list(zip(p["lhs_contract"], p["rhs_contract"]))
        (lsrc, lruns, lshape), (rsrc, rruns, rshape) = sides
        contracted = ({d for d, _ in pairs}, {d for _, d in pairs})
        if any(len(run) != 1 for j in p["lhs_batch"] for run in [lruns[j]]) \
                or any(len(run) != 1 for j in p["rhs_batch"] for run in [rruns[j]]):
            return False
        # A size-1 dim of a contracted run sums over one index: when the runs differ only
        # in those (a layer's [1, b, s] slice of a stack against [b, s]; the one query
        # group of a KV head between the heads and the head dim), they are dropped
        exact = all([lshape[d] for d in lruns[i]] == [rshape[d] for d in rruns[j]] for i, j in pairs)
        if exact and all(len(lruns[i]) == 1 for i, _ in pairs):
            return False
        if exact and _units_only_ambiguous(sides, pairs):
            return False
        if not exact:
            lsized = {i: _sized(lshape, lruns[i]) for i, _ in pairs}
            if any([lshape[d] for d in lsized[i]] != [rshape[d] for d in _sized(rshape, rruns[j])]
                   for i, j in pairs) or all(len(run) <= 1 for run in lsized.values()):
                return False
            lruns = [_sized(lshape, r) if i in contracted[0] else r for i, r in enumerate(lruns)]
            rruns = [_sized(rshape, r) if j in contracted[1] else r for j, r in enumerate(rruns)]
        ins, new_pos = [], []
        for x, runs, shape, c in ((lsrc, lruns, lshape, contracted[0]),
                                  (rsrc, rruns, rshape, contracted[1])):
            # contracted runs split into their dims, the others merged into one dim: a
            # reshape of the operand (runs in its order), then the transpose to the
            # dot's order (the form a program that reshapes, then contracts, has)
            at: dict[int, list[int]] = {}
            dims: list[int] = []
            # (an empty run, a size-1 dim the reshape inserted or of a contracted run
            # dropped, goes last: a size-1 dim moves no element)
            for j in sorted(range(len(runs)), key=lambda j: runs[j][0] if runs[j] else len(shape)):
                sizes = ([shape[d] for d in runs[j]] if j in c
                         else [math.prod(shape[d] for d in runs[j])])
                at[j] = list(range(len(dims), len(dims) + len(sizes)))
                dims.extend(sizes)
            dtype = self.g.tensors[x].dtype
            if tuple(dims) != self.shape(x):   # (`shape` may be x's refinement)
                x = self.new_op("reshape", [x], tuple(dims), dtype, {}, op)
            order = [d for j in range(len(runs)) for d in at[j]]
            pos, k = [], 0
            for j in range(len(runs)):
                pos.append(list(range(k, k + len(at[j]))))
                k += len(at[j])
            new_pos.append(pos)
            if order != list(range(len(dims))):
                x = self.new_op("transpose", [x], tuple(dims[d] for d in order), dtype,
                                {"permutation": tuple(order)}, op)
            ins.append(x)
        lpos, rpos = new_pos
        q = dict(p)
        q["lhs_contract"] = tuple(d for i, _ in pairs for d in lpos[i])
        q["rhs_contract"] = tuple(d for _, j in pairs for d in rpos[j])
        q["lhs_batch"] = tuple(lpos[i][0] for i in p["lhs_batch"])
        q["rhs_batch"] = tuple(rpos[j][0] for j in p["rhs_batch"])
        self.new_op("dot_general", ins, self.shape(op.output), self.g.tensors[op.output].dtype, q,
                    op, output=op.output)
        return True
