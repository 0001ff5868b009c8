"""jaxpr -> IR: the sequential program and the body of a `jax.shard_map`.

`walk.py` holds the walker and the exporter table, `primitives.py` the
exporters of plain primitives, `loops.py` those of `scan`, `while` and `cond`,
`scatter.py` those of scatters with indices known before run time.
This module traces the two programs and reads shard_map's specs.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Any, Callable

import numpy as np

from dlverify.errors import InputError
from dlverify.frontends.jaxpr import loops, primitives, prng, scatter, shard_map, sorting, windows  # noqa: F401 - register the exporters
from dlverify.frontends.jaxpr.frames import home_file, prefer_callers
from dlverify.frontends.jaxpr.shard_map import find_mesh
from dlverify.frontends.jaxpr.walk import _OWN_FILES, Ctx, _dtype, ir_shape, walk
from dlverify.gcpause import gc_paused
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.problem import Problem
from dlverify.relations import spec_entries, spec_relation

import jax
import jax.extend.core as jcore
from jax._src import source_info_util  # private: jax is pinned in pyproject.toml

__all__ = ["Ctx", "walk", "import_jax"]


def _avals_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(jax.ShapeDtypeStruct(np.shape(a), a.dtype) if not isinstance(a, jax.ShapeDtypeStruct)
                 else a for a in args)


def _find_shard_map(jaxpr: Any) -> tuple[Any, dict[Any, int]] | None:
    """The single shard_map eqn of the (jit-inlined) top level of the dist program,
    with a map from the vars it reads to positions of the top-level inputs; None
    when the program does anything besides passing its arguments to one
    shard_map and returning its results (see frontends/jaxpr/shard_map.py)."""
    closed = jaxpr
    j = closed.jaxpr
    pos = {v: i for i, v in enumerate(j.invars)}
    while True:
        eqns = list(j.eqns)
        if len(eqns) == 1 and eqns[0].primitive.name in ("jit", "pjit", "closed_call"):
            inner = eqns[0].params.get("jaxpr") or eqns[0].params.get("call_jaxpr")
            inner_j = inner.jaxpr if isinstance(inner, jcore.ClosedJaxpr) else inner
            if any(isinstance(a, jcore.Literal) or a not in pos for a in eqns[0].invars):
                return None
            pos = {iv: pos[a] for iv, a in zip(inner_j.invars, eqns[0].invars)}
            if list(eqns[0].outvars) != list(j.outvars):
                return None
            j = inner_j
            continue
        sms = [e for e in eqns if e.primitive.name == "shard_map"]
        if len(eqns) != 1 or len(sms) != 1:
            return None
        sm = sms[0]
        if list(sm.outvars) != list(j.outvars):
            return None
        for a in sm.invars:
            if isinstance(a, jcore.Literal) or a not in pos:
                return None
        return sm, pos


def _trace(fn: Callable, avals: tuple[Any, ...], what: str) -> Any:
    """jax.make_jaxpr, with the user program's own errors (bad specs, shape errors)
    turned into one-line input errors at the user's line."""
    try:
        with gc_paused():  # (dlverify/gcpause.py)
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


def import_jax(seq_fn: Callable, dist_fn: Callable, args: tuple[Any, ...], name: str = "",
               induction: bool = True) -> Problem:
    """Trace both programs and build the Problem: graphs, mesh and the input and
    output relations read from shard_map's in_specs and out_specs. Ops are
    reported at the frame a developer would look at (frontends/jaxpr/frames.py).
    `induction`: scans that pair are exported once, for induction
    (dlverify/induction.py), with `Problem.unroll` rebuilding them unrolled."""
    avals = _avals_args(args)
    seq_closed = _trace(seq_fn, avals, "seq_fn")
    dist_closed = _trace(dist_fn, avals, "dist_fn")

    def build(summarise: bool) -> Problem | _Unpaired:
        with gc_paused():
            problem = _import(seq_closed, dist_closed, name, summarise)
        if isinstance(problem, Problem):
            prefer_callers(problem.seq, home_file(seq_fn))
            prefer_callers(problem.dist, home_file(dist_fn))
        return problem

    problem = build(True) if induction else None
    if isinstance(problem, Problem):
        if problem.scans:
            problem.unroll = lambda: build(False)  # type: ignore[assignment,return-value]
        return problem
    # (no induction asked, or scans that do not pair: built unrolled)
    unrolled = build(False)
    assert isinstance(unrolled, Problem)
    if isinstance(problem, _Unpaired):
        unrolled.notes.append(f"scans unrolled, not verified by induction: {problem.reason}")
    return unrolled


@dataclass(frozen=True)
class _Unpaired:
    """Why the two programs' scans could not be exported once each (built unrolled)."""

    reason: str


def _import(seq_closed: Any, dist_closed: Any, name: str,
            summarise: bool) -> Problem | _Unpaired:
    """_Unpaired when scans were summarised (`summarise`) but do not pair: build unrolled."""
    ids = IdAllocator()

    seq = Graph("sequential")
    sb = GraphBuilder(seq, ids)
    seq_in = [sb.tensor(ir_shape(v.aval), _dtype(v.aval), f"in{i}")
              for i, v in enumerate(seq_closed.jaxpr.invars)]
    seq.inputs = seq_in
    seq_scans: list[Any] | None = [] if summarise else None
    seq.outputs = walk(Ctx(sb, None, False, scans=seq_scans), seq_closed, seq_in)

    found = _find_shard_map(dist_closed)
    if found is None:  # (scans of a global dist_fn are unrolled)
        if seq_scans:
            return _Unpaired("the distributed program does work outside its shard_map, "
                             "where its scans are not summarised")
        return _import_global(seq, seq_in, dist_closed, ids, name)
    sm, pos = found
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
            dist_in[i] = db.tensor(ir_shape(bv.aval), _dtype(bv.aval), f"in{i}")
            top_spec[i] = in_specs[k]
        elif tuple(spec_entries(top_spec[i])) != tuple(spec_entries(in_specs[k])):
            raise InputError(f"argument {i} is passed to shard_map twice with different in_specs")
        body_ids.append(dist_in[i])
    inputs = []
    for i, t in enumerate(dist_in):
        s_shape = seq.tensors[seq_in[i]].shape
        if t is None:  # unused by the distributed program: give it a replicated stand-in
            dist_in[i] = db.tensor(s_shape, seq.tensors[seq_in[i]].dtype, f"in{i}")
            top_spec[i] = ()
        rel = spec_relation(s_shape, spec_entries(top_spec[i]), mesh, f"in_specs[{i}]")
        if rel.dist_shape != dist.tensors[dist_in[i]].shape:
            raise InputError(f"argument {i}: in_specs give local shape {rel.dist_shape} but the "
                             f"shard_map body sees {dist.tensors[dist_in[i]].shape}")
        inputs.append(rel)
    dist.inputs = [t for t in dist_in if t is not None]
    dist_scans: list[Any] | None = [] if summarise else None
    dist.outputs = walk(Ctx(db, mesh, True, scans=dist_scans), body, body_ids)

    if len(dist.outputs) != len(seq.outputs):
        raise InputError(f"seq_fn returns {len(seq.outputs)} arrays but dist_fn returns "
                         f"{len(dist.outputs)}")
    outputs = []
    for i, (s, spec) in enumerate(zip(seq.outputs, p["out_specs"])):
        s_shape = seq.tensors[s].shape
        rel = spec_relation(s_shape, spec_entries(spec), mesh, f"out_specs[{i}]")
        if rel.dist_shape != dist.tensors[dist.outputs[i]].shape:
            raise InputError(f"output {i}: out_specs give local shape {rel.dist_shape} for the "
                             f"sequential shape {s_shape}, but the shard_map body returns "
                             f"{dist.tensors[dist.outputs[i]].shape}")
        outputs.append(rel)
    seq.input_names = dist.input_names = [f"in{i}" for i in range(n_top)]
    seq.output_names = dist.output_names = [f"out{i}" for i in range(len(seq.outputs))]
    problem = Problem(seq, dist, mesh, inputs, outputs, ids, [], name)
    if seq_scans or dist_scans:
        why = _pair_scans(problem, seq_scans or [], dist_scans or [])
        if why is not None:
            return _Unpaired(why)
    return problem


def _pair_scans(problem: Problem, seq_scans: list[Any], dist_scans: list[Any]) -> str | None:
    """problem.scans: the summaries of the scans, paired in order (dlverify/induction.py);
    why they do not all pair (None when they do)."""
    from dlverify.induction import ScanSummary, pair_scans

    why = pair_scans(seq_scans, dist_scans)
    if why is not None:
        return why
    for a, b in zip(seq_scans, dist_scans):
        body = Problem(a.body, b.body, problem.mesh, [], [], problem.ids, [], f"{problem.name} {b.where}")
        problem.scans.append(ScanSummary(a, b, body))
    return None


def _import_global(seq: Graph, seq_in: list[int], dist_closed: Any, ids: IdAllocator,
                   name: str) -> Problem:
    """A dist_fn with work outside its shard_map: every rank runs the global code,
    and the shard_map boundary becomes block slices and gathers
    (frontends/jaxpr/shard_map.py); inputs and outputs are replicated."""
    mesh = find_mesh(dist_closed)
    if mesh is None:
        raise InputError("dist_fn holds no jax.shard_map: nothing in it runs on several ranks")
    dist = Graph("distributed")
    db = GraphBuilder(dist, ids)
    if len(dist_closed.jaxpr.invars) != len(seq_in):
        raise InputError(f"seq_fn takes {len(seq_in)} array arguments but dist_fn takes "
                         f"{len(dist_closed.jaxpr.invars)}")
    dist.inputs = [db.tensor(seq.tensors[t].shape, seq.tensors[t].dtype, f"in{i}")
                   for i, t in enumerate(seq_in)]
    dist.outputs = walk(Ctx(db, mesh, False), dist_closed, dist.inputs)
    if len(dist.outputs) != len(seq.outputs):
        raise InputError(f"seq_fn returns {len(seq.outputs)} arrays but dist_fn returns "
                         f"{len(dist.outputs)}")
    outputs = []
    for i, (s, d) in enumerate(zip(seq.outputs, dist.outputs)):
        if seq.tensors[s].shape != dist.tensors[d].shape:
            raise InputError(f"output {i}: seq_fn returns shape {seq.tensors[s].shape} but dist_fn "
                             f"returns {dist.tensors[d].shape}")
        outputs.append(spec_relation(seq.tensors[s].shape, (), mesh, f"output {i}"))
    inputs = [spec_relation(seq.tensors[t].shape, (), mesh, f"argument {i}")
              for i, t in enumerate(seq_in)]
    seq.input_names = dist.input_names = [f"in{i}" for i in range(len(seq_in))]
    seq.output_names = dist.output_names = [f"out{i}" for i in range(len(seq.outputs))]
    return Problem(seq, dist, mesh, inputs, outputs, ids, [], name)
