"""jaxpr -> IR: the sequential program and the body of a `jax.shard_map`.

Walks jaxprs the way `jax.core.eval_jaxpr` does (an environment from variables
to tensor ids, literals resolved on read), inlining nested calls (`jit`,
`custom_jvp_call`, `custom_vjp_call`, `checkpoint`, `closed_call`). Each
primitive has an exporter in `EXPORTERS`; a primitive without one is an
UnknownOpError naming its source line, never an identity.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from dlverify.errors import InputError, UnknownOpError
from dlverify.ir import Frame, Graph, GraphBuilder, IdAllocator, Mesh, SourceLoc
from dlverify.ops.dtypes import convert_kind
from dlverify.problem import Problem
from dlverify.relations import spec_relation

import jax
import jax.extend.core as jcore
from jax._src import source_info_util  # private: jax is pinned in pyproject.toml

_OWN_FILES = ("/dlverify/", "/frontends/")


def _loc(eqn: Any) -> SourceLoc:
    tb = eqn.source_info.traceback
    frames = []
    if tb is not None:
        for f in source_info_util.user_frames(tb):
            if any(p in f.file_name for p in _OWN_FILES) or "/_pytest/" in f.file_name \
                    or "/pluggy/" in f.file_name or "/typer/" in f.file_name:
                continue
            frames.append(Frame(f.file_name, f.start_line, f.function_name))
    name = str(eqn.source_info.name_stack) if eqn.source_info.name_stack else ""
    return SourceLoc(tuple(frames), name)


def _dtype(aval: Any) -> str:
    return str(np.dtype(aval.dtype)) if hasattr(aval, "dtype") else "token"


@dataclass
class Ctx:
    """State of one walk: the graph being built and, inside shard_map, the mesh.
    `fallback` locates ops traced inside library code (no user frames of their
    own) at the user's call of that library function."""

    b: GraphBuilder
    mesh: Mesh | None
    in_shard_map: bool
    fallback: SourceLoc = SourceLoc()

    def groups(self, eqn: Any, axes: Any, axis_index_groups: Any = None) -> list[list[int]]:
        if self.mesh is None or not self.in_shard_map:
            raise InputError(f"collective {eqn.primitive.name} outside shard_map",
                             *_where(eqn))
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        for a in axes:
            if a not in self.mesh.axis_names:
                raise InputError(f"{eqn.primitive.name} over unknown mesh axis {a!r}", *_where(eqn))
        if axis_index_groups is None:
            return self.mesh.groups(axes)
        if len(axes) != 1:
            raise InputError("axis_index_groups with several axes is not supported", *_where(eqn))
        # axis_index_groups index positions along the one axis; apply them in
        # every slice of the other axes.
        out = []
        for full in self.mesh.groups(axes):
            for grp in axis_index_groups:
                out.append([full[i] for i in grp])
        return out


def _where(eqn: Any) -> tuple[str, int]:
    loc = _loc(eqn)
    return loc.file, loc.line


Exporter = Callable[[Ctx, Any, list[int]], list[int]]
EXPORTERS: dict[str, Exporter] = {}


def exporter(*names: str) -> Callable[[Exporter], Exporter]:
    def deco(fn: Exporter) -> Exporter:
        for n in names:
            EXPORTERS[n] = fn
        return fn
    return deco


def _out(eqn: Any, i: int = 0) -> tuple[tuple[int, ...], str]:
    aval = eqn.outvars[i].aval
    return tuple(int(s) for s in aval.shape), _dtype(aval)


def _simple(kind: str, params: Callable[[Any], dict] | None = None) -> Exporter:
    def ex(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
        shape, dtype = _out(eqn)
        return [ctx.b.op(kind, ins, shape, dtype, params(eqn) if params else {}, _loc(eqn),
                         eqn.primitive.name)]
    return ex


def _elementwise(kind: str, params: Callable[[Any], dict] | None = None) -> Exporter:
    """Elementwise ops; jaxprs broadcast rank-0 operands and size-1 dims implicitly,
    the IR does it with explicit broadcast_in_dim ops so one rule family serves."""
    def ex(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
        shape, dtype = _out(eqn)
        loc = _loc(eqn)
        args = []
        for t in ins:
            ten = ctx.b.graph.tensors[t]
            if ten.shape != shape:
                dims = tuple(range(len(shape))) if ten.rank == len(shape) else ()
                if ten.rank not in (0, len(shape)):
                    raise InputError(f"{kind}: operand of shape {ten.shape} for output {shape}",
                                     loc.file, loc.line)
                t = ctx.b.op("broadcast_in_dim", [t], shape, ten.dtype,
                             {"broadcast_dimensions": dims}, loc, "broadcast_in_dim")
            args.append(t)
        return [ctx.b.op(kind, args, shape, dtype, params(eqn) if params else {}, loc,
                         eqn.primitive.name)]
    return ex


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
for _n in ["cumsum", "cumprod", "cummax", "cummin"]:
    EXPORTERS[_n] = _simple(_n, lambda e: {"axis": int(e.params["axis"]),
                                           "reverse": bool(e.params["reverse"])})


@exporter("pvary", "copy", "copy_p", "reduce_precision", "optimization_barrier", "stop_gradient")
def _alias(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    # Identities over the reals (pvary is a type-only cast of check_vma;
    # stop_gradient only affects differentiation, which is already traced;
    # reduce_precision changes rounding only).
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
    if eqn.primitive.name == "reshape" and eqn.params.get("dimensions") not in (None, ()):
        raise UnknownOpError("reshape with `dimensions` (a transpose first) is not supported",
                             *_where(eqn))
    shape, dtype = _out(eqn)
    return [ctx.b.op("reshape", ins[:1], shape, dtype, {}, _loc(eqn), eqn.primitive.name)]


EXPORTERS["transpose"] = _simple("transpose", lambda e: {"permutation": tuple(int(p) for p in e.params["permutation"])})
EXPORTERS["concatenate"] = _simple("concatenate", lambda e: {"dimension": int(e.params["dimension"])})
EXPORTERS["rev"] = _simple("rev", lambda e: {"dimensions": tuple(e.params["dimensions"])})
EXPORTERS["pad"] = _simple("pad", lambda e: {"padding_config": tuple(tuple(p) for p in e.params["padding_config"])})
EXPORTERS["iota"] = _simple("iota", lambda e: {"dimension": int(e.params["dimension"])})
EXPORTERS["dynamic_slice"] = _simple("dynamic_slice", lambda e: {"slice_sizes": tuple(int(s) for s in e.params["slice_sizes"])})
EXPORTERS["dynamic_update_slice"] = _simple("dynamic_update_slice")
EXPORTERS["sort"] = _simple("sort", lambda e: {"dimension": int(e.params["dimension"])})


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
    masks out-of-range indices, which this IR op does not express."""
    mode = str(eqn.params.get("mode"))
    if "CLIP" not in mode and "PROMISE_IN_BOUNDS" not in mode:
        raise UnknownOpError(f"gather with {mode}: only mode='clip' (or indexing that promises "
                             f"in-bounds indices, x[i]) is supported", *_where(eqn))
    dn = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    idx_rank = len(eqn.invars[1].aval.shape)
    return [ctx.b.op("gather", ins, shape, dtype, {
        "offset_dims": tuple(int(d) for d in dn.offset_dims),
        "collapsed_slice_dims": tuple(int(d) for d in dn.collapsed_slice_dims),
        "start_index_map": tuple(int(d) for d in dn.start_index_map),
        "operand_batching_dims": tuple(int(d) for d in dn.operand_batching_dims),
        "start_indices_batching_dims": tuple(int(d) for d in dn.start_indices_batching_dims),
        "index_vector_dim": idx_rank - 1,
        "slice_sizes": tuple(int(d) for d in eqn.params["slice_sizes"]),
        "indices_are_sorted": bool(eqn.params.get("indices_are_sorted", False))},
        _loc(eqn), "gather")]


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
    groups = ctx.groups(eqn, eqn.params["axis_name"], eqn.params.get("axis_index_groups"))
    shape, dtype = _out(eqn)
    kind = "all_gather"
    if not eqn.params["tiled"]:
        raise UnknownOpError("all_gather with tiled=False is not supported: use tiled=True",
                             *_where(eqn))
    return [ctx.b.op(kind, ins, shape, dtype, {"dimension": int(eqn.params["all_gather_dimension"]),
                                                "groups": groups}, _loc(eqn), "all_gather")]


@exporter("reduce_scatter")
def _reduce_scatter(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    groups = ctx.groups(eqn, eqn.params["axis_name"], eqn.params.get("axis_index_groups"))
    if not eqn.params["tiled"]:
        raise UnknownOpError("psum_scatter with tiled=False is not supported: use tiled=True",
                             *_where(eqn))
    shape, dtype = _out(eqn)
    return [ctx.b.op("reduce_scatter", ins, shape, dtype,
                     {"dimension": int(eqn.params["scatter_dimension"]), "reducer": "sum",
                      "groups": groups}, _loc(eqn), "psum_scatter")]


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


def _literal(ctx: Ctx, lit: Any) -> int:
    val = np.asarray(lit.val)
    return ctx.b.constant(val, tuple(val.shape), _dtype(lit.aval))


def walk(ctx: Ctx, jaxpr: Any, in_ids: list[int]) -> list[int]:
    """Emit the ops of `jaxpr` (closed or open) applied to `in_ids`."""
    consts: list[Any] = []
    if isinstance(jaxpr, jcore.ClosedJaxpr):
        consts = list(jaxpr.consts)
        jaxpr = jaxpr.jaxpr
    env: dict[Any, int] = {}
    for v, c in zip(jaxpr.constvars, consts):
        val = np.asarray(c)
        env[v] = ctx.b.constant(val, tuple(val.shape), str(val.dtype))
    if len(jaxpr.invars) != len(in_ids):
        raise InputError(f"call with {len(in_ids)} operands for {len(jaxpr.invars)} parameters")
    for v, t in zip(jaxpr.invars, in_ids):
        env[v] = t

    def read(a: Any) -> int:
        if isinstance(a, jcore.Literal):
            return _literal(ctx, a)
        return env[a]

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ex = EXPORTERS.get(name)
        if ex is None:
            if name == "shard_map":
                raise InputError("nested shard_map is not supported", *_where(eqn))
            file, line = _where(eqn)
            if not file:
                file, line = ctx.fallback.file, ctx.fallback.line
            raise UnknownOpError(f"unknown primitive '{name}' (no exporter in "
                                 f"frontends/jaxpr.py)", file, line)
        first_new = len(ctx.b.graph.ops)
        try:
            outs = ex(ctx, eqn, [read(a) for a in eqn.invars])
        except InputError as e:
            if not e.file and ctx.fallback.frames:
                e.file, e.line = ctx.fallback.file, ctx.fallback.line
            raise
        for op in ctx.b.graph.ops[first_new:]:
            if not op.loc.frames:
                op.loc = ctx.fallback
        if len(outs) != len(eqn.outvars):
            raise InputError(f"exporter for {name} returned {len(outs)} outputs for "
                             f"{len(eqn.outvars)}", *_where(eqn))
        for v, t in zip(eqn.outvars, outs):
            if not isinstance(v, jcore.DropVar):
                env[v] = t
    return [read(a) for a in jaxpr.outvars]


def _avals_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(jax.ShapeDtypeStruct(np.shape(a), a.dtype) if not isinstance(a, jax.ShapeDtypeStruct)
                 else a for a in args)


def _find_shard_map(jaxpr: Any) -> tuple[Any, dict[Any, int]]:
    """The single shard_map eqn of the (jit-inlined) top level of the dist program,
    with a map from the vars it reads to positions of the top-level inputs."""
    closed = jaxpr
    j = closed.jaxpr
    pos = {v: i for i, v in enumerate(j.invars)}
    while True:
        eqns = list(j.eqns)
        if len(eqns) == 1 and eqns[0].primitive.name in ("jit", "pjit", "closed_call"):
            inner = eqns[0].params.get("jaxpr") or eqns[0].params.get("call_jaxpr")
            inner_j = inner.jaxpr if isinstance(inner, jcore.ClosedJaxpr) else inner
            if any(isinstance(a, jcore.Literal) or a not in pos for a in eqns[0].invars):
                raise InputError("dist_fn must pass its arguments straight to shard_map")
            pos = {iv: pos[a] for iv, a in zip(inner_j.invars, eqns[0].invars)}
            if list(eqns[0].outvars) != list(j.outvars):
                raise InputError("dist_fn must return the outputs of shard_map unchanged")
            j = inner_j
            continue
        sms = [e for e in eqns if e.primitive.name == "shard_map"]
        if len(eqns) != 1 or len(sms) != 1:
            found = ", ".join(sorted({e.primitive.name for e in eqns})) or "nothing"
            raise InputError("dist_fn must be a jax.shard_map (optionally under jax.jit) with no "
                             f"other ops around it; its jaxpr has: {found}")
        sm = sms[0]
        if list(sm.outvars) != list(j.outvars):
            raise InputError("dist_fn must return the outputs of shard_map unchanged")
        for a in sm.invars:
            if isinstance(a, jcore.Literal) or a not in pos:
                raise InputError("dist_fn must pass its arguments straight to shard_map")
        return sm, pos


def _spec_entries(spec: Any) -> tuple[Any, ...]:
    return tuple(spec) if spec is not None else ()


def _trace(fn: Callable, avals: tuple[Any, ...], what: str) -> Any:
    """jax.make_jaxpr, with the user program's own errors (bad specs, shape errors)
    turned into one-line input errors at the user's line."""
    try:
        return jax.make_jaxpr(fn)(*avals)
    except Exception as e:  # raised by JAX while tracing the user's program
        import traceback

        file, line = "", 0
        for fr in traceback.extract_tb(e.__traceback__):
            if source_info_util.is_user_filename(fr.filename) and not any(
                    p in fr.filename for p in _OWN_FILES):
                file, line = fr.filename, fr.lineno or 0
        msg = " ".join(str(e).split())
        msg = msg if len(msg) <= 400 else msg[:400] + " ..."
        raise InputError(f"tracing {what} failed: {type(e).__name__}: {msg}", file, line) from None


def import_jax(seq_fn: Callable, dist_fn: Callable, args: tuple[Any, ...], name: str = "") -> Problem:
    """Trace both programs and build the Problem: graphs, mesh and the input and
    output relations read from shard_map's in_specs and out_specs."""
    avals = _avals_args(args)
    seq_closed = _trace(seq_fn, avals, "seq_fn")
    dist_closed = _trace(dist_fn, avals, "dist_fn")
    ids = IdAllocator()

    seq = Graph("sequential")
    sb = GraphBuilder(seq, ids)
    seq_in = [sb.tensor(tuple(v.aval.shape), _dtype(v.aval), f"in{i}")
              for i, v in enumerate(seq_closed.jaxpr.invars)]
    seq.inputs = seq_in
    seq.outputs = walk(Ctx(sb, None, False), seq_closed, seq_in)

    sm, pos = _find_shard_map(dist_closed)
    p = sm.params
    jmesh = p["mesh"]
    mesh = Mesh(tuple(jmesh.axis_names), tuple(int(s) for s in jmesh.axis_sizes))
    body = p["jaxpr"]
    body_j = body.jaxpr if isinstance(body, jcore.ClosedJaxpr) else body
    dist = Graph("distributed")
    db = GraphBuilder(dist, ids)
    n_top = len(dist_closed.jaxpr.invars)
    if n_top != len(seq_in):
        raise InputError(f"seq_fn takes {len(seq_in)} array arguments but dist_fn takes {n_top}")
    # Distributed inputs, in top-level order; shard_map operands map onto them.
    dist_in: list[int | None] = [None] * n_top
    in_specs = list(p["in_specs"])
    top_spec: list[Any] = [None] * n_top
    body_ids = []
    for k, (outer, bv) in enumerate(zip(sm.invars, body_j.invars)):
        i = pos[outer]
        if dist_in[i] is None:
            dist_in[i] = db.tensor(tuple(bv.aval.shape), _dtype(bv.aval), f"in{i}")
            top_spec[i] = in_specs[k]
        elif tuple(_spec_entries(top_spec[i])) != tuple(_spec_entries(in_specs[k])):
            raise InputError(f"argument {i} is passed to shard_map twice with different in_specs")
        body_ids.append(dist_in[i])
    inputs = []
    for i, t in enumerate(dist_in):
        s_shape = seq.tensors[seq_in[i]].shape
        if t is None:  # unused by the distributed program: give it a replicated stand-in
            dist_in[i] = db.tensor(s_shape, seq.tensors[seq_in[i]].dtype, f"in{i}")
            top_spec[i] = ()
        rel = spec_relation(s_shape, _spec_entries(top_spec[i]), mesh, f"in_specs[{i}]")
        if rel.dist_shape != dist.tensors[dist_in[i]].shape:
            raise InputError(f"argument {i}: in_specs give local shape {rel.dist_shape} but the "
                             f"shard_map body sees {dist.tensors[dist_in[i]].shape}")
        inputs.append(rel)
    dist.inputs = [t for t in dist_in if t is not None]
    dist.outputs = walk(Ctx(db, mesh, True), body, body_ids)

    if len(dist.outputs) != len(seq.outputs):
        raise InputError(f"seq_fn returns {len(seq.outputs)} arrays but dist_fn returns "
                         f"{len(dist.outputs)}")
    outputs = []
    for i, (s, spec) in enumerate(zip(seq.outputs, p["out_specs"])):
        s_shape = seq.tensors[s].shape
        rel = spec_relation(s_shape, _spec_entries(spec), mesh, f"out_specs[{i}]")
        if rel.dist_shape != dist.tensors[dist.outputs[i]].shape:
            raise InputError(f"output {i}: out_specs give local shape {rel.dist_shape} for the "
                             f"sequential shape {s_shape}, but the shard_map body returns "
                             f"{dist.tensors[dist.outputs[i]].shape}")
        outputs.append(rel)
    seq.input_names = dist.input_names = [f"in{i}" for i in range(n_top)]
    seq.output_names = dist.output_names = [f"out{i}" for i in range(len(seq.outputs))]
    return Problem(seq, dist, mesh, inputs, outputs, ids, [], name)
