"""Reshapes and transposes sink toward the outputs, past the ops that only move
data (more of the algebraic normal form of dlverify/simplify.py, whose
`_Simplifier` runs these rules in its pass).

One order for the layout ops around a dot, whichever side writes them where:
a dot reads its operands' free dims unmerged, and the reshape that merges them
comes after the dot (sink_dot_reshape in simplify_reshapes.py). The sequential program
merges a weight gradient's (heads, head_dim) before its dot and transposes the
merged operand; the partitioner contracts them unmerged and merges after its
all-reduce; an FSDP step gathers the merged heads of each rank. So a reshape
under a transpose, a gather, a slice or a concatenation moves past it:

* free runs leave dots: a dot operand transpose(reshape(y)) whose reshape
  regroups only runs that are free dims of the dot, each moved whole by the
  transpose, is reshape(transpose'(y)) (then sink_dot_reshape);
* gathers: all_gather(reshape(y)) along a dim that leads its reshape group is
  reshape(all_gather(y)) along the group's leading dim of y, and
  all_gather(transpose(x)) is transpose(all_gather(x)) along the dim the
  transpose moves there;
* slices and concatenations: a dynamic_slice at literal starts (sums of
  literals: an unrolled loop's index) is a slice; a slice of a reshape that
  cuts only dims the reshape keeps (each regrouped run whole), or a run's
  leading dim at whole rows of the operand's run (micro-batch i of [2, 4, n]
  split from [8, n]), is the reshape of a slice, and a
  concatenation of reshapes along a dim each keeps, their operands alike
  elsewhere, is the reshape of the concatenation.

Each an identity of data movement over the reals; tests/test_simplify.py checks
each numerically (on several ranks for the gathers) and where it must not fire.
Transposes move the other way through all-reduces (simplify_forms.py:
transpose_into_all_reduce) to meet the dot whose partial sums they reduce; no
rule moves a transpose or reshape into a gather, so the two never undo each
other.
"""
from __future__ import annotations

import math
import operator
from typing import NamedTuple

import numpy as np

from dlverify.ir import Op
from dlverify.ops.dtypes import exact_dtype
from dlverify.rewrites import _Rewriter
from dlverify.simplify_forms import _reshape_groups

# integer scalar ops an index computation folds (in its dtype, wrapping as XLA does)
_INDEX_ARITH = {"add": operator.add, "sub": operator.sub, "mul": operator.mul}
_INDEX_DEPTH = 256     # ops followed up from a start: an unrolled loop of that many steps


class _Reshape(NamedTuple):
    """A reshape op, its operand and both shapes, and its groups (`_reshape_groups`)."""
    op: Op
    operand: int
    src: tuple[int, ...]
    mid: tuple[int, ...]
    groups: list[tuple[list[int], list[int]]]


class _SinkRules(_Rewriter):
    """The rules above, for `_Simplifier` (dlverify/simplify.py) to run in its pass."""

    def _reshaped(self, t: int) -> _Reshape | None:
        """The reshape that produces t, when t is a reshape's result (with groups)."""
        r = self.producer.get(t)
        if r is None or r.kind != "reshape":
            return None
        src, mid = self.shape(r.inputs[0]), self.shape(r.output)
        groups = _reshape_groups(src, mid)
        return None if groups is None else _Reshape(r, r.inputs[0], src, mid, groups)

    def free_merge_under_transpose(self, op: Op) -> bool:
        """A dot operand (in the standard order) transpose(reshape(y)) whose reshape
        regroups only runs that are free dims of the dot, each moved whole by the
        transpose, is reshape(transpose'(y)), transpose' moving y's runs alike:
        the reshape then leaves the dot (sink_dot_reshape)."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        p = op.params
        for side, key in ((0, "lhs"), (1, "rhs")):
            t = self.producer.get(op.inputs[side])
            found = None if t is None or t.kind != "transpose" else self._reshaped(t.inputs[0])
            if found is None or any(not gs or not gt for gs, gt in found.groups):
                continue
            r, y, src, mid, groups = found
            rank = len(mid)
            nb, nc = len(p[f"{key}_batch"]), len(p[f"{key}_contract"])
            if tuple(p[f"{key}_batch"]) != tuple(range(nb)) or tuple(p[f"{key}_contract"]) != (
                    tuple(range(rank - nc, rank)) if side == 0 else tuple(range(nb, nb + nc))):
                continue                            # not in the standard order (yet)
            free = set(range(nb, rank - nc) if side == 0 else range(nb + nc, rank))
            perm = list(t.params["permutation"])
            at = {m: k for k, m in enumerate(perm)}       # reshape dim -> operand dim
            units: dict[int, list[int]] = {}               # first reshape dim -> y's dims
            ok, regrouped = True, False
            for gs, gt in groups:
                if [src[d] for d in gs] == [mid[d] for d in gt]:
                    units.update({m: [d] for m, d in zip(gt, gs)})
                    continue
                regrouped = True
                ks = [at[m] for m in gt]
                ok = ok and ks == list(range(ks[0], ks[0] + len(ks))) and set(ks) <= free
                units[gt[0]] = list(gs)
            if not ok or not regrouped:
                continue
            order = [d for m in perm if m in units for d in units[m]]
            dtype = self.g.tensors[y].dtype
            x = y
            if order != list(range(len(src))):
                x = self.new_op("transpose", [y], tuple(src[d] for d in order), dtype,
                                {"permutation": tuple(order)}, t)
            x = self.new_op("reshape", [x], self.shape(t.output), dtype, {}, r)
            ins = list(op.inputs)
            ins[side] = x
            self.new_op("dot_general", ins, self.shape(op.output),
                        self.g.tensors[op.output].dtype, p, op, output=op.output)
            return True
        return False

    def reshape_out_of_all_gather(self, op: Op) -> bool:
        """all_gather(reshape(y)) along a dim k that leads its reshape group is
        reshape(all_gather(y)) along the group's leading dim of y: a rank's block
        of k is a whole block of the group's rows in row-major order, the one
        gathering y's leading dim makes. Size-1 dims lead nothing: k may follow
        size-1 dims of its group, and y is gathered along its group's first dim
        of another size (a reshape inserting a size-1 dim before the gathered one,
        as XLA's [b, s, f] -> [b, s, 1, f] of a fused gate/up cotangent)."""
        found = self._reshaped(op.inputs[0]) if op.kind == "all_gather" else None
        if found is None:
            return False
        r, y, src, mid, groups = found
        k = op.params["dimension"]
        group = next((gs for gs, gt in groups
                      if k in gt and all(mid[d] == 1 for d in gt[:gt.index(k)])), None)
        if not group or mid[k] == 0:
            return False
        a = next((d for d in group if src[d] != 1), None)
        if a is None:
            return False
        n = self.shape(op.output)[k] // mid[k]
        dtype = self.g.tensors[op.output].dtype
        q = dict(op.params)
        q["dimension"] = a
        gathered = self.new_op("all_gather", [y], tuple(s * n if d == a else s
                                                        for d, s in enumerate(src)),
                               dtype, q, op)
        self.new_op("reshape", [gathered], self.shape(op.output), dtype, {}, r, output=op.output)
        return True

    def transpose_out_of_all_gather(self, op: Op) -> bool:
        """all_gather(transpose(x)) along dim k is transpose(all_gather(x)) along the
        dim of x the transpose puts at k (each rank's block is concatenated at the
        same positions either way): transposes leave gathers toward the dot that
        reads them, as reshapes do."""
        if op.kind != "all_gather":
            return False
        t = self.producer.get(op.inputs[0])
        k = op.params["dimension"]
        if t is None or t.kind != "transpose" or self.shape(t.output)[k] == 0:
            return False
        x, perm = t.inputs[0], tuple(t.params["permutation"])
        n = self.shape(op.output)[k] // self.shape(t.output)[k]
        dtype = self.g.tensors[op.output].dtype
        q = dict(op.params)
        q["dimension"] = perm[k]
        gathered = self.new_op("all_gather", [x], tuple(s * n if d == perm[k] else s
                                                        for d, s in enumerate(self.shape(x))),
                               dtype, q, op)
        self.new_op("transpose", [gathered], self.shape(op.output), dtype, t.params, t,
                    output=op.output)
        return True

    def _literal_index(self, t: int, depth: int, memo: dict[int, int | None]) -> int | None:
        """The value of a rank-0 integer t that is a literal, or the sum, difference
        or product of such (an unrolled loop's induction variable i + 1 + 1, up to
        `depth` ops deep), computed in t's dtype as the program computes it; else
        None. `memo` holds the values found, so a shared operand is read once."""
        if t in memo:
            return memo[t]
        memo[t] = self._index_of(t, depth, memo)
        return memo[t]

    def _index_of(self, t: int, depth: int, memo: dict[int, int | None]) -> int | None:
        op = self.producer.get(t)
        dtype = exact_dtype(self.g.tensors[t].dtype)
        if op is None or self.shape(t) != () or depth < 0 or dtype is None or dtype == bool:
            return None
        if op.kind == "constant":
            v = op.params.get("value")
            return None if v is None else int(v)
        if op.kind not in _INDEX_ARITH or len(op.inputs) != 2:
            return None
        a, b = (self._literal_index(x, depth - 1, memo) for x in op.inputs)
        if a is None or b is None:
            return None
        with np.errstate(over="ignore"):
            return int(_INDEX_ARITH[op.kind](dtype.type(a), dtype.type(b)))

    def literal_dynamic_slice(self, op: Op) -> bool:
        """A dynamic_slice whose starts are all literals is the slice at those starts,
        each clamped to [0, dim - size] as HLO's dynamic-slice clamps it (a scan
        unrolled by XLA reads its micro-batch i at the literal i)."""
        if op.kind != "dynamic_slice":
            return False
        memo: dict[int, int | None] = {}
        starts = [self._literal_index(t, _INDEX_DEPTH, memo) for t in op.inputs[1:]]
        if any(v is None for v in starts):
            return False
        src, sizes = self.shape(op.inputs[0]), op.params["slice_sizes"]
        lo = tuple(min(max(int(v), 0), n - k) for v, n, k in zip(starts, src, sizes))
        q = {"start_indices": lo, "limit_indices": tuple(a + k for a, k in zip(lo, sizes)),
             "strides": None}
        self.new_op("slice", [op.inputs[0]], self.shape(op.output),
                    self.g.tensors[op.output].dtype, q, op, output=op.output)
        return True

    def slice_moves(self, op: Op) -> bool:
        """A slice of a slice is one slice; a slice of a concatenate within one of its
        operands is a slice of that operand; a slice of a reshape sinks under it
        (slice_of_reshape): slices go toward the inputs, where the other program's
        slice of the same value is."""
        if op.kind != "slice":
            return False
        return self.slice_of_slice(op) or self.slice_of_one_piece(op) or self.slice_of_reshape(op)

    def slice_of_one_piece(self, op: Op) -> bool:
        """A slice of a concatenate that lies within one operand is that operand's
        slice (rewrites._Rewriter.slice). A slice across pieces stays whole: split, it
        would be a concatenate of pieces the halo windows of a convolution no longer
        meet as one block."""
        cat = self.producer.get(op.inputs[0])
        if cat is None or cat.kind != "concatenate":
            return False
        k = cat.params["dimension"]
        lo, hi = op.params["start_indices"][k], op.params["limit_indices"][k]
        off = 0
        for t in cat.inputs:
            size = self.shape(t)[k]
            if off <= lo and hi <= off + size:
                return self.slice(op)
            off += size
        return False

    def slice_of_slice(self, op: Op) -> bool:
        """slice(slice(x, a, b, s), c, d, t) = slice(x, a + c*s, last + 1, s*t) per dim,
        last = a + (c + (m - 1)*t)*s the inner index of the outer slice's last element
        (m = |range(c, d, t)|; the outer one's elements c, c + t, ... of the inner's
        a, a + s, ...)."""
        inner = self.producer.get(op.inputs[0])
        if inner is None or inner.kind != "slice":
            return False
        p, q = op.params, inner.params
        n = len(self.shape(op.output))
        ps, qs = p.get("strides") or (1,) * n, q.get("strides") or (1,) * n
        lo, hi, st = [], [], []
        for j in range(n):
            a, s = q["start_indices"][j], qs[j]
            c, d, t = p["start_indices"][j], p["limit_indices"][j], ps[j]
            count = len(range(c, d, t))
            lo.append(a + c * s)
            st.append(s * t)
            hi.append(lo[-1] + (count - 1) * st[-1] + 1 if count else lo[-1])
        self.new_op("slice", [inner.inputs[0]], self.shape(op.output), self.g.tensors[op.output].dtype,
                    {"start_indices": tuple(lo), "limit_indices": tuple(hi), "strides": tuple(st)},
                    op, output=op.output)
        return True

    def slice_of_reshape(self, op: Op) -> bool:
        """A slice of a reshape that keeps each regrouped run whole (it cuts only dims
        the reshape keeps as they are), or cuts a run's leading dim only at bounds
        that are whole rows of the operand's run (stride 1), is the reshape of a
        slice of the operand: reshapes sink toward the outputs past slices too
        (XLA splits [8, n] into [2, 4, n] and slices micro-batch i). A run that only
        gains or drops size-1 dims keeps its other dims as they are (a PRNG key's
        [1, 2] row read as [2], then its first word sliced)."""
        found = self._reshaped(op.inputs[0]) if op.kind == "slice" else None
        if found is None:
            return False
        r, y, src, mid, groups = found
        p = op.params
        strides = p.get("strides") or (1,) * len(mid)
        lo, hi, st = [0] * len(src), list(src), [1] * len(src)
        for gs, gt in groups:
            cuts = [j for j in gt if (p["start_indices"][j], p["limit_indices"][j], strides[j])
                   != (0, mid[j], 1)]
            whole = [d for d in gs if src[d] != 1], [j for j in gt if mid[j] != 1]
            if [src[d] for d in gs] == [mid[d] for d in gt]:
                for i, j in zip(gs, gt):
                    lo[i], hi[i], st[i] = p["start_indices"][j], p["limit_indices"][j], strides[j]
            elif [src[d] for d in whole[0]] == [mid[j] for j in whole[1]] \
                    and not any(j in cuts for j in gt if mid[j] == 1):
                # the run only gains or loses size-1 dims ([1, n] -> [n]): its other dims
                # are cut as they are, the operand's size-1 dims kept whole
                for i, j in zip(*whole):
                    lo[i], hi[i], st[i] = p["start_indices"][j], p["limit_indices"][j], strides[j]
            elif cuts:
                # a row-major run: rows [a, b) of its leading dim are elements
                # [a * inner, b * inner), rows of the operand's leading dim when
                # both are multiples of the operand's inner size
                inner = math.prod(mid[j] for j in gt[1:])
                inner_src = math.prod(src[d] for d in gs[1:])
                a, b = p["start_indices"][gt[0]] * inner, p["limit_indices"][gt[0]] * inner
                if cuts != [gt[0]] or strides[gt[0]] != 1 or not gs \
                        or a % inner_src or b % inner_src:
                    return False
                lo[gs[0]], hi[gs[0]] = a // inner_src, b // inner_src
        dtype = self.g.tensors[op.output].dtype
        shape = tuple(len(range(a, b, s)) for a, b, s in zip(lo, hi, st))
        q = {"start_indices": tuple(lo), "limit_indices": tuple(hi), "strides": tuple(st)}
        cut = self.new_op("slice", [y], shape, dtype, q, op)
        self.new_op("reshape", [cut], self.shape(op.output), dtype, {}, r, output=op.output)
        return True

    def concatenate_of_reshapes(self, op: Op) -> bool:
        """A concatenation of reshapes along a dim each keeps as it is (the operands
        equal elsewhere) is the reshape of the concatenation of their operands."""
        if op.kind != "concatenate" or len(op.inputs) < 2:
            return False
        k = op.params["dimension"]
        ins, at, found = [], None, None
        for t in op.inputs:
            found = self._reshaped(t)
            j = None if found is None else next(
                (gs[0] for gs, gt in found.groups if gt == [k] and len(gs) == 1), None)
            if found is None or j is None:
                return False
            key = (j, found.src[:j] + found.src[j + 1:])    # the operands' shapes but for j
            if at is not None and key != at:
                return False
            at = key
            ins.append(found.operand)
        dtype = self.g.tensors[op.output].dtype
        shape = tuple(sum(self.shape(t)[j] for t in ins) if d == j else s
                      for d, s in enumerate(found.src))
        cat = self.new_op("concatenate", ins, shape, dtype, {"dimension": j}, op)
        self.new_op("reshape", [cat], self.shape(op.output), dtype, {}, op, output=op.output)
        return True


__all__ = ["_SinkRules"]
