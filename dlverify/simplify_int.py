"""XLA's expansions of integer index arithmetic and of row lookups, folded back.

A module dumped after XLA's optimisations computes some integer index ops in
forms the module before them (and a jaxpr) never writes, so that nothing
relates them to the sequential program and dlverify/index_ranges.py cannot
bound them:

* signed remainder and division by a power of two: XLA's algebraic simplifier
  writes `x rem 2^k` as `select(x < 0, -(|x| & (2^k - 1)), |x| & (2^k - 1))`
  and `x / 2^k` as `select(x < 0, -(|x| >>> k), |x| >>> k)`, with
  `|x| = select(x < 0, -x, x)` and `>>>` the logical shift. Both are folded
  back into `rem(x, 2^k)` and `div(x, 2^k)` (truncating, as XLA's integer
  rem and div). An identity in two's complement for every x of the dtype,
  the most negative included: there `-x` wraps to x itself, whose bit
  pattern `100...0` has no bit below the sign (`& (2^k - 1)` is 0, the rem
  of a multiple of 2^k) and shifted logically right by k is 2^(bits-1-k)
  (negated, `x / 2^k`); k = 0 gives x itself as the quotient. Only when
  2^k fits the dtype (the divisor must be one of its values).

* row lookups in XLA's canonical gather form (its gather simplifier): every
  slice dim kept in the output with size 1 (`collapsed_slice_dims={}`), the
  batch dims first, and the batch dims of a `take_along_axis` turned into
  iota components of the index vector. Folded back into JAX's forms, which
  dlverify/masked_gather.py reads:
  - a lookup along one dim (`take`): the unit slice dim collapsed, the batch
    dims at the looked-up dim's place, then a transpose (when the order
    differs) and a reshape restore XLA's output. The same elements: a size-1
    slice at the same (clamped) start.
  - `take_along_axis`: when every other operand dim of size > 1 is indexed by
    an iota over the index batch dim of that size (matched in order, so the
    iota lies in range and no start is clamped), those dims become batching
    dims. A dim of size 1 needs no iota: its start is clamped to 0.

* an all-reduce between a reshape and its inverse is the all-reduce of the
  reshape's operand: XLA reduces a row max as [n, 1] between two bitcasts. A
  slice of a whole tensor is that tensor.

Then, in a second pass whose constant fold (dlverify/passes.fold, with the
index ranges) sees the rem folded back:

* known bool operands: `ne(p, false)`, `eq(p, true)`, `and(p, true)`, `or(p,
  false)` are p (`ne(p, true)`, `eq(p, false)` are `not p`), the known value
  computed from literals (and the rank) by the shared constant folder. XLA drops
  the divisor's sign test from the floor-mod fix-up `(rem < 0) != (V < 0)`.

* a select whose mask holds one value everywhere on every rank is the case it
  picks (jnp.take's in-bounds mask of `ids % V`, decided by the index ranges:
  its NaN fill is never taken).

Each an identity for every input; tests/test_simplify_int.py checks each
numerically with the shared evaluator, edge values included, and where it must
not fire. Run on both graphs alike (dlverify/rewrites.py), before the masked
gathers are matched.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from dlverify.ir import Graph, IdAllocator, Mesh, Op, literal_value
from dlverify.ops.dtypes import exact_dtype
from dlverify.passes import fold
from dlverify.rewrites import _Rewriter


def index_parts(producer: dict[int, Op], shape: Callable[[int], tuple[int, ...]], idx: int,
                ivd: int) -> tuple[list[int], int, dict[int, int]] | None:
    """Index tensor idx as a concatenate of parts along the dim its index vector dim
    ivd is, directly or through a reshape that only adds or drops size-1 dims:
    (parts, concatenated dim, where each dim of size > 1 of the parts lies in idx).
    Each part has size 1 along the concatenated dim: part k is column k."""
    cat, i_shape = producer.get(idx), shape(idx)
    where = {d: d for d in range(len(i_shape))}
    if cat is not None and cat.kind == "reshape":
        src = shape(cat.inputs[0])
        a = [d for d, n in enumerate(src) if n != 1]
        b = [d for d, n in enumerate(i_shape) if n != 1]
        if [src[d] for d in a] != [i_shape[d] for d in b]:
            return None
        where = dict(zip(a, b))
        cat = producer.get(cat.inputs[0])
    if cat is None or cat.kind != "concatenate":
        return None
    cdim = cat.params["dimension"]
    if where.get(cdim) != ivd or any(shape(t)[cdim] != 1 for t in cat.inputs):
        return None
    return list(cat.inputs), cdim, where


def iota_columns(producer: dict[int, Op], shape: Callable[[int], tuple[int, ...]], idx: int,
                 ivd: int) -> dict[int, int]:
    """{k: d}: column k of index tensor idx (component k along ivd) is an iota along
    idx's dim d (a dim of size > 1): its value at every index position is the
    position along d."""
    found = index_parts(producer, shape, idx, ivd)
    if found is None:
        return {}
    parts, cdim, where = found
    out = {}
    for k, part in enumerate(parts):
        src = producer.get(part)
        if src is not None and src.kind == "iota" and src.params["dimension"] in where and \
                src.params["dimension"] != cdim:
            out[k] = where[src.params["dimension"]]
    return out


_SWEEPS = 4   # of the first pass: its rules' patterns chain at most three deep


class _IntForms(_Rewriter):
    # ------------------------------------------------------------------ literals
    def int_literal(self, t: int) -> int | None:
        """The integer every element of t holds, when t is a literal (or a
        broadcast or reshape of one)."""
        v = literal_value(self.producer, t, ("broadcast_in_dim", "reshape"))
        if v is None or v.size == 0 or not np.issubdtype(v.dtype, np.integer) \
                or not (v == v.flat[0]).all():
            return None
        return int(v.flat[0])

    def is_negative_test(self, p: int, x: int) -> bool:
        """p = (x < 0) (or 0 > x)."""
        op = self.producer.get(p)
        if op is None or len(op.inputs) != 2:
            return False
        if op.kind == "lt":
            return op.inputs[0] == x and self.int_literal(op.inputs[1]) == 0
        if op.kind == "gt":
            return op.inputs[1] == x and self.int_literal(op.inputs[0]) == 0
        return False

    def negated(self, a: int, b: int) -> bool:
        """b = -a."""
        op = self.producer.get(b)
        return op is not None and op.kind == "neg" and op.inputs == [a]

    def literal(self, value: int, shape: tuple[int, ...], dtype: str, like: Op) -> int:
        c = self.builder.constant(np.asarray(value, dtype=exact_dtype(dtype)), (), dtype, like.loc,
                                  f"{like.name}.divisor")
        self.producer[c] = self.out[-1]
        if not shape:
            return c
        return self.new_op("broadcast_in_dim", [c], shape, dtype, {"broadcast_dimensions": ()}, like)

    # ------------------------------------------------------------------ rem / div
    def signed_pow2(self, op: Op) -> bool:
        """select_n(x < 0, q, -q) with q = |x| & (2^k - 1) or |x| >>> k: rem / div."""
        if op.kind != "select_n" or len(op.inputs) != 3:
            return False
        out = self.g.tensors[op.output]
        d = exact_dtype(out.dtype)
        if d is None or d == np.bool_ or not np.issubdtype(d, np.signedinteger):
            return False
        p, q, neg_q = op.inputs
        inner = self.producer.get(q)
        if not self.negated(q, neg_q) or inner is None or len(inner.inputs) != 2:
            return False
        bits = np.iinfo(d).bits
        found = None
        if inner.kind == "and":
            for i in (0, 1):
                m = self.int_literal(inner.inputs[1 - i])
                # m = 2^k - 1 with 2^k a value of the dtype (k <= bits - 2)
                if m is not None and m >= 0 and (m + 1) & m == 0 and m + 1 <= np.iinfo(d).max:
                    found = ("rem", inner.inputs[i], m + 1)
                    break
        elif inner.kind == "shift_right_logical":
            k = self.int_literal(inner.inputs[1])
            if k is not None and 0 <= k <= bits - 2:
                found = ("div", inner.inputs[0], 1 << k)
        if found is None:
            return False
        kind, abs_x, divisor = found
        sel = self.producer.get(abs_x)
        if sel is None or sel.kind != "select_n" or len(sel.inputs) != 3:
            return False
        p2, x, neg_x = sel.inputs
        if not (self.negated(x, neg_x) and self.is_negative_test(p2, x) and self.is_negative_test(p, x)):
            return False
        c = self.literal(divisor, out.shape, out.dtype, op)
        self.new_op(kind, [x, c], out.shape, out.dtype, {}, op, output=op.output)
        return True

    # ------------------------------------------------------------------ gathers
    def unbatched_gather(self, op: Op) -> tuple[dict, int, int, tuple[int, ...]] | None:
        """(params, operand, indices, operand shape) of a gather with no batching dims."""
        if op.kind != "gather" or len(op.inputs) != 2 or op.params["operand_batching_dims"] or \
                op.params["start_indices_batching_dims"]:
            return None
        return op.params, op.inputs[0], op.inputs[1], self.shape(op.inputs[0])

    def gather_take(self, op: Op) -> bool:
        """A lookup along one dim with its unit slice dim kept: JAX's take form."""
        got = self.unbatched_gather(op)
        if got is None:
            return False
        p, operand, idx, o_shape = got
        i_shape = self.shape(idx)
        if len(p["start_index_map"]) != 1 or not i_shape or p["index_vector_dim"] != len(i_shape) - 1 \
                or i_shape[-1] != 1:
            return False
        dim = p["start_index_map"][0]
        o_rank = len(o_shape)
        if p["collapsed_slice_dims"] or tuple(p["slice_sizes"]) != \
                tuple(1 if d == dim else o_shape[d] for d in range(o_rank)):
            return False
        batch = i_shape[:-1]
        nb = len(batch)
        jax_offsets = tuple(d for d in range(o_rank - 1 + nb) if not dim <= d < dim + nb)
        jax_shape = o_shape[:dim] + batch + o_shape[dim + 1:]
        # where each of XLA's output dims lies in JAX's (its unit slice dim: nowhere)
        offsets = list(p["offset_dims"])
        out_rank = len(self.shape(op.output))
        perm, b = [], 0
        for pos in range(out_rank):
            if pos in offsets:
                od = offsets.index(pos)   # the operand dim (none collapsed: in order)
                if od != dim:
                    perm.append(od if od < dim else od - 1 + nb)
            else:
                perm.append(dim + b)
                b += 1
        dtype = self.g.tensors[op.output].dtype
        params = dict(p, collapsed_slice_dims=(dim,), offset_dims=jax_offsets)
        t = self.new_op("gather", [operand, idx], jax_shape, dtype, params, op)
        if perm != list(range(len(perm))):
            t = self.new_op("transpose", [t], tuple(jax_shape[d] for d in perm), dtype,
                            {"permutation": tuple(perm)}, op)
        self.new_op("reshape", [t], self.shape(op.output), dtype, {}, op, output=op.output)
        return True

    def take_form(self, op: Op) -> tuple[int, tuple[int, ...]] | None:
        """(looked-up dim, batch shape) of a gather in JAX's take form: one collapsed
        dim indexed by a trailing size-1 index vector, every other dim sliced whole,
        the batch dims at the collapsed dim's place."""
        got = self.unbatched_gather(op)
        if got is None:
            return None
        p, _, idx, o_shape = got
        i_shape = self.shape(idx)
        if len(p["start_index_map"]) != 1 or tuple(p["collapsed_slice_dims"]) != tuple(p["start_index_map"]) \
                or not i_shape or p["index_vector_dim"] != len(i_shape) - 1 or i_shape[-1] != 1:
            return None
        dim, batch = p["start_index_map"][0], i_shape[:-1]
        if tuple(p["slice_sizes"]) != tuple(1 if d == dim else n for d, n in enumerate(o_shape)) or \
                tuple(p["offset_dims"]) != tuple(d for d in range(len(o_shape) - 1 + len(batch))
                                                 if not dim <= d < dim + len(batch)):
            return None
        return dim, batch

    def regrouped_take(self, op: Op) -> bool:
        """take(x, reshape(y)) along dim, where the reshape regroups y's sized dims into
        the batch dims B (its last dim the size-1 index vector), is reshape(take(x,
        y'), ...) with y' = y and a size-1 index vector dim (y itself when its last dim
        is of size 1): out[pre, b, post] = x[pre, y.flat[flat(b)], post] either way, a
        row-major reshape of the contiguous batch block (pre and post kept). XLA's gather
        simplifier flattens a lookup's batch dims into one."""
        form = self.take_form(op)
        if form is None:
            return False
        dim, batch = form
        idx = y = op.inputs[1]
        while (r := self.producer.get(y)) is not None and r.kind == "reshape":
            y = r.inputs[0]
        c = self.shape(y)
        ends_unit = bool(c) and c[-1] == 1
        new_batch = c[:-1] if ends_unit else c
        if [n for n in new_batch if n != 1] == [n for n in batch if n != 1]:
            return False   # (size-1 dims are other rules' concern: gather_batching.py)
        dtype, it = self.g.tensors[op.output].dtype, self.g.tensors[idx].dtype
        if not ends_unit:
            y = self.new_op("reshape", [y], c + (1,), it, {}, op)
        o_shape = self.shape(op.inputs[0])
        shape = o_shape[:dim] + new_batch + o_shape[dim + 1:]
        offsets = tuple(d for d in range(len(shape)) if not dim <= d < dim + len(new_batch))
        t = self.new_op("gather", [op.inputs[0], y], shape, dtype, dict(op.params, offset_dims=offsets, index_vector_dim=len(new_batch)), op)
        self.new_op("reshape", [t], self.shape(op.output), dtype, {}, op, output=op.output)
        return True

    def cancelled_reshapes(self, op: Op) -> bool:
        """A chain of reshapes of a gather's output g back to g's shape is g (row-major
        reshapes compose): what regrouped_take leaves before the reshapes XLA wrote
        after its flattened lookup."""
        if op.kind != "reshape":
            return False
        src = op.inputs[0]
        while (r := self.producer.get(src)) is not None and r.kind == "reshape":
            src = r.inputs[0]
        g = self.producer.get(src)
        if src == op.inputs[0] or g is None or g.kind != "gather" or self.shape(src) != self.shape(op.output):
            return False
        return self.fold(op, src)

    def gather_along(self, op: Op) -> bool:
        """A take_along_axis whose batch dims are iota components: JAX's batching form."""
        got = self.unbatched_gather(op)
        if got is None:
            return False
        p, operand, idx, o_shape = got
        o_rank = len(o_shape)
        smap = tuple(p["start_index_map"])
        if tuple(p["slice_sizes"]) != (1,) * o_rank or len(smap) < 2:
            return False
        found = index_parts(self.producer, self.shape, idx, p["index_vector_dim"])
        if found is None or len(found[0]) != len(smap):
            return False
        parts, cdim, _ = found
        c_shape = self.shape(parts[0])
        batch_pos = [e for e in range(len(c_shape)) if e != cdim and c_shape[e] != 1]
        iotas: dict[int, int] = {}   # operand dim -> the batch position its iota runs along
        rest = []
        for part, od in zip(parts, smap):
            src = self.producer.get(part)
            if src is not None and src.kind == "iota" and src.params["dimension"] != cdim:
                iotas[od] = src.params["dimension"]
            else:
                rest.append((part, od))
        if len(rest) != 1:
            return False
        part, dim = rest[0]
        wide = [d for d in range(o_rank) if d != dim and o_shape[d] != 1]
        # the batch dims, in order, are the other operand dims of size > 1, each
        # indexed by an iota along it (so in range: no start is clamped)
        if len(wide) != len(batch_pos) or any(
                iotas.get(d) != e or c_shape[e] != o_shape[d] for d, e in zip(wide, batch_pos)):
            return False
        dtype = self.g.tensors[op.output].dtype
        it = self.g.tensors[part].dtype
        bshape = tuple(1 if d == dim else o_shape[d] for d in range(o_rank))
        j = self.new_op("reshape", [part], bshape + (1,), it, {}, op)
        others = tuple(d for d in range(o_rank) if d != dim)
        params = dict(p, offset_dims=(), collapsed_slice_dims=(dim,), start_index_map=(dim,),
                      operand_batching_dims=others, start_indices_batching_dims=others,
                      index_vector_dim=o_rank)
        t = self.new_op("gather", [operand, j], bshape, dtype, params, op)
        self.new_op("reshape", [t], self.shape(op.output), dtype, {}, op, output=op.output)
        return True

    # ------------------------------------------------------------------ whole slices
    def whole_slice(self, op: Op) -> bool:
        """A slice from 0 to the end of every dim, stride 1, is its operand (the HLO
        frontend cuts a scatter's one index column out of the indices so)."""
        if op.kind != "slice":
            return False
        p, shape = op.params, self.shape(op.inputs[0])
        if any(p["start_indices"]) or tuple(p["limit_indices"]) != shape or \
                any(s != 1 for s in (p.get("strides") or ())) or shape != self.shape(op.output):
            return False
        return self.fold(op, op.inputs[0])

    # ------------------------------------------------------------------ driver
    def apply(self, op: Op) -> bool:
        return (self.signed_pow2(op) or self.gather_along(op) or self.gather_take(op)
                or self.regrouped_take(op) or self.cancelled_reshapes(op)
                or reshaped_all_reduce(self, op) or self.whole_slice(op))


class _KnownForms(_Rewriter):
    """The rules that read values known before run time: a second pass, so that the
    index ranges (dlverify/index_ranges.py) see the rem the first one folded back."""

    def __init__(self, graph: Graph, ids: IdAllocator, mesh: Mesh | None) -> None:
        super().__init__(graph, ids)
        # per rank, the value of each tensor computed from literals (and the rank),
        # and of each mask the index ranges decide
        self.known = fold(graph, mesh).splat

    # ------------------------------------------------------------------ known bools
    def known_bool_operand(self, op: Op) -> bool:
        """`ne(p, false)`, `eq(p, true)`, `and(p, true)`, `or(p, false)` are p; `ne(p,
        true)` and `eq(p, false)` are `not p`. XLA's simplifier drops the sign test of
        a positive divisor from the floor-mod fix-up, `(rem < 0) != (V < 0)`; the
        module before it computes `V < 0` (false) from constants."""
        if op.kind not in ("ne", "eq", "and", "or") or len(op.inputs) != 2 or \
                any(self.g.tensors[t].dtype != "bool" for t in op.inputs + [op.output]):
            return False
        for i in (0, 1):
            vals = self.known.get(op.inputs[1 - i])
            keep = op.inputs[i]
            if vals is None or len(set(bool(v) for v in vals)) != 1 or self.shape(keep) != self.shape(op.output):
                continue
            v = bool(vals[0])
            if (op.kind, v) in (("ne", False), ("eq", True), ("and", True), ("or", False)):
                return self.fold(op, keep)
            if op.kind in ("ne", "eq"):
                self.new_op("not", [keep], self.shape(op.output), "bool", {}, op, output=op.output)
                return True
        return False

    def known_select(self, op: Op) -> bool:
        """select_n(p, a, b) whose predicate holds one value everywhere on every rank is
        the case it picks: jnp.take's in-bounds mask of an index proved in range
        (`ids % V`), whose NaN fill is never taken."""
        if op.kind != "select_n" or len(op.inputs) != 3:
            return False
        vals = self.known.get(op.inputs[0])
        if vals is None or self.g.tensors[op.inputs[0]].dtype != "bool" or len({bool(v) for v in vals}) != 1:
            return False
        case = op.inputs[2 if bool(vals[0]) else 1]
        if self.shape(case) != self.shape(op.output) or \
                self.g.tensors[case].dtype != self.g.tensors[op.output].dtype:
            return False
        return self.fold(op, case)

    def apply(self, op: Op) -> bool:
        return self.known_bool_operand(op) or self.known_select(op)


def fold_int_expansions(graph: Graph, ids: IdAllocator, mesh: Mesh | None) -> bool:
    """Fold XLA's integer rem / div and canonical gathers back, then the ops that known
    values decide (module doc). The first pass sweeps until nothing changes (a take
    gather_take folds back may then be regrouped, and its reshapes cancel: each rule
    removes a pattern no rule creates, so few sweeps); the second is one sweep.
    Returns whether anything changed."""
    changed = False
    for _ in range(_SWEEPS):
        if not _IntForms(graph, ids).run():
            break
        changed = True
    return _KnownForms(graph, ids, mesh).run() | changed


__all__ = ["fold_int_expansions"]


def reshaped_all_reduce(rw: _Rewriter, op: Op) -> bool:
    """reshape(all_reduce(reshape(x))) back to x's shape is all_reduce(x): each
    rank moves its elements alike and the reduction is position by position, so
    the two reshapes cancel. XLA reduces a row max as [n, 1] between two
    bitcasts; the program reduces it as [n]. (Only the pair: a lone reshape stays
    where the program put it, which the padded views of uneven shards read.) Also
    a rule of the normal form (dlverify/simplify.py): the SPMD partitioner puts
    an identity broadcast between the all-reduce and the outer reshape, which
    only the normal form folds."""
    if op.kind != "reshape":
        return False
    ar = rw.producer.get(op.inputs[0])
    if ar is None or ar.kind != "all_reduce" or len(ar.inputs) != 1:
        return False
    inner = rw.producer.get(ar.inputs[0])
    if inner is None or inner.kind != "reshape" or rw.shape(inner.inputs[0]) != rw.shape(op.output):
        return False
    dtype = rw.g.tensors[op.output].dtype
    rw.new_op("all_reduce", [inner.inputs[0]], rw.shape(op.output), dtype, ar.params, ar,
              output=op.output)
    return True
