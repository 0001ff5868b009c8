"""HLO scatter: with an add combiner, in the forms jax.grad of a gather emits
(jnp.take's and take_along_axis's transposes, before and after XLA rewrites
batching dims into iota index columns, and may flatten the index batch dims
around them: _unflattened): every window is one element along the
indexed dims and whole along the others. It becomes the contraction it equals,
as the jaxpr frontend builds it (frontends/jaxpr/scatter.py):

    out = operand + transpose(onehot(indices)^T . updates)

where onehot holds, for every update position s and indexed position j,
`and_k (idx[s][k] == j_k)` (the scattered dims' iotas), and the batching dims
(`input_batching_dims` with `scatter_indices_batching_dims`) are batch dims of
the dot. An index out of range matches no position: its update is dropped, as
XLA's CPU and GPU scatters drop an out-of-bounds window (its spec leaves it to
the implementation; noted as an assumption unless the indices are known to be
in range). A scatter whose indices are known before run time, with any
combiner or an overwriting reducer (`.at[i].set` as the SPMD partitioner leaves
it), is the window updates it is (dlverify/scatter_windows.py, shared with the
jaxpr frontend). Any other form (several operands, data-dependent indices
of another combiner) is an UnknownOpError at the scatter's line."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import ints
from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.frontends.hlo.ops.window_select import fold_selection_scatter
from dlverify.ir import Op, SourceLoc
from dlverify.errors import UnknownOpError
from dlverify.ops.dtypes import is_int_dtype
from dlverify.scatter_windows import ScatterSite, WindowScatter, window_updates

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer

# reducer opcode -> the combining kind ("set": the reducer returns the update)
_COMBINE = {"add": "add", "multiply": "mul", "minimum": "min", "maximum": "max",
            "overwrite": "set"}


def _index_columns(L: Lowerer, ins: HloInstruction, idx: int, ivd: int, m: int,
                   loc: SourceLoc) -> list[int]:
    """Component k of every index vector, shaped as the indices without dim ivd."""
    shape, dt = L.shape_of(idx), L.dtype_of(idx)
    if ivd == len(shape):
        return [idx]
    batch = shape[:ivd] + shape[ivd + 1:]
    out = []
    for k in range(m):
        lo = [0] * len(shape)
        hi = list(shape)
        lo[ivd], hi[ivd] = k, k + 1
        s = L.emit("slice", [idx], tuple(h - l for l, h in zip(lo, hi)), dt,
                   {"start_indices": tuple(lo), "limit_indices": tuple(hi), "strides": None},
                   loc, ins.name)
        out.append(L.emit("reshape", [s], batch, dt, {}, loc, ins.name))
    return out


def _one_hot(L: Lowerer, ins: HloInstruction, cols: list[int], sizes: list[int],
             loc: SourceLoc) -> int:
    """bool[S + sizes]: and_k (cols[k][s] == j_k)."""
    batch = L.shape_of(cols[0])
    shape = batch + tuple(sizes)
    hot = None
    for k, (c, n) in enumerate(zip(cols, sizes)):
        dt = L.dtype_of(c)
        ids = L.emit("broadcast_in_dim", [c], shape, dt,
                     {"broadcast_dimensions": tuple(range(len(batch)))}, loc, ins.name)
        iota = L.emit("iota", [], (n,), dt, {"dimension": 0}, loc, ins.name)
        pos = L.emit("broadcast_in_dim", [iota], shape, dt,
                     {"broadcast_dimensions": (len(batch) + k,)}, loc, ins.name)
        eq = L.emit("eq", [ids, pos], shape, "bool", {}, loc, ins.name)
        hot = eq if hot is None else L.emit("and", [hot, eq], shape, "bool", {}, loc, ins.name)
    return hot


def _in_range(known: np.ndarray | None, ivd: int, K: tuple[int, ...],
              O: tuple[int, ...]) -> bool:
    """Known indices, every component within its operand dim."""
    if known is None:
        return False
    v = np.asarray(known)
    v = np.moveaxis(v, ivd, -1) if ivd < v.ndim else v[..., None]
    return all(((v[..., j] >= 0) & (v[..., j] < O[k])).all() for j, k in enumerate(K))


def _iota_columns_batched(L: Lowerer, ins: HloInstruction, producer: dict[int, Op], idx: int,
                          ivd: int, K: list[int], b_op: list[int], b_idx: list[int],
                          O: tuple[int, ...], I: tuple[int, ...], loc: SourceLoc):
    """XLA writes a batching dim as an index column that is an iota along an index
    batch dim of the operand dim's size (dlverify/simplify_int.iota_columns): each
    update then lands at its own position of that dim, which is what a batching
    dim says. Such a column becomes a batching dim (a batch dim of the dot) instead
    of a one-hot factor [s_d == j] contracted over s (the same sum: one term per
    j, all in range), as the module before optimisations writes it. Returns the
    new (K, b_op, b_idx, index columns), the columns None when no column is an iota;
    a window of size 1 left for the dim is dropped. The columns kept are the
    concatenated parts (reshaped to the index batch shape), not cut out of the
    indices, so that the rules see the index they were built from."""
    from dlverify.simplify_int import index_parts, iota_columns

    if ivd >= len(I):
        return K, b_op, b_idx, None
    found = iota_columns(producer, L.shape_of, idx, ivd)
    taken = {k: d for k, d in found.items()
             if O[K[k]] == I[d] and d not in b_idx and d != ivd}
    if not taken or len(taken) == len(K):   # (one column stays: the scattered dim)
        return K, b_op, b_idx, None
    parts = index_parts(producer, L.shape_of, idx, ivd)[0]
    keep = [k for k in range(len(K)) if k not in taken]
    batch = I[:ivd] + I[ivd + 1:]
    cols = [L.emit("reshape", [parts[k]], batch, L.dtype_of(idx), {}, loc, ins.name) for k in keep]
    return ([K[k] for k in keep], list(b_op) + [K[k] for k in taken],
            list(b_idx) + [taken[k] for k in taken], cols)


def _unflattened(L: Lowerer, ins: HloInstruction, producer: dict[int, Op], idx: int, upd: int,
                 ivd: int, windows: list[int], loc: SourceLoc
                 ) -> tuple[int, int, int, list[int]]:
    """XLA flattens a scatter's index batch dims after optimisations: top_k's gradient
    scatters at indices [n*k, 2] reshaped from [n, k, 2], an iota column of the tokens
    beside the chosen experts (a batching dim written as an index column, which
    _iota_columns_batched cannot see through the merge). With one index batch dim,
    the index vector dim last, and the indices a reshape of X = B' + (m,) whose dims
    of size > 1, B, are two or more and hold an iota column: the scatter at indices
    B + (m,) (X without its size-1 batch dims) with the updates' scatter dim split
    into B (both row-major) pairs every index vector with the same update, so it is
    the same scatter, and the column is a batching dim again. A reshape that only
    adds or drops size-1 dims is left alone: simplify_int.index_parts already sees
    through it. Returns (indices, updates, index vector dim, update window dims)."""
    I, U = L.shape_of(idx), L.shape_of(upd)
    src = producer.get(idx)
    if len(I) != 2 or ivd != 1 or src is None or src.kind != "reshape":
        return idx, upd, ivd, windows
    x = src.inputs[0]
    X = L.shape_of(x)
    B = tuple(n for n in X[:-1] if n != 1)
    if len(B) < 2 or X[-1] != I[1] or int(np.prod(B)) != I[0]:
        return idx, upd, ivd, windows
    scattered = [d for d in range(len(U)) if d not in windows]
    if len(scattered) != 1 or U[scattered[0]] != I[0]:
        return idx, upd, ivd, windows
    from dlverify.simplify_int import iota_columns
    if not iota_columns(producer, L.shape_of, x, len(X) - 1):
        return idx, upd, ivd, windows   # nothing to see there: the form stays as XLA wrote it
    split_idx = x if X[:-1] == B else L.emit("reshape", [x], B + X[-1:], L.dtype_of(x), {},
                                               loc, ins.name)
    sd = scattered[0]
    split = tuple(U[:sd]) + B + tuple(U[sd + 1:])
    moved = [w + len(B) - 1 if w > sd else w for w in windows]
    return split_idx, _reshaped(L, ins, producer, upd, split, loc), len(B), moved


def _reshaped(L: Lowerer, ins: HloInstruction, producer: dict[int, Op], t: int,
              shape: tuple[int, ...], loc: SourceLoc) -> int:
    """t reshaped (a reshape of a reshape is one reshape of its source: XLA's
    updates are often a bitcast of the masked cotangent, dlverify/masked_gather.py
    looks through one layout op; a reshaped splat is a splat)."""
    while t in producer and producer[t].kind == "reshape":
        t = producer[t].inputs[0]
    if L.shape_of(t) == shape:
        return t
    src = producer.get(t)
    if src is not None and src.kind == "broadcast_in_dim" and not L.shape_of(src.inputs[0]):
        # a splat (the cotangent of a mean) stays a splat of the new shape
        return L.emit("broadcast_in_dim", [src.inputs[0]], shape, L.dtype_of(t),
                      {"broadcast_dimensions": ()}, loc, ins.name)
    return L.emit("reshape", [t], shape, L.dtype_of(t), {}, loc, ins.name)


@handler("scatter")
def _scatter(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    if len(ops) != 3 or ins.shape.is_tuple:
        raise L.unknown(ins, "scatter of several operands is not supported")
    combine = L.reducer(ins, _COMBINE)
    operand, idx, upd = (L.tid(ins, v) for v in ops)
    known = L.known.get(idx)
    batched = ins.attrs.get("input_batching_dims") or ins.attrs.get("scatter_indices_batching_dims")
    if combine == "add":
        folded = fold_selection_scatter(L, ins, operand, idx, upd, loc)
        if folded is not None:
            return folded
        try:
            return _one_hot_add(L, ins, operand, idx, upd, loc)
        except UnknownOpError:
            if known is None or batched:
                raise
    elif known is None or batched:
        raise L.unknown(ins, f"scatter ({combine}) whose indices are not known before run "
                             f"time, or with batching dims, is not supported")
    return _windows(L, ins, operand, idx, upd, known, combine, loc)


def _windows(L: Lowerer, ins: HloInstruction, operand: int, idx: int, upd: int,
             known: np.ndarray, combine: str, loc: SourceLoc) -> int:
    """Indices known before run time: the window updates (dlverify/scatter_windows.py)."""
    dtype = L.array_shape(ins).dtype
    if L.shape_of(operand) != L.array_shape(ins).dims:
        raise L.err(ins, "scatter result does not have its operand's shape")
    ivd_attr = ints(ins.attrs.get("index_vector_dim"))

    def emit(kind: str, inputs: list[int], out: tuple[int, ...], dt: str, params: dict) -> int:
        return L.emit(kind, inputs, out, dt, params, loc, ins.name)

    def index(v: int) -> int:
        val = np.asarray(v, dtype=np.int32)
        c = L.b.constant(val, (), "int32", loc, ins.name)
        L.known[c] = val
        return c

    site = ScatterSite(emit, index, lambda why: L.unknown(ins, f"scatter {why}"))
    return window_updates(site, WindowScatter(
        operand, L.shape_of(operand), dtype, upd, L.shape_of(upd), L.dtype_of(upd),
        np.asarray(known), ivd_attr[0] if ivd_attr else np.ndim(known),
        ints(ins.attrs.get("update_window_dims")), ints(ins.attrs.get("inserted_window_dims")),
        ints(ins.attrs.get("scatter_dims_to_operand_dims")),
        None if combine == "set" else combine, False))


def _one_hot_add(L: Lowerer, ins: HloInstruction, operand: int, idx: int, upd: int,
                 loc: SourceLoc) -> int:
    """A scatter-add of windows of one element along the indexed dims and whole along
    the others, as the contraction it equals (the module docstring)."""
    O, I, U = L.shape_of(operand), L.shape_of(idx), L.shape_of(upd)
    # the result's declared type: a convert from pred is an identity of the IR, so
    # operand and updates may be bool while their sums are not
    dtype = L.array_shape(ins).dtype
    windows = ints(ins.attrs.get("update_window_dims"))
    inserted = ints(ins.attrs.get("inserted_window_dims"))
    K = ints(ins.attrs.get("scatter_dims_to_operand_dims"))
    b_op = ints(ins.attrs.get("input_batching_dims"))
    b_idx = ints(ins.attrs.get("scatter_indices_batching_dims"))
    ivd_attr = ints(ins.attrs.get("index_vector_dim"))
    ivd = ivd_attr[0] if ivd_attr else len(I)
    producer = {op.output: op for op in L.b.graph.ops}   # (the index's and updates' makers)
    unflat = _unflattened(L, ins, producer, idx, upd, ivd, windows, loc)
    if unflat[0] != idx:
        idx, upd, ivd, windows = unflat
        # the new makers too: the size-1 squeeze below must see the updates' new reshape
        # and reshape its source once (with the stale map the updates became a reshape
        # of a reshape and the compiled vocab-parallel gradient no longer verified, at
        # its index-range masks: 'operand 1: no view')
        producer = {op.output: op for op in L.b.graph.ops}
        I, U = L.shape_of(idx), L.shape_of(upd)
    refuse = ("scatter is supported as a scatter-add of windows of one element along the "
              "indexed dims and whole along the others (jax.grad of a gather)")
    free = [k for k in range(len(O)) if k not in inserted and k not in b_op]
    scatter_dims = [d for d in range(len(U)) if d not in windows]
    idx_dims = [d for d in range(len(I)) if d != ivd]
    m = I[ivd] if ivd < len(I) else 1
    if not is_int_dtype(L.dtype_of(idx)) or len(K) != m or len(set(K)) != m or \
            len(b_op) != len(b_idx) or len(free) != len(windows) or \
            len(scatter_dims) != len(idx_dims) or L.array_shape(ins).dims != O or \
            L.dtype_of(upd) != L.dtype_of(operand) or not set(inserted) <= set(K) or \
            set(b_op) & set(K):
        raise L.unknown(ins, f"{refuse}; malformed or other dimension numbers")
    wsize = {k: U[w] for k, w in zip(free, windows)}
    if any(wsize.get(k, 1) != 1 for k in K) or \
            any(wsize[k] != O[k] for k in free if k not in K) or \
            [U[d] for d in scatter_dims] != [I[d] for d in idx_dims] or \
            any(O[a] != I[b] for a, b in zip(b_op, b_idx)):
        raise L.unknown(ins, f"{refuse}; this one has partial windows or misaligned dims")
    if not _in_range(L.known.get(idx), ivd, K, O):
        L.assume(f"scatter {ins.name} ({L.file}:{ins.line}): an update whose index is out of "
                 f"bounds is dropped (XLA's CPU and GPU behaviour; its spec leaves it to the "
                 f"implementation)")
    K, b_op, b_idx, cols = _iota_columns_batched(L, ins, producer, idx, ivd, K, b_op, b_idx, O, I, loc)
    if cols is None:
        cols = _index_columns(L, ins, idx, ivd, m, loc)
    # positions of the index batch dims S: batching ones become dot batch dims
    pos = {d: p for p, d in enumerate(idx_dims)}
    batch_p = [pos[d] for d in b_idx]
    # Dims that carry one term each are squeezed out of the columns and the updates
    # (a sum of one term is that term): index batch dims of size 1 that are not
    # batching, and the one-element windows of indexed or batched dims. The product
    # then has one form whether XLA kept such a dim (after optimisations) or not.
    keep_p = [p for p in range(len(idx_dims)) if I[idx_dims[p]] != 1 or p in batch_p]
    keep_w = [j for j, k in enumerate(free) if k not in K and k not in b_op]
    kept_u = sorted([scatter_dims[p] for p in keep_p] + [windows[j] for j in keep_w])
    if len(kept_u) != len(U):
        at = {d: i for i, d in enumerate(kept_u)}
        cols = [L.emit("reshape", [c], tuple(I[idx_dims[p]] for p in keep_p), L.dtype_of(c), {},
                       loc, ins.name) for c in cols]
        upd = _reshaped(L, ins, producer, upd, tuple(U[d] for d in kept_u), loc)
        scatter_dims = [at[scatter_dims[p]] for p in keep_p]
        windows = [at[windows[j]] for j in keep_w]
        free = [free[j] for j in keep_w]
        U = L.shape_of(upd)
        batch_p = [keep_p.index(p) for p in batch_p]
    hot = _one_hot(L, ins, cols, [O[k] for k in K], loc)
    lhs_batch = tuple(batch_p)
    lhs_contract = tuple(p for p in range(len(scatter_dims)) if p not in lhs_batch)
    rhs_batch = tuple(scatter_dims[p] for p in lhs_batch)
    rhs_contract = tuple(scatter_dims[p] for p in lhs_contract)
    labels = list(b_op) + list(K) + list(free)
    dims = tuple(O[k] for k in b_op) + tuple(O[k] for k in K) + tuple(U[w] for w in windows)
    rows = L.emit("dot_general", [hot, upd], dims, dtype,
                  {"lhs_contract": lhs_contract, "rhs_contract": rhs_contract,
                   "lhs_batch": lhs_batch, "rhs_batch": rhs_batch}, loc, ins.name)
    perm = tuple(labels.index(k) for k in range(len(O)))
    if perm != tuple(range(len(O))):
        rows = L.emit("transpose", [rows], O, dtype, {"permutation": perm}, loc, ins.name)
    return L.emit("add", [operand, rows], O, dtype, {}, loc, ins.name)
