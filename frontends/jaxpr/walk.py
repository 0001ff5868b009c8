"""The jaxpr walker: state of one walk (`Ctx`), the exporter table and `walk`.

Walks jaxprs the way `jax.core.eval_jaxpr` does (an environment from variables
to tensor ids, literals resolved on read). Each primitive has an exporter in
`EXPORTERS` (registered by frontends/jaxpr/primitives.py and loops.py); a
primitive without one is an UnknownOpError naming its source line, never an
identity.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from dlverify.errors import InputError, UnknownOpError
from dlverify.frontends.jaxpr.known import KnownValues
from dlverify.ir import Frame, GraphBuilder, Mesh, SourceLoc

import jax
import jax.extend.core as jcore
from jax._src import source_info_util  # private: jax is pinned in pyproject.toml

_OWN_FILES = ("/dlverify/", "/frontends/")


@lru_cache(maxsize=8192)
def _user_frame(code: Any, lasti: int) -> Frame | None:
    """A raw traceback frame as a user Frame; None for JAX's, Python's and our own.
    (Cached: every layer of a deep model repeats the same call sites, and converting
    each equation's frames anew was a tenth of tracing a 126-layer model.)"""
    file = code.co_filename
    if not source_info_util.is_user_filename(file) or any(p in file for p in _OWN_FILES) \
            or "/_pytest/" in file or "/pluggy/" in file or "/typer/" in file:
        return None
    f = source_info_util.raw_frame_to_frame(code, lasti)
    return Frame(f.file_name, f.start_line, f.function_name)


@lru_cache(maxsize=8192)
def _user_frames(tb: Any) -> tuple[Frame, ...]:
    """The user frames of a traceback (tracebacks hash and compare by their frames, so
    the equations of every layer of a deep model share one entry)."""
    codes, lastis = tb.raw_frames()
    return tuple(f for f in map(_user_frame, codes, lastis) if f is not None)


def _loc(eqn: Any) -> SourceLoc:
    tb = eqn.source_info.traceback
    frames = _user_frames(tb) if tb is not None else ()
    name = str(eqn.source_info.name_stack) if eqn.source_info.name_stack else ""
    return SourceLoc(frames, name)


@lru_cache(maxsize=256)
def _dtype_name(dtype: Any) -> str:
    return str(np.dtype(dtype))


def is_key(aval: Any) -> bool:
    """A typed PRNG key array (`jax.random.key`): the IR carries its key data."""
    return hasattr(aval, "dtype") and jax.dtypes.issubdtype(aval.dtype, jax.dtypes.prng_key)


@lru_cache(maxsize=64)
def key_shape(dtype: Any) -> tuple[int, ...]:
    """The trailing dims one key of this key dtype occupies in its key data."""
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
    return tuple(int(s) for s in data.shape)


def _dtype(aval: Any) -> str:
    if is_key(aval):
        return "uint32"   # jax.random.key_data of every PRNG implementation JAX ships
    return _dtype_name(aval.dtype) if hasattr(aval, "dtype") else "token"


def ir_shape(aval: Any) -> tuple[int, ...]:
    """The IR tensor's shape for an aval: a key array's dims, then one key's."""
    shape = tuple(int(s) for s in aval.shape)
    return shape + key_shape(aval.dtype) if is_key(aval) else shape


@dataclass
class Ctx:
    """State of one walk: the graph being built and, inside shard_map, the mesh.
    `fallback` locates ops traced inside library code (no user frames of their
    own) at the user's call of that library function."""

    b: GraphBuilder
    mesh: Mesh | None
    in_shard_map: bool
    fallback: SourceLoc = SourceLoc()
    # shared by every Ctx of one walk (dataclasses.replace copies references):
    # values known before run time, and the rows of stacks built by unrolled scans
    known: KnownValues = field(default_factory=KnownValues)
    stacks: dict[int, list[int]] = field(default_factory=dict)
    # shard_map results assembled from the ranks' blocks: global tensor -> (the rank's
    # block, the spec's mesh axes per dim), so a later shard_map that takes the same
    # blocks back (the residuals jax.grad passes from the forward shard_map to the
    # backward one) reads the rank's block itself (frontends/jaxpr/shard_map.py)
    assembled: dict[int, tuple[int, tuple[tuple[str, ...], ...]]] = field(default_factory=dict)
    # the scans exported as summaries (dlverify/induction.py ScanSide) when this
    # walk verifies scans by induction; None: scans are unrolled
    scans: list[Any] | None = None

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
# Exporters of primitives applied to PRNG key arrays, whose params count only the
# key array's dims (frontends/jaxpr/prng.py); KEY_AGNOSTIC: primitives whose plain
# exporter is right on key data as it is (the trailing key dims follow the output
# shape; control flow walks its bodies, whose key vars are key data too).
KEY_EXPORTERS: dict[str, Exporter] = {}
KEY_AGNOSTIC = frozenset({"reshape", "squeeze", "expand_dims", "concatenate", "rev", "copy", "copy_p",
                          "pvary", "optimization_barrier", "stop_gradient", "jit", "pjit",
                          "closed_call", "scan", "while", "cond"})


def _exporter_for(eqn: Any) -> Exporter | None:
    name = eqn.primitive.name
    if any(is_key(v.aval) for v in (*eqn.invars, *eqn.outvars)) and name not in KEY_AGNOSTIC:
        if name not in KEY_EXPORTERS:
            raise UnknownOpError(f"'{name}' on PRNG key arrays is not supported (exporters of "
                                 f"key arrays: frontends/jaxpr/prng.py)", *_where(eqn))
        return KEY_EXPORTERS[name]
    return EXPORTERS.get(name)


def exporter(*names: str) -> Callable[[Exporter], Exporter]:
    def deco(fn: Exporter) -> Exporter:
        for n in names:
            EXPORTERS[n] = fn
        return fn
    return deco


def _out(eqn: Any, i: int = 0) -> tuple[tuple[int, ...], str]:
    aval = eqn.outvars[i].aval
    return ir_shape(aval), _dtype(aval)


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
        val = np.asarray(jax.random.key_data(c) if is_key(v.aval) else c)
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
        try:
            ex = _exporter_for(eqn)
        except InputError as e:   # (a primitive of library code: at the user's call)
            if not e.file:
                e.file, e.line = ctx.fallback.file, ctx.fallback.line
            raise
        if ex is None:
            if name == "shard_map":
                raise InputError("nested shard_map is not supported", *_where(eqn))
            file, line = _where(eqn)
            if not file:
                file, line = ctx.fallback.file, ctx.fallback.line
            raise UnknownOpError(f"unknown primitive '{name}' (no exporter in "
                                 f"frontends/jaxpr/)", file, line)
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
