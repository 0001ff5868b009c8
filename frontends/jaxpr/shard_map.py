"""A `dist_fn` that does work outside its shard_map: closes over arrays,
reshapes or pads its inputs before `shard_map`, or post-processes after it.

Outside shard_map, JAX code works on global arrays. The distributed program
is then written as every rank computing that global code itself (replicated),
and the shard_map boundary as exactly what shard_map does with its operands
and results:

* entry: each rank takes its block of each operand per `in_specs`, a
  `dynamic_slice` at offsets computed from the rank's mesh coordinates
  (`axis_index`), the row-major position over the axes of each dim;
* exit: the blocks of each result are assembled per `out_specs`, one tiled
  `all_gather` per sharded dim over that dim's axes (a replicated result is
  each rank's own value, as the output relation then requires of every rank);
* an assembled result taken back by a later shard_map along the same mesh axes
  (the residuals `jax.grad` passes from the forward shard_map to the backward
  one, stacked over the ranks) is each rank's own block, not a slice of the
  gathered value: the gather then the slice at the rank's position is the
  identity, and the stacked copies relate to nothing sequential.

The top-level inputs and outputs are global arrays on every rank, so the
relations at the boundary are plain replication; everything else is derived
by the rules. A program that is only a shard_map keeps the direct relations
read from its specs (frontends/jaxpr/__init__.py), which are cheaper.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dlverify.errors import InputError
from dlverify.frontends.jaxpr.walk import Ctx, _loc, _where, exporter, walk
from dlverify.ir import Mesh, SourceLoc
from dlverify.relations import axes_of, spec_entries, spec_relation

import jax.extend.core as jcore


def mesh_of(eqn: Any) -> Mesh:
    jmesh = eqn.params["mesh"]
    return Mesh(tuple(jmesh.axis_names), tuple(int(s) for s in jmesh.axis_sizes))


def find_mesh(closed: Any) -> Mesh | None:
    """The mesh of the shard_maps of a program (searched through nested calls);
    None when it has none. Shard_maps over different meshes are refused."""
    found: list[tuple[Mesh, Any]] = []

    def visit(j: Any) -> None:
        j = j.jaxpr if isinstance(j, jcore.ClosedJaxpr) else j
        for e in j.eqns:
            if e.primitive.name == "shard_map":
                found.append((mesh_of(e), e))
                continue
            for param in e.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    if isinstance(sub, (jcore.ClosedJaxpr, jcore.Jaxpr)):
                        visit(sub)
    visit(closed)
    for mesh, e in found[1:]:
        if mesh != found[0][0]:
            raise InputError(f"dist_fn uses shard_maps over different meshes ({found[0][0]} and "
                             f"{mesh})", *_where(e))
    return found[0][0] if found else None


def _int(ctx: Ctx, v: int, loc: SourceLoc) -> int:
    return ctx.b.constant(np.asarray(v, dtype=np.int32), (), "int32", loc)


def _block_start(ctx: Ctx, axes: tuple[str, ...], local: int, loc: SourceLoc) -> int:
    """(row-major position of this rank over `axes`) * local, as int32 IR ops."""
    assert ctx.mesh is not None
    idx = None
    for a in axes:
        coord = ctx.b.op("axis_index", [], (), "int32", {"axis": a}, loc, "shard_map")
        if idx is None:
            idx = coord
        else:
            scaled = ctx.b.op("mul", [idx, _int(ctx, ctx.mesh.axis_size(a), loc)], (), "int32",
                              {}, loc, "shard_map")
            idx = ctx.b.op("add", [scaled, coord], (), "int32", {}, loc, "shard_map")
    assert idx is not None
    return ctx.b.op("mul", [idx, _int(ctx, local, loc)], (), "int32", {}, loc, "shard_map")


def _dim_axes(spec: Any, rank: int) -> tuple[tuple[str, ...], ...]:
    """The mesh axes each of `rank` dims is split over by `spec` (() when whole)."""
    entries = list(spec_entries(spec)) + [None] * (rank - len(spec_entries(spec)))
    return tuple(tuple(axes_of(e)) for e in entries)


def _take_block(ctx: Ctx, t: int, spec: Any, loc: SourceLoc, what: str) -> int:
    assert ctx.mesh is not None
    ten = ctx.b.graph.tensors[t]
    rel = spec_relation(ten.shape, spec_entries(spec), ctx.mesh, what)
    if rel.is_replicated():
        return t
    block, axes = ctx.assembled.get(t, (None, None))
    if block is not None and axes == _dim_axes(spec, ten.rank):
        # t was assembled by an earlier shard_map's exit from the ranks' blocks along
        # the same axes: the rank's block of the gathered tensor is its own block
        # (gather then slice at the rank's position is the identity, exactly)
        return block
    entries = list(spec_entries(spec)) + [None] * (ten.rank - len(spec_entries(spec)))
    starts = [_block_start(ctx, axes_of(e), n, loc) if axes_of(e) else _int(ctx, 0, loc)
              for e, n in zip(entries, rel.dist_shape)]
    return ctx.b.op("dynamic_slice", [t] + starts, rel.dist_shape, ten.dtype,
                    {"slice_sizes": rel.dist_shape}, loc, "shard_map")


def _assemble(ctx: Ctx, t: int, spec: Any, loc: SourceLoc) -> int:
    assert ctx.mesh is not None
    for dim, entry in enumerate(spec_entries(spec)):
        axes = axes_of(entry)
        if not axes:
            continue
        ten = ctx.b.graph.tensors[t]
        n = int(np.prod([ctx.mesh.axis_size(a) for a in axes]))
        shape = ten.shape[:dim] + (ten.shape[dim] * n,) + ten.shape[dim + 1:]
        t = ctx.b.op("all_gather", [t], shape, ten.dtype,
                     {"dimension": dim, "groups": ctx.mesh.groups(axes)}, loc, "shard_map")
    return t


@exporter("shard_map")
def _shard_map(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    if ctx.in_shard_map:
        raise InputError("nested shard_map is not supported", *_where(eqn))
    mesh = mesh_of(eqn)
    if ctx.mesh is None or ctx.mesh != mesh:
        raise InputError("shard_map outside dist_fn's mesh", *_where(eqn))
    loc = _loc(eqn)
    p = eqn.params
    local = [_take_block(ctx, t, spec, loc, f"in_specs[{i}]")
             for i, (t, spec) in enumerate(zip(ins, p["in_specs"]))]
    outs = walk(replace(ctx, in_shard_map=True), p["jaxpr"], local)
    results = []
    for t, spec in zip(outs, p["out_specs"]):
        whole = _assemble(ctx, t, spec, loc)
        if whole != t:
            ctx.assembled[whole] = (t, _dim_axes(spec, ctx.b.graph.tensors[t].rank))
        results.append(whole)
    return results
