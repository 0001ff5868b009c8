"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier`
runs these rules in its pass): values computed twice, size-1 dims that an
optimiser deletes around dots, transposed dots, and reshapes folded into
reductions.

* common values: two ops of one pure kind with the same params and the same
  operands (as a multiset for a commutative kind: add, mul, max, min, and, or,
  xor, eq, ne) compute one value; the later one is folded into the earlier.
  A program's autodiff writes `x*y + y*x` (the LayerNorm backward's add_any
  of two products); XLA computes the product once and adds it twice.
* size-1 dims stay in dots: a dot operand that is a reshape only deleting
  size-1 dims is replaced by the reshape's operand, those dims free dims of the
  dot, its result reshaped to delete them again; a dot with a size-1 free dim
  in each operand batches over the pair; a broadcast of a reshape deleting
  size-1 dims broadcasts the reshape's operand. With one KV head per rank XLA
  deletes the size-1 group dim around the attention dots and the softmax's
  row statistics; the program batches over the group dim, of which a rank
  holds a block of size 1. A size-1 dim of one operand only stays free. Not a
  deleted dim that the dot computing the operand batched (a head), next to a
  contracted one, when the other operand has no size-1 dim to pair it with: that
  reshape is the program's flattening of [h, e] into a contracted h*e with h = 1
  (one head per rank before the output projection), which the rules relate to
  the program's, and it stays out of the dot.
* transposes meet dots (dlverify/simplify_layouts.py takes a dot's transpose into
  the dot): a transpose of an all-reduce is the all-reduce of the transpose, so a
  dot summed over ranks before its transpose meets it too. An all-reduce of a
  concatenation is the concatenation of its pieces' all-reduces (each piece a
  dot's partial sum, reduced alone).
* reductions read no reshape of whole groups: a reduction over dims of a
  reshape that are whole groups of it (a run of the operand's dims reshaped
  into a run of the result's dims, e.g. [8, 16, 4] -> [8, 64] reducing dim 1)
  is the reduction of the operand over those groups' dims, when the dims kept
  are kept unchanged: XLA folds the reshape into a two-axis reduce, the
  program reshapes, then reduces. A side that reshapes its block, then reduces
  it, reduces the block over the operand's dims, whose partial tags the other
  side's reduction then has. Incomplete where a collective sits between one
  side's reshape and its reduction (all_gather(reshape(block)) reduced): that
  reshape is no reduction's operand, while the other side's is folded away.

* literal products folded: `(x * a) * b` for splat literals a and b is `x * c`,
  c the product a * b rounded to the dtype, as XLA's constant folding computes it
  (GELU's backward multiplies by 0.797884583 and then by 0.044715; XLA by
  0.0356774069). When the rounding is inexact this is not an identity over the
  reals: the fold is listed as an assumption naming the three literals.

Each other rule is an identity of real arithmetic or of data movement, applied to
both graphs alike; tests/test_simplify.py checks each numerically and where it
must not fire.
"""
from __future__ import annotations

import numpy as np

from dlverify.cse import value_key
from dlverify.ir import Graph, IdAllocator, Op, Tensor
from dlverify.ops import KINDS
from dlverify.rewrites import _Rewriter

# reductions of a set of elements (not argmax/argmin, which name positions)
_SET_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                             "reduce_and", "reduce_or", "reduce_xor"})


def _unit_deletion(src: tuple[int, ...], to: tuple[int, ...]) -> tuple[list[int], list[int]] | None:
    """When `to` is `src` with some size-1 dims deleted: for each dim of `to` the
    dim of `src` it is, and the deleted dims of `src`; else None."""
    if len(src) <= len(to):
        return None
    kept, deleted, j = [], [], 0
    for i, size in enumerate(src):
        if j < len(to) and size == to[j]:
            kept.append(i)
            j += 1
        elif size == 1:
            deleted.append(i)
        else:
            return None
    return (kept, deleted) if j == len(to) else None


def _reshape_groups(src: tuple[int, ...], to: tuple[int, ...]
                    ) -> list[tuple[list[int], list[int]]] | None:
    """A row-major reshape as its smallest independent groups: runs of `src`'s
    dims and runs of `to`'s dims of equal element counts, in order (a size-1
    dim joins the group being built; a group may have no dims on one side only
    when it is size-1 dims)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(to):
        gs: list[int] = []
        gt: list[int] = []
        ps = pt = 1
        while True:
            if (not gs or ps < pt) and i < len(src):
                gs.append(i)
                ps *= src[i]
                i += 1
            elif (not gt or pt < ps) and j < len(to):
                gt.append(j)
                pt *= to[j]
                j += 1
            else:
                break
        if ps != pt:
            return None
        groups.append((gs, gt))
    return groups


def _merge_groups(src: tuple[int, ...], to: tuple[int, ...]) -> list[list[int]] | None:
    """When the reshape src -> to only merges runs of adjacent dims (size-1 dims
    joining a neighbour's run): for each dim of `to` its run of src dims; else None."""
    groups: list[list[int]] = []
    i = 0
    for size in to:
        if i >= len(src):
            return None
        run, prod = [i], src[i]
        i += 1
        while prod < size and i < len(src):
            run.append(i)
            prod *= src[i]
            i += 1
        if prod != size:
            return None
        groups.append(run)
    while i < len(src) and src[i] == 1 and groups:   # trailing size-1 dims join the last run
        groups[-1].append(i)
        i += 1
    return groups if i == len(src) else None


class _FormRules(_Rewriter):
    """The rules above, for `_Simplifier` (dlverify/simplify.py) to run in its pass."""

    def __init__(self, graph: Graph, ids: IdAllocator,
                 assumptions: list[str] | None = None) -> None:
        super().__init__(graph, ids)
        self.computed: dict[object, int] = {}     # an op's value key -> its tensor
        # where a rule that rounds (literal_product) lists what it took as equal
        self.assumptions = assumptions if assumptions is not None else []

    def splat(self, t: int) -> float | None:
        """The one value tensor t holds everywhere, when it is a constant or ops that
        only copy their operand's elements (a broadcast, a reshape: `copies_operand0`)
        of one (a literal passed to an inlined call as a scalar and reshaped there)."""
        op = self.producer.get(t)
        while op is not None and KINDS[op.kind].copies_operand0 and len(op.inputs) == 1:
            op = self.producer.get(op.inputs[0])
        if op is None or op.kind != "constant" or op.params.get("value") is None:
            return None
        v = np.asarray(op.params["value"])
        if v.size == 0 or not np.issubdtype(v.dtype, np.floating) and not np.issubdtype(
                v.dtype, np.integer):
            return None
        first = v.flat[0]
        return float(first) if np.all(v == first) else None

    def splat_of(self, value: object, shape: tuple[int, ...], dtype: str, op: Op) -> int:
        """A new tensor of `shape` holding `value` everywhere (a scalar constant
        broadcast), made at `op`."""
        scalar = self.builder.constant(np.asarray(value, dtype), (), dtype, op.loc, op.name)
        self.producer[scalar] = self.out[-1]
        return self.new_op("broadcast_in_dim", [scalar], shape, dtype,
                           {"broadcast_dimensions": ()}, op)

    def float_binary(self, op: Op, kind: str) -> Tensor | None:
        """op's floating-point result when op is a two-operand `kind`, else None."""
        if op.kind != kind or len(op.inputs) != 2:
            return None
        out = self.g.tensors[op.output]
        return out if np.issubdtype(np.dtype(out.dtype), np.floating) else None

    def literal_product(self, op: Op) -> bool:
        """`(x * a) * b` is `x * fl(a * b)` (see the module docstring)."""
        out = self.float_binary(op, "mul")
        if out is None:
            return False
        for pos in (0, 1):
            b, inner = self.splat(op.inputs[pos]), self.producer.get(op.inputs[1 - pos])
            if b is None or inner is None or inner.kind != "mul" or len(inner.inputs) != 2:
                continue
            for ipos in (0, 1):
                a, x = self.splat(inner.inputs[ipos]), inner.inputs[1 - ipos]
                if a is None or self.splat(x) is not None or self.shape(x) != out.shape \
                        or self.g.tensors[x].dtype != out.dtype:
                    continue
                c = np.asarray(a, np.float64) * np.asarray(b, np.float64)
                folded = c.astype(out.dtype)
                if not np.isfinite(folded):
                    continue
                if float(folded) != float(c):
                    as_dtype = np.dtype(out.dtype).type
                    shown = [np.format_float_positional(as_dtype(v)) for v in (a, b)]
                    note = (f"the literal product {shown[0]} * {shown[1]} is taken as "
                            f"{np.format_float_positional(folded)}, its {out.dtype} rounding, as "
                            f"XLA's constant folding computes it")
                    if note not in self.assumptions:
                        self.assumptions.append(note)
                y = self.splat_of(folded, out.shape, out.dtype, op)
                self.new_op("mul", [x, y], out.shape, out.dtype, {}, op, output=op.output)
                return True
        return False

    def common_value(self, op: Op) -> bool:
        """Fold `op` into an earlier op computing the same value (cse.value_key), else
        remember it."""
        key = value_key(self.g, op)
        if key is None:
            return False
        earlier = self.computed.get(key)
        if earlier is None or earlier == op.output:
            self.computed[key] = op.output
            return False
        return self.fold(op, earlier)

    def unit_dims_into_dot(self, op: Op) -> bool:
        """A dot operand that is a reshape deleting size-1 dims is replaced by the
        reshape's operand, those dims free dims of the dot; the result is reshaped
        to delete them again. On the distributed graph the sequential program's dots
        choose where _merged_into_contraction cannot (unit_layouts.fits_better,
        keeps_lone_units_out)."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        founds = []
        for t in op.inputs:
            r = self.producer.get(t)
            founds.append(None if r is None or r.kind != "reshape" else
                          _unit_deletion(self.shape(r.inputs[0]), self.shape(t)))
        kept = [None if found is not None and self._merged_into_contraction(op, side, found, founds)
                else found for side, found in enumerate(founds)]
        ins, q = self._dot_taking(op, kept)
        partner = getattr(self, "partner_dots", None)
        if partner:   # (the sequential program's dots choose: dlverify/unit_layouts.py)
            from dlverify.unit_layouts import fits_better, keeps_lone_units_out
            taken = self._dot_taking(op, founds)
            if kept != founds and fits_better(self, taken, op):
                ins, q = taken                          # (a head the program keeps apart)
            elif keeps_lone_units_out(self, op, ins, q):
                return False
        if ins == list(op.inputs):
            return False
        return self._dot_then_unit_reshape(op, ins, q)

    def _dot_taking(self, op: Op, founds: list[tuple[list[int], list[int]] | None]
                    ) -> tuple[list[int], dict]:
        """The operands and params of `op` reading, for each operand with a `found`
        deletion (_unit_deletion), the reshape's operand instead."""
        ins, q = [], dict(op.params)
        for side, (t, found) in enumerate(zip(op.inputs, founds)):
            key = ("lhs", "rhs")[side]
            ins.append(t if found is None else self.producer[t].inputs[0])
            dims = list(range(len(self.shape(t)))) if found is None else found[0]
            for role in ("batch", "contract"):
                q[f"{key}_{role}"] = tuple(dims[d] for d in op.params[f"{key}_{role}"])
        return ins, q

    def _merged_into_contraction(self, op: Op, side: int,
                                 found: tuple[list[int], list[int]],
                                 founds: list[tuple[list[int], list[int]] | None]) -> bool:
        """Whether operand `side`'s reshape, deleting size-1 dims (`found`, as
        _unit_deletion gives it), is read as merging each of them into a neighbouring
        contracted dim, and so stays out of the dot: the dot computing the reshaped
        value batched each deleted dim (a head: a micro-batch's size-1 dim is no batch
        dim there and enters the dot), each sits next to a kept dim the dot contracts,
        and the other operand has no size-1 dim to pair it with (no free one, none its
        own reshape deletes, none a reshape under its transpose deletes). A program that
        flattens [b, h, e] to [b, h*e] before a dot with a [h*e, d] weight holds
        [b, 1, e] -> [b, e] on a rank with one head: the same regrouping, which the
        rules relate to the program's; taken into the dot, the size-1 head dim would
        be a free dim the program's dot does not have."""
        key = ("lhs", "rhs")[side]
        kept, deleted = found
        made = self.producer.get(self.producer[op.inputs[side]].inputs[0])
        if made is None or made.kind != "dot_general" \
                or any(d >= len(made.params["lhs_batch"]) for d in deleted):
            return False                          # (not a dim an earlier dot batched over)
        src_of = dict(enumerate(kept))            # operand dim -> source dim
        contracted = {src_of[d] for d in op.params[f"{key}_contract"]}
        for d in deleted:
            below = max((k for k in kept if k < d), default=None)
            above = min((k for k in kept if k > d), default=None)
            if below not in contracted and above not in contracted:
                return False
        other = op.inputs[1 - side]
        okey = ("lhs", "rhs")[1 - side]
        roles = set(op.params[f"{okey}_batch"]) | set(op.params[f"{okey}_contract"])
        if founds[1 - side] is not None or any(
                n == 1 and d not in roles for d, n in enumerate(self.shape(other))):
            return False
        under = self.producer.get(other)             # (size-1 dims deleted under a transpose)
        under = under if under is None or under.kind != "transpose" else \
            self.producer.get(under.inputs[0])
        return under is None or under.kind != "reshape" or 1 not in self.shape(under.inputs[0])

    def unit_dims_batched(self, op: Op) -> bool:
        """A dot whose operands each have a size-1 free dim batches over the pair
        (one of each, in order); the result is reshaped to the dot's shape (only
        size-1 dims move). The program batches over a dim (KV groups) whose block
        on a rank is size 1; XLA's dot, which deleted it, has it back as a free
        dim of each operand (`unit_dims_into_dot`). On the distributed graph the
        sequential program's dots choose first, batch or contract, for these and for
        size-1 pairs the dot already batches or contracts
        (unit_layouts.unit_pairs_as_sequential), or leave free pairs free
        (unit_layouts.keeps_unit_pairs_free)."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        if getattr(self, "partner_dots", None):
            from dlverify.unit_layouts import unit_pairs_as_sequential   # (built on this module)
            if unit_pairs_as_sequential(self, op):
                return True
        p = op.params
        free = []
        for side, key in ((0, "lhs"), (1, "rhs")):
            shape = self.shape(op.inputs[side])
            free.append([d for d in range(len(shape)) if shape[d] == 1
                         and d not in p[f"{key}_batch"] and d not in p[f"{key}_contract"]])
        if not free[0] or not free[1]:
            return False
        lb, rb = list(p["lhs_batch"]), list(p["rhs_batch"])
        for dl, dr in zip(*free):
            # among the batch dims by its lhs position when those are in lhs order
            # (as a program's einsum lists them), else last
            at = sum(1 for d in lb if d < dl) if lb == sorted(lb) else len(lb)
            lb.insert(at, dl)
            rb.insert(at, dr)
        q = dict(p)
        q["lhs_batch"], q["rhs_batch"] = tuple(lb), tuple(rb)
        if getattr(self, "partner_dots", None):
            from dlverify.unit_layouts import keeps_unit_pairs_free   # (built on this module)
            if keeps_unit_pairs_free(self, op, q):
                return False
        return self._dot_then_unit_reshape(op, list(op.inputs), q)

    def unit_dims_into_broadcast(self, op: Op) -> bool:
        """A broadcast_in_dim of a reshape deleting size-1 dims broadcasts the
        reshape's operand, each deleted dim to the first size-1 result dim
        between its neighbours' (none: the reshape stays; a size-1 dim broadcast
        along a longer one is not the form the rules read, a splat is): XLA
        deletes the size-1 group dim of a rank's block before broadcasting it
        back. Not a reshape to a scalar: a broadcast of a scalar is the splat form
        the rules read (simplify_reshapes.sink_reshape's), whatever size-1 dims the result has
        (a clamp's bound on a take_along_axis's [b, s, 1] labels)."""
        if op.kind != "broadcast_in_dim":
            return False
        r = self.producer.get(op.inputs[0])
        if r is None or r.kind != "reshape":
            return False
        src = self.shape(r.inputs[0])
        found = _unit_deletion(src, self.shape(r.output))
        dims = list(op.params["broadcast_dimensions"])
        if found is None or dims != sorted(dims) or not self.shape(r.output):
            return False
        kept, _ = found
        out = self.shape(op.output)
        at = dict(zip(kept, dims))                  # src dim -> result dim
        new_dims, low = [], -1
        for i in range(len(src)):
            if i in at:
                low = at[i]
                new_dims.append(low)
                continue
            high = next((at[k] for k in kept if k > i), len(out))
            ones = [d for d in range(low + 1, high) if out[d] == 1 and d not in dims]
            if not ones:
                return False
            low = ones[0]
            new_dims.append(low)
        q = dict(op.params)
        q["broadcast_dimensions"] = tuple(new_dims)
        self.new_op("broadcast_in_dim", [r.inputs[0]], out, self.g.tensors[op.output].dtype, q,
                    op, output=op.output)
        return True

    def _dot_reading(self, op: Op, side: int, key: str, operand: int, at: dict[int, int]) -> bool:
        """`op` reading `operand` as its operand `side` (`key`), whose dim at[d] holds the old
        operand's dim d, through _dot_then_unit_reshape."""
        q = dict(op.params)
        for role in ("batch", "contract"):
            q[f"{key}_{role}"] = tuple(at[d] for d in op.params[f"{key}_{role}"])
        ins = list(op.inputs)
        ins[side] = operand
        return self._dot_then_unit_reshape(op, ins, q)

    def _dot_then_unit_reshape(self, op: Op, ins: list[int], q: dict) -> bool:
        """`op` as the dot of `ins` with params q, whose result differs from op's by
        size-1 dims only, reshaped to op's shape."""
        lshape, rshape = self.shape(ins[0]), self.shape(ins[1])
        lfree = [d for d in range(len(lshape)) if d not in q["lhs_batch"]
                 and d not in q["lhs_contract"]]
        rfree = [d for d in range(len(rshape)) if d not in q["rhs_batch"]
                 and d not in q["rhs_contract"]]
        new_out = tuple([lshape[d] for d in q["lhs_batch"]] + [lshape[d] for d in lfree]
                        + [rshape[d] for d in rfree])
        out = self.shape(op.output)
        if [s for s in new_out if s != 1] != [s for s in out if s != 1]:
            raise AssertionError(f"a size-1 dim moved a dim of the dot: {new_out} vs {out}")
        dtype = self.g.tensors[op.output].dtype
        inner = self.new_op("dot_general", ins, new_out, dtype, q, op)
        self.new_op("reshape", [inner], out, dtype, {}, op, output=op.output)
        return True

    def transpose_into_all_reduce(self, op: Op) -> bool:
        """A transpose of an all-reduce is the all-reduce of the transpose (each
        rank permutes its positions alike, and the reduction is position by
        position): transposes meet the dot they belong to (simplify_layouts.py) where
        the program sums a dot's partial results first (a weight gradient over a
        split contraction dim)."""
        if op.kind != "transpose":
            return False
        ar = self.producer.get(op.inputs[0])
        if ar is None or ar.kind != "all_reduce" or len(ar.inputs) != 1:
            return False
        x = ar.inputs[0]
        dtype = self.g.tensors[op.output].dtype
        t = self.new_op("transpose", [x], self.shape(op.output), dtype, op.params, op)
        self.new_op("all_reduce", [t], self.shape(op.output), dtype, ar.params, ar,
                    output=op.output)
        return True

    def reduce_of_reshape(self, op: Op) -> bool:
        """A reduction over whole groups of a reshape, the other groups unchanged, is
        the reduction of the reshape's operand over those groups' dims."""
        if op.kind not in _SET_REDUCTIONS:
            return False
        r = self.producer.get(op.inputs[0])
        if r is None or r.kind != "reshape":
            return False
        src, to = self.shape(r.inputs[0]), self.shape(r.output)
        groups = _reshape_groups(src, to)
        if groups is None:
            return False
        axes = set(op.params["axes"])
        new_axes: list[int] = []
        for gs, gt in groups:
            if all(d in axes for d in gt):           # reduced whole (or size-1 dims only)
                new_axes.extend(gs)
            elif any(d in axes for d in gt) or [src[d] for d in gs] != [to[d] for d in gt]:
                return False                          # partly reduced, or a kept dim reshaped
        out = self.shape(op.output)
        if tuple(s for d, s in enumerate(src) if d not in new_axes) != out:
            return False
        q = dict(op.params)
        q["axes"] = tuple(new_axes)
        self.new_op(op.kind, [r.inputs[0]], out, self.g.tensors[op.output].dtype, q, op,
                    output=op.output)
        return True


__all__ = ["_FormRules"]
