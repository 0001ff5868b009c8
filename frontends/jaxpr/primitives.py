"""Exporters of the jaxpr primitives that map one-to-one onto IR op kinds,
collectives, and the call primitives that are inlined (`jit`,
`custom_jvp_call`, `custom_vjp_call`, `checkpoint`, `closed_call`)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dlverify.errors import InputError, UnknownOpError
from dlverify.frontends.jaxpr.walk import (EXPORTERS, Ctx, Exporter, _dtype, _elementwise, _loc, _out,
                                           _simple, _where, exporter, walk)
from dlverify.ops.dtypes import convert_kind

_UNARY = ["exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "cbrt",
          "abs", "sign", "sin", "cos", "tan", "erf", "erfc", "erf_inv", "floor", "ceil",
          "not", "is_finite", "square", "asin", "acos", "atan", "sinh", "cosh", "asinh",
          "acosh", "atanh", "lgamma", "digamma", "population_count", "clz", "imag", "real",
          "conj", "neg"]
_BINARY = ["add", "sub", "mul", "div", "max", "min", "pow", "atan2", "rem", "and", "or", "xor",
           "eq", "ne", "lt", "le", "gt", "ge", "nextafter", "shift_left", "shift_right_logical",
           "shift_right_arithmetic", "complex"]
for _n in _UNARY + _BINARY + ["select_n", "clamp"]:
    EXPORTERS[_n] = _elementwise(_n)
EXPORTERS["add_any"] = _elementwise("add")
EXPORTERS["round"] = _elementwise("round", lambda e: {"rounding": str(e.params.get("rounding_method"))})
EXPORTERS["integer_pow"] = _elementwise("integer_pow", lambda e: {"y": int(e.params["y"])})
for _n in ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"]:
    EXPORTERS[_n] = _simple(_n, lambda e: {"axis": int(e.params["axis"]),
                                           "reverse": bool(e.params["reverse"])})


@exporter("pvary", "copy", "copy_p", "reduce_precision", "optimization_barrier", "stop_gradient")
def _alias(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    # Identities over the reals (pvary is a type-only cast of check_vma;
    # stop_gradient only affects differentiation, which is already traced;
    # reduce_precision changes rounding only).
    return list(ins)


@exporter("reshard")
def _reshard(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    """`jax.sharding.reshard(x, dst_sharding)` (jax/_src/pjit.py, JAX 0.10.2: its abstract
    eval only sets the aval's sharding, its lowering is a sharding annotation of the
    same value). Outside shard_map the walk is of global arrays, every rank computing
    the global value (frontends/jaxpr/shard_map.py): where the value lives does not
    change it, so it is the identity; `jax.grad` of a jit writes it on the cotangent
    seed. Inside shard_map the value is the rank's block: a spec naming a mesh axis
    would reshard over axes left to the compiler (a partly manual shard_map), which
    the walk does not model."""
    (x,), (out,) = eqn.invars, eqn.outvars
    if tuple(x.aval.shape) != tuple(out.aval.shape) or x.aval.dtype != out.aval.dtype:
        raise InputError(f"reshard from {x.aval} to {out.aval} changes more than the sharding",
                         *_where(eqn))
    spec = getattr(eqn.params.get("dst_sharding"), "spec", None)
    if ctx.in_shard_map and (spec is None or any(e is not None for e in spec)):
        raise UnknownOpError(f"reshard to {eqn.params.get('dst_sharding')} inside shard_map "
                             f"(over axes the shard_map leaves to the compiler) is not "
                             f"supported", *_where(eqn))
    return list(ins)


@exporter("convert_element_type")
def _convert(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    kind = convert_kind(np.dtype(eqn.invars[0].aval.dtype).name, np.dtype(eqn.params["new_dtype"]).name)
    if kind is None:  # an identity over the reals (see convert_kind)
        return list(ins)
    shape, dtype = _out(eqn)
    return [ctx.b.op(kind, ins, shape, dtype, {}, _loc(eqn), eqn.primitive.name)]


@exporter("broadcast_in_dim")
def _bcast(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    shape, dtype = _out(eqn)
    return [ctx.b.op("broadcast_in_dim", ins[:1], shape, dtype,
                     {"broadcast_dimensions": tuple(int(d) for d in eqn.params["broadcast_dimensions"])},
                     _loc(eqn), "broadcast_in_dim")]


@exporter("reshape", "squeeze", "expand_dims")
def _reshape(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    shape, dtype = _out(eqn)
    x = ins[0]
    dims = eqn.params.get("dimensions") if eqn.primitive.name == "reshape" else None
    if dims not in (None, ()):   # lax.reshape(x, sizes, dimensions): x transposed first
        perm = tuple(int(d) for d in dims)
        src = eqn.invars[0].aval.shape
        x = ctx.b.op("transpose", [x], tuple(int(src[p]) for p in perm), dtype,
                     {"permutation": perm}, _loc(eqn), "reshape")
    return [ctx.b.op("reshape", [x], shape, dtype, {}, _loc(eqn), eqn.primitive.name)]


EXPORTERS["transpose"] = _simple("transpose", lambda e: {"permutation": tuple(int(p) for p in e.params["permutation"])})
EXPORTERS["concatenate"] = _simple("concatenate", lambda e: {"dimension": int(e.params["dimension"])})
# lax.bitcast_convert_type: the operand's stored bits read as another type (random
# bits -> a float in [1, 2): uniform sampling); between widths a last dim appears
# or goes, as in XLA's op
EXPORTERS["bitcast_convert_type"] = _simple(
    "bitcast_convert", lambda e: {"from": _dtype(e.invars[0].aval)})
EXPORTERS["rev"] = _simple("rev", lambda e: {"dimensions": tuple(e.params["dimensions"])})
EXPORTERS["pad"] = _simple("pad", lambda e: {"padding_config": tuple(tuple(p) for p in e.params["padding_config"])})
EXPORTERS["iota"] = _simple("iota", lambda e: {"dimension": int(e.params["dimension"])})
EXPORTERS["dynamic_slice"] = _simple("dynamic_slice", lambda e: {"slice_sizes": tuple(int(s) for s in e.params["slice_sizes"])})
EXPORTERS["dynamic_update_slice"] = _simple("dynamic_update_slice")


@exporter("stack")
def _stack(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    """stack(xs, axis): each operand gets a size-1 dim at `axis`, then one concatenate."""
    shape, dtype = _out(eqn)
    axis = int(eqn.params["axis"])
    loc = _loc(eqn)
    part_shape = shape[:axis] + (1,) + shape[axis + 1:]
    parts = [ctx.b.op("reshape", [t], part_shape, ctx.b.graph.tensors[t].dtype, {}, loc, "stack")
             for t in ins]
    if len(parts) == 1:
        return parts
    return [ctx.b.op("concatenate", parts, shape, dtype, {"dimension": axis}, loc, "stack")]


@exporter("slice")
def _slice(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    shape, dtype = _out(eqn)
    strides = eqn.params.get("strides")
    return [ctx.b.op("slice", ins, shape, dtype, {
        "start_indices": tuple(int(s) for s in eqn.params["start_indices"]),
        "limit_indices": tuple(int(s) for s in eqn.params["limit_indices"]),
        "strides": tuple(int(s) for s in strides) if strides else None}, _loc(eqn), "slice")]


@exporter("split")
def _split(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    axis = int(eqn.params["axis"])
    in_shape = ctx.b.graph.tensors[ins[0]].shape
    outs, start = [], 0
    for i, size in enumerate(eqn.params["sizes"]):
        shape, dtype = _out(eqn, i)
        starts = tuple(start if d == axis else 0 for d in range(len(in_shape)))
        limits = tuple(start + size if d == axis else in_shape[d] for d in range(len(in_shape)))
        outs.append(ctx.b.op("slice", ins, shape, dtype, {"start_indices": starts,
                                                          "limit_indices": limits, "strides": None},
                             _loc(eqn), "split"))
        start += size
    return outs


@exporter("gather")
def _gather(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    """XLA's gather (start indices clamped so every slice fits). mode=clip and
    promise_in_bounds lower to exactly that; fill_or_drop (jnp.take's default)
    is expanded as JAX lowers it (`_gather_fill`): the clamped gather where every
    start index is in bounds, `fill_value` elsewhere."""
    mode = str(eqn.params.get("mode"))
    if "FILL_OR_DROP" in mode:
        return [_gather_fill(ctx, eqn, ins)]
    if "CLIP" not in mode and "PROMISE_IN_BOUNDS" not in mode:
        raise UnknownOpError(f"gather with {mode}: only modes clip, fill and promise_in_bounds "
                             f"are supported", *_where(eqn))
    return [_gather_clamped(ctx, eqn, ins)]


def _gather_fill(ctx: Ctx, eqn: Any, ins: list[int]) -> int:
    """select_n(all(0 <= idx <= dim - slice_size, index dim), fill, gather): JAX's own
    lowering of a fill_or_drop gather, op for op (indices are already of an integer
    type; the bounds are constants of that type)."""
    dn = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    loc, b = _loc(eqn), ctx.b
    idx = b.graph.tensors[ins[1]]
    if eqn.params.get("fill_value") is None:
        raise UnknownOpError("gather with mode fill_or_drop and no fill value", *_where(eqn))
    op_shape = b.graph.tensors[ins[0]].shape
    sizes = [int(s) for s in eqn.params["slice_sizes"]]
    upper = np.asarray([op_shape[d] - sizes[d] for d in dn.start_index_map], dtype=idx.dtype)
    last = idx.rank - 1
    zero = b.op("broadcast_in_dim", [b.constant(np.zeros((), idx.dtype), (), idx.dtype, loc)],
                idx.shape, idx.dtype, {"broadcast_dimensions": ()}, loc, "gather")
    bound = b.op("broadcast_in_dim", [b.constant(upper, upper.shape, idx.dtype, loc)], idx.shape,
                 idx.dtype, {"broadcast_dimensions": (last,)}, loc, "gather")
    inside = b.op("and", [b.op("ge", [ins[1], zero], idx.shape, "bool", {}, loc, "gather"),
                          b.op("le", [ins[1], bound], idx.shape, "bool", {}, loc, "gather")],
                  idx.shape, "bool", {}, loc, "gather")
    inside = b.op("reduce_and", [inside], idx.shape[:last], "bool", {"axes": (last,)}, loc, "gather")
    batch_dims = tuple(d for d in range(len(shape)) if d not in set(dn.offset_dims))
    inside = b.op("broadcast_in_dim", [inside], shape, "bool", {"broadcast_dimensions": batch_dims},
                  loc, "gather")
    fill = np.asarray(eqn.params["fill_value"]).astype(dtype)
    fill = b.op("broadcast_in_dim", [b.constant(fill, (), dtype, loc)], shape, dtype,
                {"broadcast_dimensions": ()}, loc, "gather")
    return b.op("select_n", [inside, fill, _gather_clamped(ctx, eqn, ins)], shape, dtype, {}, loc,
                "gather")


def _gather_clamped(ctx: Ctx, eqn: Any, ins: list[int]) -> int:
    dn = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    idx_rank = len(eqn.invars[1].aval.shape)
    return ctx.b.op("gather", ins, shape, dtype, {
        "offset_dims": tuple(int(d) for d in dn.offset_dims),
        "collapsed_slice_dims": tuple(int(d) for d in dn.collapsed_slice_dims),
        "start_index_map": tuple(int(d) for d in dn.start_index_map),
        "operand_batching_dims": tuple(int(d) for d in dn.operand_batching_dims),
        "start_indices_batching_dims": tuple(int(d) for d in dn.start_indices_batching_dims),
        "index_vector_dim": idx_rank - 1,
        "slice_sizes": tuple(int(d) for d in eqn.params["slice_sizes"]),
        "indices_are_sorted": bool(eqn.params.get("indices_are_sorted", False))},
        _loc(eqn), "gather")


@exporter("dot_general")
def _dot(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    return [ctx.b.op("dot_general", ins, shape, dtype, {
        "lhs_contract": tuple(int(d) for d in lc), "rhs_contract": tuple(int(d) for d in rc),
        "lhs_batch": tuple(int(d) for d in lb), "rhs_batch": tuple(int(d) for d in rb)},
        _loc(eqn), "dot_general")]


for _n in ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
           "reduce_xor", "argmax", "argmin"]:
    EXPORTERS[_n] = _simple(_n, lambda e: {"axes": tuple(int(a) for a in e.params["axes"])})


@exporter("axis_index")
def _axis_index(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    if ctx.mesh is None or not ctx.in_shard_map:
        raise InputError("axis_index outside shard_map", *_where(eqn))
    shape, dtype = _out(eqn)
    return [ctx.b.op("axis_index", [], shape, dtype, {"axis": eqn.params["axis_name"]},
                     _loc(eqn), "axis_index")]


def _reducer_collective(reducer: str) -> Exporter:
    def ex(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
        groups = ctx.groups(eqn, eqn.params["axes"], eqn.params.get("axis_index_groups"))
        outs = []
        for i, t in enumerate(ins):  # psum of several operands: one all-reduce each
            shape, dtype = _out(eqn, i)
            outs.append(ctx.b.op("all_reduce", [t], shape, dtype,
                                 {"reducer": reducer, "groups": groups}, _loc(eqn),
                                 eqn.primitive.name))
        return outs
    return ex


EXPORTERS["psum"] = _reducer_collective("sum")
EXPORTERS["psum_invariant"] = _reducer_collective("sum")
EXPORTERS["pmax"] = _reducer_collective("max")
EXPORTERS["pmin"] = _reducer_collective("min")


@exporter("all_gather")
def _all_gather(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    """tiled=False stacks the members' blocks along a new dim k: the tiled gather along
    k, its dim k then split into (members, block size), the same elements in the same
    order (a rank-0 block is given a size-1 dim to gather along)."""
    groups = ctx.groups(eqn, eqn.params["axis_name"], eqn.params.get("axis_index_groups"))
    shape, dtype = _out(eqn)
    k = int(eqn.params["all_gather_dimension"])
    if eqn.params["tiled"]:
        return [ctx.b.op("all_gather", ins, shape, dtype, {"dimension": k, "groups": groups},
                         _loc(eqn), "all_gather")]
    x, block = ins[0], ctx.b.graph.tensors[ins[0]].shape
    if not block:
        x, block = ctx.b.op("reshape", [x], (1,), dtype, {}, _loc(eqn), "all_gather"), (1,)
    tiled = block[:k] + (shape[k] * block[k],) + block[k + 1:]
    x = ctx.b.op("all_gather", [x], tiled, dtype, {"dimension": k, "groups": groups}, _loc(eqn),
                 "all_gather")
    return [ctx.b.op("reshape", [x], shape, dtype, {}, _loc(eqn), "all_gather")]


@exporter("reduce_scatter")
def _reduce_scatter(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    """tiled=False scatters a dim of the group's size and drops it: the tiled
    reduce-scatter (each member keeps a size-1 slice) reshaped without that dim."""
    groups = ctx.groups(eqn, eqn.params["axis_name"], eqn.params.get("axis_index_groups"))
    shape, dtype = _out(eqn)
    k = int(eqn.params["scatter_dimension"])
    tiled = bool(eqn.params["tiled"])
    scattered = shape if tiled else shape[:k] + (1,) + shape[k:]
    out = ctx.b.op("reduce_scatter", ins, scattered, dtype,
                   {"dimension": k, "reducer": "sum", "groups": groups}, _loc(eqn), "psum_scatter")
    if not tiled:
        out = ctx.b.op("reshape", [out], shape, dtype, {}, _loc(eqn), "psum_scatter")
    return [out]


@exporter("all_to_all")
def _all_to_all(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    groups = ctx.groups(eqn, eqn.params["axis_name"], eqn.params.get("axis_index_groups"))
    if not eqn.params.get("tiled", False):
        raise UnknownOpError("all_to_all with tiled=False is not supported: use tiled=True",
                             *_where(eqn))
    shape, dtype = _out(eqn)
    return [ctx.b.op("all_to_all", ins, shape, dtype,
                     {"split_dimension": int(eqn.params["split_axis"]),
                      "concat_dimension": int(eqn.params["concat_axis"]), "groups": groups},
                     _loc(eqn), "all_to_all")]


@exporter("ppermute")
def _ppermute(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    axes = eqn.params["axis_name"]
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    groups = ctx.groups(eqn, axes)
    pairs = []
    for grp in groups:  # perm pairs are positions along the axes, applied in every group
        for src, dst in eqn.params["perm"]:
            pairs.append((grp[src], grp[dst]))
    shape, dtype = _out(eqn)
    return [ctx.b.op("collective_permute", ins, shape, dtype, {"pairs": pairs}, _loc(eqn),
                     "ppermute")]


def _callee_ctx(ctx: Ctx, eqn: Any) -> Ctx:
    loc = _loc(eqn)
    return replace(ctx, fallback=loc) if loc.frames else ctx


def _inline(param: str) -> Exporter:
    def ex(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
        return walk(_callee_ctx(ctx, eqn), eqn.params[param], ins)
    return ex


EXPORTERS["jit"] = _inline("jaxpr")
EXPORTERS["pjit"] = _inline("jaxpr")
EXPORTERS["closed_call"] = _inline("call_jaxpr")
EXPORTERS["core_call"] = _inline("call_jaxpr")
EXPORTERS["custom_jvp_call"] = _inline("call_jaxpr")
EXPORTERS["checkpoint"] = _inline("jaxpr")
EXPORTERS["remat"] = _inline("jaxpr")
EXPORTERS["remat2"] = _inline("jaxpr")


@exporter("custom_vjp_call", "custom_vjp_call_jaxpr")
def _custom_vjp(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    key = "call_jaxpr" if "call_jaxpr" in eqn.params else "fun_jaxpr"
    return walk(_callee_ctx(ctx, eqn), eqn.params[key], ins)
