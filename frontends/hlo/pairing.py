"""The one place two HLO modules are paired into a Problem.

`pair_modules(seq, dist, ids, ...)` is used by every HLO path: a pair of files
with an optional relation spec (`dlverify check`, `hlo_api.hlo_problem`), the
modules of an XLA dump folder (`check-dump`), and a `jax.jit` with shardings
(frontends/jax_compiled.py). The steps:

1. the rank count: `--ranks`, else the spec's `ranks`, else the distributed
   module's num_partitions * replica_count (bounded by MAX_RANKS);
2. both modules lowered to IR graphs (frontends/hlo/lower.py);
3. parameters paired: by parameter number, or through `dist_args` (parameter
   j of the distributed module is sequential parameter dist_args[j]; the
   others get a replicated stand-in nothing reads: jit drops unused inputs);
4. each pair's relation: the spec's `[params]` entry, else the distributed
   parameter's `sharding=` when it gives every rank an even block, else
   (policy `infer_from_shapes`) the shapes: same shape is replicated, one dim
   divided by the rank count is an even split. Every relation not stated by
   the spec or the caller is listed in `Problem.assumptions`;
5. segmented splits (`{ split = d, segments = [...] }`, see dlverify/spec.py):
   the parameter becomes a concatenation of one input per segment in both
   graphs, each pair related by an even split;
6. outputs paired by position; expected relations from the spec's
   `[outputs]`, else from the caller (the ROOT sharding of the module before
   partitioning), else None (inferred from the views later, an assumption).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlverify.errors import InputError
from dlverify.frontends.hlo.lower import HloParam, hlo_to_graph
from dlverify.frontends.hlo.model import FLAT_AXIS, MAX_RANKS, HloModule
from dlverify.ir import Frame, Graph, IdAllocator, Mesh, Op, SourceLoc, Tensor
from dlverify.problem import Problem
from dlverify.relations import BlockRelation, replicated, split_relation
from dlverify.spec import ParamSpec, Spec


@dataclass(frozen=True)
class ParamPolicy:
    """How a parameter without a spec entry gets its relation."""

    # Fall back to the shapes when the sharding annotation gives no even block.
    infer_from_shapes: bool = True
    # The sharding annotation is read from a file (an assumption, listed), not
    # given by the caller (jax.jit's in_shardings are the user's own statement).
    sharding_is_assumption: bool = True


@dataclass(frozen=True)
class ParamPair:
    """Sequential parameter `seq` and its distributed counterpart (None: the
    distributed module dropped it as unused)."""

    seq: HloParam
    dist: HloParam | None


def _shape_str(shape: tuple[int, ...], dtype: str = "") -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def resolve_ranks(dist_mod: HloModule, ranks: int | None, spec: Spec | None) -> int:
    """The rank count: `ranks` (the --ranks argument), else the spec's, else the
    module header's; it must agree with the header when the header declares one."""
    spec_file = spec.file if spec is not None else ""
    header_n = (dist_mod.num_partitions or 1) * (dist_mod.replica_count or 1)
    if ranks is not None:
        n, source, where = ranks, "--ranks", dist_mod.file
    elif spec is not None and spec.ranks is not None:
        n, source, where = spec.ranks, f"the spec's ranks ({spec_file})", spec_file
    elif header_n > 1:
        n, source, where = header_n, "num_partitions/replica_count", dist_mod.file
    else:
        raise InputError("the number of ranks is unknown: the distributed module declares no "
                         "num_partitions or replica_count; pass --ranks or set `ranks` in the spec",
                         dist_mod.file)
    if not 1 <= n <= MAX_RANKS:
        raise InputError(f"{source} gives {n} ranks: the supported range is 1..{MAX_RANKS}", where)
    if header_n > 1 and header_n != n:
        raise InputError(f"{source} says {n} ranks but the module declares "
                         f"num_partitions * replica_count = {header_n}", dist_mod.file)
    return n


def _pair_params(sp: list[HloParam], dp: list[HloParam], dist_args: list[int] | None,
                 dist_mod: HloModule) -> list[ParamPair]:
    if dist_args is None:
        if len(sp) != len(dp):
            raise InputError(f"the sequential module has {len(sp)} parameters but the distributed "
                             f"one has {len(dp)}", dist_mod.file, dist_mod.entry.line)
        return [ParamPair(a, b) for a, b in zip(sp, dp)]
    if len(dp) != len(dist_args):
        raise InputError(f"the distributed module has {len(dp)} parameters but {len(dist_args)} "
                         f"arguments were kept", dist_mod.file, dist_mod.entry.line)
    by_arg = dict(zip(dist_args, dp))
    return [ParamPair(a, by_arg.get(i)) for i, a in enumerate(sp)]


def _infer(k: int, name: str, s_shape: tuple[int, ...], d_shape: tuple[int, ...], ranks: int,
           dist_file: str, line: int) -> tuple[BlockRelation, str]:
    if s_shape == d_shape:
        return replicated(s_shape, ranks), "replicated (same shape in both programs)"
    if len(s_shape) == len(d_shape):
        diff = [i for i, (a, b) in enumerate(zip(s_shape, d_shape)) if a != b]
        if len(diff) == 1 and d_shape[diff[0]] * ranks == s_shape[diff[0]]:
            d = diff[0]
            return (split_relation(s_shape, d, ranks),
                    f"split evenly along dim {d} over {ranks} ranks, rank order (inferred from "
                    f"the shapes)")
    raise InputError(f"parameter {k} ({name}): cannot infer its relation from the shapes "
                     f"{_shape_str(s_shape)} (sequential) and {_shape_str(d_shape)} (distributed) "
                     f"over {ranks} ranks: name it in the spec's [params]", dist_file, line)


def _unspecified_relation(pair: ParamPair, n: int, policy: ParamPolicy, dist_file: str,
                          assumptions: list[str]) -> BlockRelation:
    """The relation of a parameter the spec does not name."""
    a, b = pair.seq, pair.dist
    assert b is not None
    rel = b.relation
    if rel is not None and rel.seq_shape == a.shape and rel.dist_shape == b.shape \
            and len(rel.offsets) == n:
        if policy.sharding_is_assumption:
            sh = b.sharding.text if b.sharding is not None else ""
            assumptions.append(f"parameter {a.number} ({b.name}): relation from its sharding "
                               f"annotation sharding={sh}")
        return rel
    if policy.infer_from_shapes:
        rel, why = _infer(a.number, b.name, a.shape, b.shape, n, dist_file, b.line)
        assumptions.append(f"parameter {a.number} ({b.name}, sequential "
                           f"{_shape_str(a.shape, a.dtype)}, distributed "
                           f"{_shape_str(b.shape, b.dtype)}): {why}")
        return rel
    if b.sharding is None and n == 1:
        return replicated(a.shape, n)
    sh = b.sharding.text if b.sharding is not None else "none"
    raise InputError(f"parameter {a.number} ({a.name}): the distributed parameter {b.name} "
                     f"{list(b.shape)} has sharding={sh}, which does not give each device an even "
                     f"block of the sequential {list(a.shape)}", dist_file, b.line)


def _spec_relation(pair: ParamPair, ps: ParamSpec, n: int, spec_file: str) -> BlockRelation | None:
    """The relation the spec states (None for a segmented split, built later)."""
    a, b = pair.seq, pair.dist
    assert b is not None
    where = f"parameter {a.number} ({b.name}): spec {ps.describe()}"
    if ps.kind == "replicated":
        if a.shape != b.shape:
            raise InputError(f"{where}, but the sequential shape {_shape_str(a.shape)} differs "
                             f"from the distributed {_shape_str(b.shape)}", spec_file, ps.line)
        return replicated(a.shape, n)
    d = ps.dim
    assert d is not None
    if d >= len(a.shape):
        raise InputError(f"{where}: dim {d} is outside the rank-{len(a.shape)} shape "
                         f"{_shape_str(a.shape)}", spec_file, ps.line)
    if ps.segments:
        if sum(ps.segments) != a.shape[d]:
            raise InputError(f"{where}: segments sum to {sum(ps.segments)} but dim {d} of the "
                             f"sequential shape {_shape_str(a.shape)} is {a.shape[d]}",
                             spec_file, ps.line)
        bad = [s for s in ps.segments if s % n]
        if bad:
            raise InputError(f"{where}: segment of size {bad[0]} does not split evenly over "
                             f"{n} ranks", spec_file, ps.line)
        local = a.shape[:d] + (sum(s // n for s in ps.segments),) + a.shape[d + 1:]
        if local != b.shape:
            raise InputError(f"{where} gives local shape {_shape_str(local)}, but the "
                             f"distributed module declares {_shape_str(b.shape)}",
                             spec_file, ps.line)
        return None
    if a.shape[d] % n:
        raise InputError(f"{where}: dim {d} of size {a.shape[d]} does not split evenly over "
                         f"{n} ranks", spec_file, ps.line)
    rel = split_relation(a.shape, d, n)
    if rel.dist_shape != b.shape:
        raise InputError(f"{where} gives local shape {_shape_str(rel.dist_shape)}, but the "
                         f"distributed module declares {_shape_str(b.shape)}", spec_file, ps.line)
    return rel


def _segment(graph: Graph, ids: IdAllocator, pos: int, dim: int, piece_shapes: list[tuple[int, ...]],
             name: str, loc: SourceLoc) -> None:
    """Replace input `pos` of `graph` by one fresh input per piece and make the old
    input tensor their concatenation along `dim`."""
    t = graph.inputs[pos]
    dtype = graph.tensors[t].dtype
    pieces = []
    for i, shp in enumerate(piece_shapes):
        tid = ids()
        graph.tensors[tid] = Tensor(tid, tuple(shp), dtype, f"{name}.seg{i}")
        pieces.append(tid)
    graph.ops.insert(0, Op(ids(), "concatenate", list(pieces), t, {"dimension": dim}, loc,
                           f"{name}.segments"))
    graph.inputs[pos:pos + 1] = pieces
    graph.input_names[pos:pos + 1] = [f"{name}.seg{i}" for i in range(len(pieces))]


def _spec_outputs(spec: Spec, seq_outs: list[tuple[int, ...]], dist_outs: list[tuple[int, ...]],
                  n: int) -> list[BlockRelation | None]:
    outputs: list[BlockRelation | None] = [None] * len(seq_outs)
    assert spec.outputs is not None
    for i, os_ in spec.outputs.items():
        if i >= len(outputs):
            raise InputError(f"the spec names output {i}, but the modules return "
                             f"{len(outputs)} arrays", spec.file, os_.line)
        s_shape, d_shape = seq_outs[i], dist_outs[i]
        if os_.kind == "replicated":
            rel = replicated(s_shape, n)
            what = "replicated"
        else:
            assert os_.dim is not None
            if os_.dim >= len(s_shape) or s_shape[os_.dim] % n:
                raise InputError(f"output {i}: concat = {os_.dim} does not split the sequential "
                                 f"shape {_shape_str(s_shape)} evenly over {n} ranks",
                                 spec.file, os_.line)
            rel = split_relation(s_shape, os_.dim, n)
            what = f"{{ concat = {os_.dim} }}"
        if rel.dist_shape != d_shape:
            raise InputError(f"output {i}: spec {what} gives local shape "
                             f"{_shape_str(rel.dist_shape)} for the sequential "
                             f"{_shape_str(s_shape)}, but the distributed module returns "
                             f"{_shape_str(d_shape)}", spec.file, os_.line)
        outputs[i] = rel
    return outputs


def pair_modules(seq_mod: HloModule, dist_mod: HloModule, ids: IdAllocator, *,
                 ranks: int | None = None, spec: Spec | None = None,
                 dist_args: list[int] | None = None, input_names: list[str] | None = None,
                 expected_outputs: list[BlockRelation | None] | None = None,
                 policy: ParamPolicy = ParamPolicy(), custom_calls: dict[str, Any] | None = None,
                 instruction_frames: bool = False, name: str = "") -> Problem:
    """The Problem of a sequential module and a distributed (SPMD, one program
    per rank) module; see the module docstring for the steps. `dist_args`: the
    sequential parameter of each distributed parameter (default: the same
    number); `input_names`: names of the sequential parameters (default
    paramN); `expected_outputs`: output relations from the caller (used where
    the spec has no `[outputs]` entry; an output whose distributed shape
    disagrees with it is an error)."""
    n = resolve_ranks(dist_mod, ranks, spec)
    spec_file = spec.file if spec is not None else ""
    seq, seq_info = hlo_to_graph(seq_mod, ids, "sequential", custom_calls=custom_calls,
                                 instruction_frames=instruction_frames)
    dist, dist_info = hlo_to_graph(dist_mod, ids, "distributed", ranks=n,
                                   custom_calls=custom_calls, instruction_frames=instruction_frames)
    pairs = _pair_params(seq_info.params, dist_info.params, dist_args, dist_mod)
    spec_params = spec.params if spec is not None else {}
    for k, ps in spec_params.items():
        if k >= len(pairs):
            raise InputError(f"the spec names parameter {k}, but the modules have {len(pairs)} "
                             f"parameters (0..{len(pairs) - 1})", spec_file, ps.line)
    if input_names is not None and len(input_names) != len(pairs):
        raise InputError(f"the sequential module has {len(pairs)} parameters for "
                         f"{len(input_names)} array arguments", seq_mod.file, seq_mod.entry.line)

    assumptions = list(dict.fromkeys(seq_info.assumptions + dist_info.assumptions))
    relations: list[BlockRelation | None] = []
    dist_inputs: list[int] = []
    for pair in pairs:
        a, b = pair.seq, pair.dist
        if b is None:  # unused by the distributed program: a replicated stand-in nothing reads
            tid = ids()
            dist.tensors[tid] = Tensor(tid, a.shape, a.dtype, a.name)
            dist_inputs.append(tid)
            relations.append(replicated(a.shape, n))
            continue
        dist_inputs.append(b.tensor)
        if a.dtype != b.dtype:
            raise InputError(f"parameter {a.number} ({b.name}) is {b.dtype} in the distributed "
                             f"module but {a.dtype} in the sequential one", dist_mod.file, b.line)
        ps = spec_params.get(a.number)
        if ps is None:
            relations.append(_unspecified_relation(pair, n, policy, dist_mod.file, assumptions))
        else:
            relations.append(_spec_relation(pair, ps, n, spec_file))
    dist.inputs = dist_inputs
    if input_names is not None:
        seq.input_names = dist.input_names = list(input_names)

    # Segmented parameters: split both graphs' inputs (highest position first so
    # earlier positions stay valid).
    for pos in reversed(range(len(pairs))):
        ps = spec_params.get(pairs[pos].seq.number)
        if relations[pos] is not None or ps is None or not ps.segments:
            continue
        a, b = pairs[pos].seq, pairs[pos].dist
        assert b is not None and ps.dim is not None
        d = ps.dim
        seg_seq = [a.shape[:d] + (s,) + a.shape[d + 1:] for s in ps.segments]
        seg_dist = [a.shape[:d] + (s // n,) + a.shape[d + 1:] for s in ps.segments]
        label = f"param{a.number}"
        _segment(seq, ids, seq.inputs.index(a.tensor), d, seg_seq, label,
                 SourceLoc((Frame(seq_mod.file, a.line, a.name),), ""))
        _segment(dist, ids, dist.inputs.index(b.tensor), d, seg_dist, label,
                 SourceLoc((Frame(dist_mod.file, b.line, b.name),), ""))
        relations[pos:pos + 1] = [split_relation(s, d, n) for s in seg_seq]

    seq_outs = [shape for shape, _ in seq_info.outputs]
    dist_outs = [shape for shape, _ in dist_info.outputs]
    if len(seq_outs) != len(dist_outs):
        raise InputError(f"the sequential module returns {len(seq_outs)} arrays but the "
                         f"distributed one returns {len(dist_outs)}", dist_mod.file,
                         dist_mod.entry.root.line)
    outputs: list[BlockRelation | None] = [None] * len(seq_outs)
    if expected_outputs is not None and len(expected_outputs) == len(outputs):
        for i, rel in enumerate(expected_outputs):
            if rel is not None and rel.dist_shape != dist_outs[i]:
                raise InputError(f"output {i}: its sharding gives local shape "
                                 f"{list(rel.dist_shape)} but the distributed module returns "
                                 f"{list(dist_outs[i])}", dist_mod.file, dist_mod.entry.root.line)
            outputs[i] = rel
    if spec is not None and spec.outputs is not None:
        for i, rel in enumerate(_spec_outputs(spec, seq_outs, dist_outs, n)):
            if rel is not None:
                outputs[i] = rel
    if input_names is not None:
        seq.output_names = dist.output_names = [f"out{i}" for i in range(len(seq_outs))]
    return Problem(seq, dist, Mesh((FLAT_AXIS,), (n,)), relations,  # type: ignore[arg-type]
                   outputs, ids, assumptions, name)


__all__ = ["pair_modules", "resolve_ranks", "ParamPolicy", "ParamPair"]
