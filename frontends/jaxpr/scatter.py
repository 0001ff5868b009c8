"""Exporters of `scatter`, `scatter-add`, `scatter-mul`, `scatter-min` and
`scatter-max` whose indices are known before run time (`x.at[2].set(v)`,
`x.at[1:3].add(v)`, a pipeline's output buffer written at a static step), and
of a scatter-add of whole rows at data-dependent indices (the gradient of
`jnp.take`) as a contraction with a one-hot matrix.

With known indices a scatter is a sequence of window updates, one per index
vector (XLA's operation semantics: each update window is placed at the start
its index vector gives, in the dims of `scatter_dims_to_operand_dims`; the
operand dims in `inserted_window_dims` have a window of size 1):

    set:      out = dynamic_update_slice(out, window, start)
    combine:  out = dynamic_update_slice(out, f(slice(out, window), window), start)

which the rules already relate. Indices that depend on data or on the rank,
batching dims, overlapping windows of a `set` (XLA leaves their order
unspecified) and windows out of bounds (dropped or implementation-defined)
are refused at the scatter's line.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dlverify.errors import UnknownOpError
from dlverify.frontends.jaxpr.walk import Ctx, _loc, _out, _where, exporter
from dlverify.scatter_windows import ScatterSite, WindowScatter, window_updates

_COMBINE = {"scatter": None, "scatter-add": "add", "scatter_add": "add", "scatter-mul": "mul",
            "scatter_mul": "mul", "scatter-min": "min", "scatter_min": "min",
            "scatter-max": "max", "scatter_max": "max"}


def _refuse(eqn: Any, why: str) -> UnknownOpError:
    return UnknownOpError(f"{eqn.primitive.name} {why}", *_where(eqn))


@exporter(*_COMBINE)
def _scatter(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    operand, indices_t, updates = ins[:3]
    if len(ins) != 3:
        raise _refuse(eqn, "of several operands is not supported")
    dn = eqn.params["dimension_numbers"]
    indices = ctx.known.value(ctx.b.graph, indices_t)
    if indices is None and _COMBINE[eqn.primitive.name] == "add":
        rows = _one_hot_scatter_add(ctx, eqn, ins)
        if rows is not None:
            return [rows]
    if tuple(dn.operand_batching_dims) or tuple(dn.scatter_indices_batching_dims):
        raise _refuse(eqn, "with batching dims is not supported")
    if indices is None:
        raise _refuse(eqn, "whose indices are not known before run time (they depend on data "
                           "or on the rank) is supported only as the transpose of a row lookup "
                           "(jnp.take's gradient)")
    g = ctx.b.graph
    op_t, upd = g.tensors[operand], g.tensors[updates]
    _, dtype = _out(eqn)
    loc = _loc(eqn)
    name = eqn.primitive.name

    def emit(kind: str, inputs: list[int], out: tuple[int, ...], dt: str, params: dict) -> int:
        return ctx.b.op(kind, inputs, out, dt, params, loc, name)

    def index(v: int) -> int:
        return ctx.b.constant(np.asarray(v, dtype=np.int32), (), "int32", loc)

    vectors = np.asarray(indices)
    return [window_updates(ScatterSite(emit, index, lambda why: _refuse(eqn, why)), WindowScatter(
        operand, op_t.shape, dtype, updates, upd.shape, upd.dtype, vectors,
        max(vectors.ndim - 1, 0) if vectors.ndim else 0,
        tuple(int(d) for d in dn.update_window_dims),
        tuple(int(d) for d in dn.inserted_window_dims),
        tuple(int(d) for d in dn.scatter_dims_to_operand_dims),
        _COMBINE[name], "CLIP" in str(eqn.params.get("mode"))))]


def _one_hot_scatter_add(ctx: Ctx, eqn: Any, ins: list[int]) -> int | None:
    """A scatter-add of whole rows along one operand dim k at data-dependent indices
    (the transpose of `jnp.take(x, i, axis=k)`), as the contraction it equals:

        out = operand + moveaxis(onehot(i, n)^T . updates, 0, k),  onehot(i, n) = (i == iota(n))

    fill_or_drop drops the rows of out-of-range indices (an all-zero one-hot row);
    clip clamps the indices first; promise_in_bounds (jax.grad of lax.top_k and
    jnp.sort: indices that the forward computed in range) leaves an out-of-range
    index undefined, and dropping it is one of its meanings. None when the scatter
    has another form."""
    operand, indices_t, updates = ins
    dn = eqn.params["dimension_numbers"]
    mode = str(eqn.params.get("mode"))
    g = ctx.b.graph
    op_shape, idx, upd = g.tensors[operand].shape, g.tensors[indices_t], g.tensors[updates]
    if len(dn.inserted_window_dims) != 1 or \
            tuple(dn.scatter_dims_to_operand_dims) != tuple(dn.inserted_window_dims) or \
            not idx.shape or idx.shape[-1] != 1 or not any(
                m in mode for m in ("FILL_OR_DROP", "CLIP", "PROMISE_IN_BOUNDS")):
        return None
    k = int(dn.inserted_window_dims[0])
    if tuple(dn.operand_batching_dims) or tuple(dn.scatter_indices_batching_dims):
        return _along_axis(ctx, eqn, ins, k)
    window_dims = tuple(int(d) for d in dn.update_window_dims)
    scatter_dims = tuple(d for d in range(upd.rank) if d not in window_dims)
    rest = tuple(op_shape[d] for d in range(len(op_shape)) if d != k)
    if tuple(upd.shape[d] for d in window_dims) != rest or \
            tuple(upd.shape[d] for d in scatter_dims) != idx.shape[:-1]:
        return None   # partial windows or misaligned index dims
    shape, dtype = _out(eqn)
    loc, b, n = _loc(eqn), ctx.b, op_shape[k]
    batch = idx.shape[:-1]
    hot = _one_hot(ctx, eqn, indices_t, n)
    rows = b.op("dot_general", [hot, updates], (n,) + rest, dtype,
                {"lhs_contract": tuple(range(len(batch))), "rhs_contract": scatter_dims,
                 "lhs_batch": (), "rhs_batch": ()}, loc, eqn.primitive.name)
    if k:
        perm = tuple(range(1, k + 1)) + (0,) + tuple(range(k + 1, len(op_shape)))
        rows = b.op("transpose", [rows], shape, dtype, {"permutation": perm}, loc, eqn.primitive.name)
    return b.op("add", [operand, rows], shape, dtype, {}, loc, eqn.primitive.name)


def _one_hot(ctx: Ctx, eqn: Any, indices_t: int, n: int) -> int:
    """(i == iota(n)) of shape batch + (n,) for start indices (batch..., 1); clip mode
    clamps i into [0, n) first."""
    b, loc, name = ctx.b, _loc(eqn), eqn.primitive.name
    idx = b.graph.tensors[indices_t]
    batch = idx.shape[:-1]
    i = b.op("reshape", [indices_t], batch, idx.dtype, {}, loc, name)
    if "CLIP" in str(eqn.params.get("mode")):
        lo, hi = (b.op("broadcast_in_dim", [b.constant(np.asarray(v, idx.dtype), (), idx.dtype, loc)],
                       batch, idx.dtype, {"broadcast_dimensions": ()}, loc, name) for v in (0, n - 1))
        i = b.op("clamp", [lo, i, hi], batch, idx.dtype, {}, loc, name)
    hot_shape = batch + (n,)
    ids = b.op("broadcast_in_dim", [i], hot_shape, idx.dtype,
               {"broadcast_dimensions": tuple(range(len(batch)))}, loc, name)
    cols = b.op("broadcast_in_dim", [b.op("iota", [], (n,), idx.dtype, {"dimension": 0}, loc, name)],
                hot_shape, idx.dtype, {"broadcast_dimensions": (len(batch),)}, loc, name)
    return b.op("eq", [ids, cols], hot_shape, "bool", {}, loc, name)


def _along_axis(ctx: Ctx, eqn: Any, ins: list[int], k: int) -> int | None:
    """The transpose of take_along_axis(x, i, axis=k): every operand dim but k is a
    batching dim of the indices (same position, same size), the updates have the
    indices' shape without the vector dim; out[.., j, ..] += sum_c [i[.., c, ..] == j] u[.., c, ..]."""
    operand, indices_t, updates = ins
    dn = eqn.params["dimension_numbers"]
    g = ctx.b.graph
    op_shape, idx, upd = g.tensors[operand].shape, g.tensors[indices_t], g.tensors[updates]
    rest = tuple(d for d in range(len(op_shape)) if d != k)
    if tuple(dn.operand_batching_dims) != rest or tuple(dn.scatter_indices_batching_dims) != rest or \
            tuple(dn.update_window_dims) or idx.shape[:-1] != upd.shape or upd.rank != len(op_shape) or \
            any(upd.shape[d] != op_shape[d] for d in rest):
        return None
    shape, dtype = _out(eqn)
    loc, b, n = _loc(eqn), ctx.b, op_shape[k]
    hot = _one_hot(ctx, eqn, indices_t, n)
    picked = b.op("dot_general", [hot, updates], tuple(op_shape[d] for d in rest) + (n,), dtype,
                  {"lhs_contract": (k,), "rhs_contract": (k,), "lhs_batch": rest, "rhs_batch": rest},
                  loc, eqn.primitive.name)
    last = len(op_shape) - 1
    if k != last:
        picked = b.op("transpose", [picked], shape, dtype,
                      {"permutation": tuple(range(k)) + (last,) + tuple(range(k, last))}, loc,
                      eqn.primitive.name)
    return b.op("add", [operand, picked], shape, dtype, {}, loc, eqn.primitive.name)
