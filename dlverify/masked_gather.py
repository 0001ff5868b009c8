"""Gathers of rows by index as contractions with a one-hot matrix (an exact rewrite).

Megatron's vocab-parallel embedding looks its ids up in its vocab shard by a
gather and zeroes the rows of ids another rank owns:

    local = ids - first_r;  outside = (local < 0) | (local >= n)
    rows  = take(table_r, where(outside, 0, local));  x_r = where(outside, 0, rows)

and the vocab-parallel cross-entropy picks its target logits the same way
(take_along_axis). Wherever a row is kept, the index is `ids - first_r` and lies
in [0, n); wherever it is not, the result is zero. So, for every input,

    x_r = onehot(ids - first_r, n) . table_r = (ids == first_r + iota(n)) . table_r

which is the contraction the rules already relate to the sequential
`onehot(ids, V) . table` (the block [first_r, first_r + n) of its contracted
dim, a partial sum that the psum completes), and `take(table, i)` with `i`
proved in [0, V) (dlverify/index_ranges.py) is exactly `onehot(i, V) . table`.

A distributed `select_n(mask, gather(...), 0)` (or through reshapes of size-1
dims, and through selects whose index is known) is rewritten when the index
ranges prove: the gather's index equals base + c_r (the same base as the
mask's predicate) wherever a row is kept, and a row is kept exactly where
base + c_r lies in [0, n). Then the in-bounds gathers of both graphs are
rewritten too, so that both sides meet as contractions. Two gather forms: a
`take` along one dim (no batching dims) and `take_along_axis`.

XLA's SPMD partitioner writes the same lookup over a table whose indexed dim a
`jax.jit` shards as `clamp(0, ids', V - 1)` (ids' the ids with the index vector dim
appended), rows kept where the clamped id lies in the rank's range, gathered at
clamp - first_r. Before the analysis, such a clamp of a reshape that only inserts
size-1 dims is taken as the reshape of the clamp (elementwise ops commute with
layouts), so that its base has the ids' dims (size-1 dims of the ids too: a
take_along_axis's labels[..., None], which index_ranges carries through reshapes
like any dim). Its sequential lookup reads the ids unclamped: a take, and a
take_along_axis, gathers at indices clamped into the table (XLA's gather
semantics, and the shared evaluator's), so `take(x, reshape(ids))` is
`take(x, reshape(clamp(0, ids, n - 1)))`, in bounds: rewritten alike.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dlverify.index_ranges import (Affine, IndexFacts, Intervals, complement, intersect, shift, subset,
                                   unit_reshape_dims)
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op, Tensor
from dlverify.kept_index import Refusal, index_on_kept
from dlverify.ops.dtypes import exact_dtype
from dlverify.passes import fold
from dlverify.problem import Problem
from dlverify.rewrites import _drop_newly_dead, _uses

MAX_ONE_HOT = 1 << 28   # elements of a one-hot matrix the rewrite may create


@dataclass(frozen=True)
class RowGather:
    """The gather `op` as a lookup of rows of `operand` along dim `dim` by its start
    indices (whose last, index-vector dim has size 1); `along`: the take_along_axis
    form (batching over every other operand dim)."""

    op: Op
    operand: int
    dim: int
    along: bool


def _row_gather(g: Graph, op: Op) -> RowGather | None:
    """`op` as a take along one dim or a take_along_axis, else None."""
    p = op.params
    operand, idx = op.inputs[:2]
    o_shape, i_shape = g.tensors[operand].shape, g.tensors[idx].shape
    if len(op.inputs) != 2 or not i_shape or i_shape[-1] != 1 or p["index_vector_dim"] != len(i_shape) - 1:
        return None
    if len(p["collapsed_slice_dims"]) != 1 or tuple(p["start_index_map"]) != tuple(p["collapsed_slice_dims"]):
        return None
    dim = p["collapsed_slice_dims"][0]
    rest = tuple(d for d in range(len(o_shape)) if d != dim)
    batch_rank = len(i_shape) - 1
    if not p["operand_batching_dims"]:   # take(x, i, axis=dim)
        out = tuple(d for d in range(len(o_shape) - 1 + batch_rank) if not dim <= d < dim + batch_rank)
        if p["start_indices_batching_dims"] or tuple(p["offset_dims"]) != out or \
                tuple(p["slice_sizes"]) != tuple(1 if d == dim else o_shape[d] for d in range(len(o_shape))):
            return None
        return RowGather(op, operand, dim, False)
    if tuple(p["operand_batching_dims"]) != rest or tuple(p["start_indices_batching_dims"]) != rest or \
            p["offset_dims"] or tuple(p["slice_sizes"]) != (1,) * len(o_shape) or \
            batch_rank != len(o_shape) or any(i_shape[d] != o_shape[d] for d in rest):
        return None
    return RowGather(op, operand, dim, True)


class _Graph:
    """Op surgery on one graph: new ops are queued before the op being replaced."""

    def __init__(self, g: Graph, ids: IdAllocator, ranks: int, mesh) -> None:
        self.g, self.ids = g, ids
        self.facts = IndexFacts(g, ranks, fold(g, mesh).splat)
        self.producer = {op.output: op for op in g.ops}
        self.pending: list[Op] = []
        self.refused: list[Refusal] = []   # index bounds that cut kept rows (diagnoses)

    def new(self, kind: str, inputs: list[int], shape: tuple[int, ...], dtype: str, params: dict,
            like: Op, output: int | None = None) -> int:
        builder = GraphBuilder(Graph(self.g.name, tensors=self.g.tensors, ops=self.pending), self.ids)
        return builder.op(kind, inputs, shape, dtype, params, like.loc, like.name, output)

    def shape(self, t: int) -> tuple[int, ...]:
        return self.g.tensors[t].shape

    def one_hot_contraction(self, rg: RowGather, base: Affine, out_dims: tuple[int, ...],
                            like: Op, output: int) -> bool:
        """Queue onehot(base + c_r, n) contracted with the operand, shaped as the gather's
        output, into `output`. `out_dims`: where base's dims lie in the gather's output."""
        g, op = self.g, rg.op
        shape, dtype = self.shape(op.output), g.tensors[op.output].dtype
        n = self.shape(rg.operand)[rg.dim]
        idx_t = g.tensors[base.base]
        if any(g.tensors[t].dtype != idx_t.dtype for t, _ in base.terms):
            return False
        o_rank = len(self.shape(rg.operand))
        if rg.along:   # the output is the operand's shape with m picks along dim
            hot_shape = shape + (n,)
        else:          # the output is operand[:dim] + batch + operand[dim + 1:]
            batch = shape[rg.dim:rg.dim + len(shape) - o_rank + 1]
            hot_shape = batch + (n,)
            out_dims = tuple(d - rg.dim for d in out_dims)
            if any(not 0 <= d < len(batch) for d in out_dims):
                return False
        if int(np.prod(hot_shape)) > MAX_ONE_HOT:
            return False
        hot = self._one_hot(base, hot_shape, out_dims, like)
        last = len(hot_shape) - 1
        if rg.along:
            keep = tuple(d for d in range(o_rank) if d != rg.dim)
            params = {"lhs_contract": (last,), "rhs_contract": (rg.dim,), "lhs_batch": keep, "rhs_batch": keep}
            dot_shape = tuple(shape[d] for d in keep) + (shape[rg.dim],)
            perm = tuple(list(range(rg.dim)) + [o_rank - 1] + list(range(rg.dim, o_rank - 1)))
        else:
            params = {"lhs_contract": (last,), "rhs_contract": (rg.dim,), "lhs_batch": (), "rhs_batch": ()}
            rest = tuple(self.shape(rg.operand)[d] for d in range(o_rank) if d != rg.dim)
            dot_shape = hot_shape[:-1] + rest
            b = len(hot_shape) - 1
            perm = tuple(list(range(b, b + rg.dim)) + list(range(b)) + list(range(b + rg.dim, b + o_rank - 1)))
        if perm == tuple(range(len(perm))):
            self.new("dot_general", [hot, rg.operand], dot_shape, dtype, params, like, output=output)
        else:
            prod = self.new("dot_general", [hot, rg.operand], dot_shape, dtype, params, like)
            self.new("transpose", [prod], shape, dtype, {"permutation": perm}, like, output=output)
        return True

    def _one_hot(self, base: Affine, hot_shape: tuple[int, ...], dims: tuple[int, ...], like: Op) -> int:
        """Queue (broadcast(base) + c_r == iota) of hot_shape, iota along the last dim
        and base's dims at `dims`: base + c_r == j  <=>  base == j - c_r."""
        dtype, n = self.g.tensors[base.base].dtype, hot_shape[-1]
        ids = self.new("broadcast_in_dim", [base.base], hot_shape, dtype, {"broadcast_dimensions": dims}, like)
        cols = self.new("iota", [], (n,), dtype, {"dimension": 0}, like)
        first = None
        for t, sign in base.terms:
            term = t if sign > 0 else self.new("neg", [t], (), dtype, {}, like)
            first = term if first is None else self.new("add", [first, term], (), dtype, {}, like)
        if first is not None:
            first = self.new("broadcast_in_dim", [first], (n,), dtype, {"broadcast_dimensions": ()}, like)
            cols = self.new("sub", [cols, first], (n,), dtype, {}, like)
        cols = self.new("broadcast_in_dim", [cols], hot_shape, dtype,
                        {"broadcast_dimensions": (len(hot_shape) - 1,)}, like)
        return self.new("eq", [ids, cols], hot_shape, "bool", {}, like)

    def index_affine(self, rg: RowGather) -> tuple[Affine, tuple[int, ...]] | None:
        """The gather's index as base + c_r, and where base's dims lie in the output."""
        idx = rg.op.inputs[1]
        aff = self.facts.affine(idx)
        if aff is None:
            return None
        last = len(self.shape(idx)) - 1
        if last in aff.dims:
            return None
        return aff, aff.dims   # the output's dims are the index's dims without the vector dim

    def in_bounds(self, rg: RowGather) -> tuple[Affine, tuple[int, ...]] | None:
        """The index proved in [0, n) on every rank: its affine form."""
        got = self.index_affine(rg)
        vals = self.facts.values(rg.op.inputs[1])
        n = self.shape(rg.operand)[rg.dim]
        if got is None or vals is None or not all(subset(v, ((0, n),)) for v in vals):
            return None
        return got

    # ------------------------------------------------------------------ masked gathers
    def _inverse_dims(self, op: Op, dims: tuple[int, ...]) -> tuple[int, ...] | None:
        """Where dims of a broadcast_in_dim / reshape output come from in its operand."""
        src, out = self.shape(op.inputs[0]), self.shape(op.output)
        if op.kind == "broadcast_in_dim":
            bd = list(op.params["broadcast_dimensions"])
            if any(d not in bd or src[bd.index(d)] != out[d] for d in dims):
                return None
            return tuple(bd.index(d) for d in dims)
        where = unit_reshape_dims(src, out)
        back = {} if where is None else {e: d for d, e in where.items()}
        if any(d not in back for d in dims):
            return None
        return tuple(back[d] for d in dims)

    def _case_on_kept(self, op: Op, base: int, dims: tuple[int, ...],
                      kept: tuple[Intervals, ...]) -> int | None:
        """The case select_n `op` takes at every kept position, on every rank."""
        picked = self.facts.bool_splat(op.inputs[0])
        if picked is not None:
            return 2 if picked[0] else 1 if len(set(picked)) == 1 else None
        pred = self.facts.predicate(op.inputs[0])
        vals = self.facts.values(base)
        if pred is None or vals is None or (pred.base, pred.dims) != (base, dims):
            return None
        cases = set()
        for r, k in enumerate(kept):
            where = intersect(vals[r], k)
            if subset(where, pred.sets[r]):
                cases.add(2)
            elif intersect(where, pred.sets[r]) == ():
                cases.add(1)
            else:
                return None
        return cases.pop() if len(cases) == 1 else None

    def _trace(self, t: int, base: int, dims: tuple[int, ...], kept: tuple[Intervals, ...],
               stop, moves: tuple[str, ...]) -> tuple[int, tuple[int, ...]] | None:
        """Follow t back through `moves` (size-1 reshapes, broadcasts) and selects decided
        on the kept positions until `stop(t, dims)`; returns that tensor and base's dims in it."""
        for _ in range(64):
            if stop(t, dims):
                return t, dims
            op = self.producer.get(t)
            if op is None:
                return None
            if op.kind in moves:
                dims = self._inverse_dims(op, dims)
                if dims is None:
                    return None
                t = op.inputs[0]
            elif op.kind == "select_n" and len(op.inputs) == 3:
                case = self._case_on_kept(op, base, dims, kept)
                if case is None:
                    return None
                t = op.inputs[case]
            else:
                return None
        return None

    def masked(self, op: Op) -> RowGather | None:
        """Rewrite select_n(mask, rows, 0) as described in the module docstring."""
        if len(op.inputs) != 3 or exact_dtype(self.g.tensors[op.output].dtype) is not None:
            return None   # a float result: the one-hot contraction computes over the reals
        splat = self.facts.splat
        for zero in (1, 2):
            z = op.inputs[zero]
            if self.g.tensors[z].dtype in ("bool",) or splat.get(z) is None or \
                    any(float(v) != 0.0 for v in splat[z]):
                continue
            pred = self.facts.predicate(op.inputs[0])
            vals = self.facts.values(pred.base) if pred is not None else None
            if pred is None or vals is None:
                continue
            # rows are kept where the select takes the other case
            kept = tuple(s if zero == 1 else complement(s) for s in pred.sets)
            kept = tuple(intersect(v, k) for v, k in zip(vals, kept))
            # the rows: the gather's output up to size-1 reshapes (then one reshape
            # rebuilds the select's shape) and selects that keep it on the kept rows
            found = self._trace(op.inputs[3 - zero], pred.base, pred.dims, kept,
                                lambda t, _d: self._gather_at(t) is not None, ("reshape",))
            if found is None:
                continue
            rg = self._gather_at(found[0])
            out_dims = found[1]
            b = rg.dim if not rg.along else 0
            idx_dims = tuple(d - b for d in out_dims)
            idx = rg.op.inputs[1]
            if any(not 0 <= d < len(self.shape(idx)) - 1 for d in idx_dims):
                continue
            src = index_on_kept(self, idx, pred.base, idx_dims, kept, self.refused)
            if src is None:
                continue
            aff = src[1]
            n = self.shape(rg.operand)[rg.dim]
            # kept exactly where base + c_r lies in [0, n)
            if any(intersect(v, shift(((0, n),), -c)) != k for v, c, k in zip(vals, aff.offset, kept)):
                continue
            target = op.output if self.shape(op.output) == self.shape(rg.op.output) else None
            mark = len(self.pending)
            fresh = target if target is not None else self._fresh(rg.op.output)
            if not self.one_hot_contraction(rg, aff, out_dims, op, fresh):
                del self.pending[mark:]
                continue
            if target is None:
                self.new("reshape", [fresh], self.shape(op.output), self.g.tensors[op.output].dtype,
                         {}, op, output=op.output)
            return rg
        return None

    def _zero_masked(self, t: int):
        """t = select_n(p, x, 0) or select_n(p, 0, x) with p a predicate: (p, x, kept sets)."""
        op = self.producer.get(t)
        if op is None or op.kind != "select_n" or len(op.inputs) != 3:
            return None
        for zero in (1, 2):
            z = self.facts.splat.get(op.inputs[zero])
            pred = self.facts.predicate(op.inputs[0])
            vals = self.facts.values(pred.base) if pred is not None else None
            if z is None or any(float(v) != 0.0 for v in z) or vals is None:
                continue
            kept = tuple(intersect(v, s if zero == 1 else complement(s)) for v, s in zip(vals, pred.sets))
            return pred, op.inputs[3 - zero], kept
        return None

    def masked_contraction(self, op: Op) -> bool:
        """dot_general(onehot(j, n), select_n(mask, u, 0)) contracting the one-hot's index
        dims with the masked dims, where j = base + c_r on the kept rows and a row is kept
        exactly where base + c_r lies in [0, n): the masked rows add nothing, and the
        one-hot rows of base + c_r are zero there, so it is dot_general(onehot(base + c_r),
        u) (the gradient of a masked lookup, scatter.py's one-hot scatter-add)."""
        p = op.params
        if len(op.inputs) != 2 or exact_dtype(self.g.tensors[op.output].dtype) is not None:
            return False
        hot, masked = op.inputs
        found = self._zero_masked(masked)
        layout = self.producer.get(masked)
        if found is None and layout is not None and layout.kind in ("broadcast_in_dim", "reshape"):
            found = self._zero_masked(layout.inputs[0])   # the mask, then a broadcast or reshape
            moved = None if found is None else self.facts.moved_dims(
                layout, found[0].dims, self.shape(layout.inputs[0]), self.shape(masked))
            if moved is None:
                return False
            found = (replace(found[0], dims=moved),) + found[1:]
        else:
            layout = None
        eq = self.producer.get(hot)
        if found is None or eq is None or eq.kind != "eq":
            return False
        pred, unmasked, kept = found
        # base's dims in the one-hot: the operand dims contracted or batched with the mask's
        pairs = dict(zip(p["rhs_contract"], p["lhs_contract"])) | dict(zip(p["rhs_batch"], p["lhs_batch"]))
        if any(d not in pairs for d in pred.dims):
            return False
        dims = tuple(pairs[d] for d in pred.dims)
        h_shape = self.shape(hot)
        last, n = len(h_shape) - 1, h_shape[-1]
        if last in p["lhs_contract"] or last in p["lhs_batch"]:
            return False
        for i in (0, 1):
            if not self._iota_columns(eq.inputs[1 - i], last):
                continue
            src = index_on_kept(self, eq.inputs[i], pred.base, dims, kept)
            if src is None:
                continue
            aff = src[1]
            vals = self.facts.values(pred.base)
            if any(intersect(v, shift(((0, n),), -c)) != k for v, c, k in zip(vals, aff.offset, kept)):
                continue
            if any(self.g.tensors[t].dtype != self.g.tensors[pred.base].dtype for t, _ in aff.terms):
                continue
            new_hot = self._one_hot(aff, h_shape, dims, op)
            if layout is not None:
                unmasked = self.new(layout.kind, [unmasked], self.shape(masked),
                                    self.g.tensors[masked].dtype, layout.params, layout)
            self.new("dot_general", [new_hot, unmasked], self.shape(op.output),
                     self.g.tensors[op.output].dtype, p, op, output=op.output)
            return True
        return False

    def canonical_one_hot(self, op: Op) -> bool:
        """eq(a, iota columns) with a = broadcast(base) + c_r: the same one-hot built
        from base (exact for every input: an affine form is an equality)."""
        shape = self.shape(op.output)
        if not shape:
            return False
        last = len(shape) - 1
        for i in (0, 1):
            aff = self.facts.affine(op.inputs[i])
            if not self._iota_columns(op.inputs[1 - i], last) or aff is None or aff.base == op.inputs[i] \
                    or last in aff.dims:
                continue
            if any(self.g.tensors[t].dtype != self.g.tensors[aff.base].dtype for t, _ in aff.terms):
                continue
            hot = self._one_hot(aff, shape, aff.dims, op)
            self.pending[-1].output = op.output   # the rebuilt eq produces the original output
            del self.g.tensors[hot]
            return True
        return False

    def _iota_columns(self, t: int, last: int) -> bool:
        """t is an iota of the last dim's size broadcast along the last dim."""
        op = self.producer.get(t)
        if op is None or op.kind != "broadcast_in_dim" or tuple(op.params["broadcast_dimensions"]) != (last,):
            return False
        src = self.producer.get(op.inputs[0])
        return src is not None and src.kind == "iota" and src.params["dimension"] == 0 and \
            self.shape(src.output) == (self.shape(t)[last],)

    def _fresh(self, like: int) -> int:
        t = self.ids()
        src = self.g.tensors[like]
        self.g.tensors[t] = Tensor(t, src.shape, src.dtype, src.name)
        return t

    def clamped_index(self, rg: RowGather) -> tuple[Affine, tuple[int, ...]] | None:
        """A take's (or take_along_axis's) index reshape(y) (y with the size-1 index
        vector dim appended) as clamp(0, y, n - 1), queued: the gather clamps its start
        indices into the table (a row gather: slice size 1 along the dim; batching dims
        start at their own index), so both read the same rows."""
        r = self.producer.get(rg.op.inputs[1])
        if r is None or r.kind != "reshape":
            return None
        y, idx = r.inputs[0], rg.op.inputs[1]
        dims = self.facts.moved_dims(r, tuple(range(len(self.shape(y)))), self.shape(y), self.shape(idx))
        dtype = self.g.tensors[y].dtype
        if dims is None or len(self.shape(idx)) - 1 in dims or exact_dtype(dtype) is None:
            return None
        n = self.shape(rg.operand)[rg.dim]
        lo, hi = (self.new("broadcast_in_dim", [self.new("constant", [], (), dtype,
                                                           {"value": np.asarray(v, dtype)}, rg.op)],
                           self.shape(y), dtype, {"broadcast_dimensions": ()}, rg.op)
                  for v in (0, n - 1))
        base = self.new("clamp", [lo, y, hi], self.shape(y), dtype, {}, rg.op)
        return Affine(base, dims, (0,) * self.facts.ranks), dims

    def _gather_at(self, t: int) -> RowGather | None:
        op = self.producer.get(t)
        return _row_gather(self.g, op) if op is not None and op.kind == "gather" else None


def _splice(g: Graph, before: dict[int, list[Op]], replaced: set[int]) -> None:
    """New ops go right before the op they replace (inputs are all earlier). The new
    ops' own tensors are not the program's dead values: a one-hot rebuilt for a
    product that another rewrite then replaced goes with the old one."""
    uses = _uses(g)
    fresh = {o.output for ops in before.values() for o in ops} - \
        {op.output for op in g.ops if op.id in replaced}
    unused_before = {t for t in g.tensors if uses[t] == 0 and t not in fresh}
    ops = []
    for op in g.ops:
        ops.extend(before.get(op.id, []))
        if op.id not in replaced:
            ops.append(op)
    g.ops = ops
    _drop_newly_dead(g, unused_before)


def _splat_scalar(g: Graph, producer: dict[int, Op], t: int) -> int | None:
    """The rank-0 tensor that t broadcasts (t a broadcast_in_dim of one element)."""
    op = producer.get(t)
    if op is None or op.kind != "broadcast_in_dim" or int(np.prod(g.tensors[op.inputs[0]].shape)) != 1:
        return None
    return op.inputs[0]


def _clamps_before_unit_reshapes(g: Graph, ids: IdAllocator) -> bool:
    """clamp(lo, reshape(y), hi), the reshape only inserting size-1 dims (y's own
    size-1 dims kept or moved) and lo, hi splats, is reshape(clamp(lo, y, hi)) (clamp
    is elementwise): XLA's partitioned lookup clamps its ids after appending the index
    vector dim."""
    producer = {op.output: op for op in g.ops}
    out, changed = [], False
    b = GraphBuilder(Graph(g.name, tensors=g.tensors, ops=out), ids)
    for op in g.ops:
        r = producer.get(op.inputs[1]) if op.kind == "clamp" and len(op.inputs) == 3 else None
        bounds = [_splat_scalar(g, producer, t) for t in (op.inputs[0], op.inputs[2])] if r else []
        if r is None or r.kind != "reshape" or None in bounds:
            out.append(op)
            continue
        y = r.inputs[0]
        src, dst = g.tensors[y].shape, g.tensors[r.output].shape
        if [n for n in src if n != 1] != [n for n in dst if n != 1] or len(dst) <= len(src):
            out.append(op)
            continue
        dtype = g.tensors[op.output].dtype
        lo, hi = (b.op("broadcast_in_dim", [b.op("reshape", [s], (), g.tensors[s].dtype, {}, op.loc, op.name)],
                       src, g.tensors[s].dtype, {"broadcast_dimensions": ()}, op.loc, op.name)
                  for s in bounds)
        clamped = b.op("clamp", [lo, y, hi], src, dtype, {}, op.loc, op.name)
        b.op("reshape", [clamped], dst, dtype, {}, r.loc, r.name, output=op.output)
        changed = True
    if changed:
        g.ops = out
    return changed


def _rewrite_in_bounds(gs: _Graph, skip: set[int]) -> tuple[dict[int, list[Op]], set[int]]:
    """In-bounds gathers as one-hot contractions, and every one-hot (index == iota)
    whose index is an affine form rebuilt from its base, so that one-hots built from
    the same ids through different reshapes (a lookup's, its gradient's) meet."""
    before: dict[int, list[Op]] = {}
    replaced: set[int] = set()
    for op in gs.g.ops:
        if op.kind == "eq" and op.id not in skip:
            gs.pending = []
            if gs.canonical_one_hot(op):
                before[op.id] = gs.pending
                replaced.add(op.id)
            continue
        if op.kind != "gather" or op.id in skip:
            continue
        rg = _row_gather(gs.g, op)
        got = gs.in_bounds(rg) if rg is not None else None
        gs.pending = []
        if got is None and rg is not None:
            got = gs.clamped_index(rg)
        if got is None:
            continue
        aff, dims = got
        out_dims = tuple(d + (0 if rg.along else rg.dim) for d in dims)
        if gs.one_hot_contraction(rg, aff, out_dims, op, op.output):
            before[op.id] = gs.pending
            replaced.add(op.id)
    return before, replaced


def rewrite_masked_gathers(problem: Problem) -> bool:
    """Rewrite the distributed masked gathers, and then the in-bounds gathers of both
    graphs, as one-hot contractions. Nothing changes unless a masked gather is found."""
    if not any(op.kind in ("gather", "eq") for op in problem.dist.ops):
        return False   # no fold of the distributed graph for nothing
    for g in (problem.seq, problem.dist):
        _clamps_before_unit_reshapes(g, problem.ids)
    dist = _Graph(problem.dist, problem.ids, problem.mesh.size, problem.mesh)
    before: dict[int, list[Op]] = {}
    replaced: set[int] = set()
    gathers: set[int] = set()
    for op in problem.dist.ops:
        dist.pending = []
        if op.kind == "select_n":
            refused = len(dist.refused)
            rg = dist.masked(op)
            if rg is not None:
                gathers.add(rg.op.id)
                del dist.refused[refused:]   # another way of reading it succeeded
        elif op.kind != "dot_general" or not dist.masked_contraction(op):
            continue
        if dist.pending:
            before[op.id] = dist.pending
            replaced.add(op.id)
    problem.diagnoses.extend(dist.refused)
    if not replaced:
        return False
    more, more_replaced = _rewrite_in_bounds(dist, gathers)
    before.update(more)
    _splice(problem.dist, before, replaced | more_replaced)
    seq = _Graph(problem.seq, problem.ids, 1, None)
    before, replaced = _rewrite_in_bounds(seq, set())
    _splice(problem.seq, before, replaced)
    return True
