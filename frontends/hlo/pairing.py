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

from dataclasses import replace
from typing import Any

import numpy as np
from dlverify.frontends.hlo.boundary import (
    constant_value,
    opaque_value,
    padded_split_input,
    rank0_only_input,
    rank_id_value,
    reshaped_input,
    reduce_output,
    segment_input,
)
from dlverify.frontends.hlo.lower import HloParam, hlo_to_graph
from dlverify.frontends.hlo.model import FLAT_AXIS, MAX_RANKS, HloModule
from dlverify.frontends.hlo.pairing_records import (
    Decision,
    PairingRecord,
    ParamPair,
    ParamPolicy,
    ParamRecord,
)
from dlverify.frontends.hlo.param_infer import (
    CutFinder,
    RankCount,
    infer_segments,
    match_params,
    ranks_from_collectives,
    shapes_compatible,
)

from dlverify.errors import InputError
from dlverify.ir import Frame, Graph, IdAllocator, Mesh, SourceLoc, Tensor
from dlverify.ops.dtypes import is_int_dtype
from dlverify.problem import Problem
from dlverify.relations import (
    BlockRelation,
    even_split_dim,
    padded_split_dim,
    replicated,
    reshaped_split_dims,
    split_dim_of,
    split_relation,
)
from dlverify.spec import ParamSpec, Spec


def _shape_str(shape: tuple[int, ...], dtype: str = "") -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def resolve_ranks(dist_mod: HloModule, ranks: int | None, spec: Spec | None) -> RankCount:
    """The rank count: `ranks` (the --ranks argument), else the spec's, else the
    module header's, else the largest rank the collectives name (evidence
    set: an assumption); it must agree with the header when the header
    declares one."""
    spec_file = spec.file if spec is not None else ""
    header_n = (dist_mod.num_partitions or 1) * (dist_mod.replica_count or 1)
    evidence = ""
    if ranks is not None:
        n, source, where = ranks, "--ranks", dist_mod.file
    elif spec is not None and spec.ranks is not None:
        n, source, where = spec.ranks, f"the spec's ranks ({spec_file})", spec_file
    elif header_n > 1:
        n, source, where = header_n, "num_partitions/replica_count", dist_mod.file
    else:
        found = ranks_from_collectives(dist_mod)
        if found is None:
            raise InputError("the number of ranks is unknown: the distributed module declares no "
                             "num_partitions or replica_count and its collectives name no rank; "
                             "pass --ranks or set `ranks` in the spec", dist_mod.file)
        n, source, where, evidence = found.n, "the collectives", dist_mod.file, found.evidence
    if not 1 <= n <= MAX_RANKS:
        raise InputError(f"{source} gives {n} ranks: the supported range is 1..{MAX_RANKS}", where)
    if header_n > 1 and header_n != n:
        raise InputError(f"{source} says {n} ranks but the module declares "
                         f"num_partitions * replica_count = {header_n}", dist_mod.file)
    return RankCount(n, evidence)


def _pair_params(seq: Graph, sp: list[HloParam], dist: Graph, dp: list[HloParam],
                 dist_args: list[int] | None, spec: Spec | None, n: int, files: tuple[str, str],
                 assumptions: list[str]) -> list[ParamPair]:
    """One ParamPair per sequential parameter, in number order. `dist_args`
    (from jax.jit) fixes the pairing; else the spec's `dist = J` entries, then
    the parameter numbers when every such pair's dtypes and shapes fit, else
    `param_infer.match_params` (each pair it makes is an assumption)."""
    seq_file, dist_file = files
    if dist_args is not None:
        if len(dp) != len(dist_args):
            raise InputError(f"the distributed module has {len(dp)} parameters but "
                             f"{len(dist_args)} arguments were kept", dist_file)
        by_arg = dict(zip(dist_args, dp))
        return [ParamPair(a, by_arg.get(i)) for i, a in enumerate(sp)]
    spec_file = spec.file if spec is not None else ""
    spec_params = spec.params if spec is not None else {}
    dist_only = spec.dist_params if spec is not None else {}
    for j, ds in dist_only.items():
        if j >= len(dp):
            raise InputError(f"[dist_params] names parameter {j}, but the distributed module has "
                             f"{len(dp)} parameters", spec_file, ds.line)
    explicit = {k: ps.dist for k, ps in spec_params.items() if ps.dist is not None}
    for k, j in explicit.items():
        if j >= len(dp):
            raise InputError(f"parameter {k}: dist = {j}, but the distributed module has "
                             f"{len(dp)} parameters", spec_file, spec_params[k].line)
    free_s = [a for a in sp if a.number not in explicit]
    free_d = [b for b in dp if b.number not in explicit.values() and b.number not in dist_only]

    def fits(a: HloParam, b: HloParam) -> bool:
        annotated = b.relation is not None and b.relation.seq_shape == a.shape
        return a.dtype == b.dtype and (a.number in spec_params or annotated
                                       or shapes_compatible(a.shape, b.shape, n))

    def fits_reshaped(a: HloParam, b: HloParam) -> bool:   # only where nothing else pairs
        return fits(a, b) or (a.dtype == b.dtype
                               and bool(reshaped_split_dims(a.shape, b.shape, n)))
    by_num = {b.number: b for b in dp}
    if len(free_s) == len(free_d) and all(a.number == b.number and fits(a, b)
                                           for a, b in zip(free_s, free_d)):
        chosen = {a.number: b for a, b in zip(free_s, free_d)}
        why: dict[int, str] = {}
    else:
        found = match_params(free_s, free_d, seq, dist, fits)
        if found.unpaired_dist:
            found = match_params(free_s, free_d, seq, dist, fits_reshaped)
        chosen = {m.seq: by_num[m.dist] for m in found.matches}
        why = {m.seq: m.evidence for m in found.matches}
        for m in found.matches:
            assumptions.append(f"parameter {m.seq} ({sp[m.seq].name}) paired with distributed "
                               f"parameter {m.dist} ({by_num[m.dist].name}): {m.evidence}")
        if found.unpaired_dist:
            b = by_num[found.unpaired_dist[0]]
            cands = [f"{a.number} ({_shape_str(a.shape, a.dtype)})" for a in sp
                     if a.number not in chosen and a.dtype == b.dtype] or ["none"]
            raise InputError(f"distributed parameter {b.number} ({b.name} "
                             f"{_shape_str(b.shape, b.dtype)}) has no sequential counterpart "
                             f"(unpaired sequential parameters of its dtype: {', '.join(cands)}): "
                             f"pair it with dist = {b.number} in the spec's [params], or declare "
                             f"it in [dist_params] as \"rank_id\", \"unused\" or "
                             f"{{ value = X }}", dist_file, b.line)
        for k in found.unpaired_seq:
            assumptions.append(f"parameter {k} ({sp[k].name}) has no distributed counterpart: "
                               f"the distributed program does not read it")
    chosen.update({k: by_num[j] for k, j in explicit.items()})
    return [ParamPair(a, chosen.get(a.number), why.get(a.number, "")) for a in sp]


def _split_label(rel: BlockRelation, n: int) -> str:
    d = split_dim_of(rel, n)
    return "replicated" if rel.is_replicated() else f"split along dim {d}"


def _shape_candidates(a: HloParam, b: HloParam, n: int, finders: tuple[CutFinder, CutFinder],
                      dist_file: str) -> list[Decision]:
    """The relations the shapes allow, the likeliest first: the same shape is
    replicated; one dim divided by the rank count is an even split, or segments of
    it when both programs cut their blocks (param_infer.infer_segments); one dim not
    divided is a padded split; otherwise the block of any dim the rank count divides
    (or the whole value) reshaped row-major to the distributed shape, the one shape
    class with several candidates (dlverify/trial.py tries them)."""
    head = (f"parameter {a.number} ({b.name}, sequential {_shape_str(a.shape, a.dtype)}, "
            f"distributed {_shape_str(b.shape, b.dtype)})")
    padded = padded_split_dim(a.shape, b.shape, n)
    if padded is not None:
        why = (f"split along dim {padded} in blocks of {b.shape[padded]} over {n} ranks, rank "
               f"order, the last padded past the end with values nothing is known of "
               f"(inferred from the shapes)")
        return [Decision(None, padded, pad="any", evidence=why, assumption=f"{head}: {why}",
                          label=f"padded split along dim {padded}")]
    if a.shape == b.shape:
        why = "replicated (same shape in both programs)"
        return [Decision(replicated(a.shape, n), evidence=why, assumption=f"{head}: {why}",
                          label="replicated")]
    d = even_split_dim(a.shape, b.shape, n)
    if d is not None:
        segs = infer_segments(finders[0], a.tensor, finders[1], b.tensor, d, n)
        if segs is not None:
            why = (f"segments {list(segs.sizes)} of dim {segs.dim}, each split evenly over {n} "
                   f"ranks, rank order: {segs.evidence}")
            # (not tried against a plain even split: both programs cut their blocks at
            # these boundaries, and a try could only move where a bug is reported)
            return [Decision(None, segs.dim, segs.sizes, evidence=segs.evidence,
                              assumption=f"{head}: {why}",
                              label=f"segments {list(segs.sizes)} of dim {segs.dim}")]
        why = f"split evenly along dim {d} over {n} ranks, rank order (inferred from the shapes)"
        return [Decision(split_relation(a.shape, d, n), evidence=why,
                          assumption=f"{head}: {why}", label=f"split along dim {d}")]
    cands: list[Decision] = []
    for rd in reshaped_split_dims(a.shape, b.shape, n):
        rel = replicated(a.shape, n) if rd is None else split_relation(a.shape, rd, n)
        what = "the whole value" if rd is None else \
            f"its block of an even split along dim {rd} over {n} ranks, rank order,"
        why = (f"{what} reshaped row-major to {_shape_str(b.shape)} (inferred from the element "
               f"counts)")
        cands.append(Decision(rel, reshaped=True, evidence=why, assumption=f"{head}: {why}",
                               label=f"{_split_label(rel, n)}, reshaped"))
    if not cands:
        raise InputError(f"parameter {a.number} ({b.name}): cannot infer its relation from the "
                         f"shapes {_shape_str(a.shape)} (sequential) and {_shape_str(b.shape)} "
                         f"(distributed) over {n} ranks: name it in the spec's [params]",
                         dist_file, b.line)
    return cands


def _unspecified(pair: ParamPair, n: int, policy: ParamPolicy,
                 finders: tuple[CutFinder, CutFinder], dist_file: str) -> list[Decision]:
    """The candidate relations of a parameter the spec does not name, the likeliest
    first (one when the annotation or the shapes leave no choice)."""
    a, b = pair.seq, pair.dist
    assert b is not None
    rel = b.relation
    if rel is not None and rel.seq_shape == a.shape and rel.dist_shape == b.shape \
            and len(rel.offsets) == n:
        sh = b.sharding.text if b.sharding is not None else ""
        listed = (f"parameter {a.number} ({b.name}): relation from its sharding annotation "
                  f"sharding={sh}") if policy.sharding_is_assumption else ""
        return [Decision(rel, evidence=f"from its sharding annotation sharding={sh}",
                          assumption=listed)]
    if policy.infer_from_shapes:
        return _shape_candidates(a, b, n, finders, dist_file)
    if b.sharding is None and n == 1:
        return [Decision(replicated(a.shape, n))]
    sh = b.sharding.text if b.sharding is not None else "none"
    raise InputError(f"parameter {a.number} ({a.name}): the distributed parameter {b.name} "
                     f"{list(b.shape)} has sharding={sh}, which does not give each device an even "
                     f"block of the sequential {list(a.shape)}", dist_file, b.line)


def _chosen(cands: list[Decision], i: int) -> Decision:
    """Candidate i, its listed assumption saying which others there were."""
    dec = cands[min(i, len(cands) - 1)]
    if len(cands) == 1:
        return dec
    others = " or ".join(c.label for c in cands if c is not dec)
    how = ("the likeliest" if i == 0 else "tried in turn (dlverify/trial.py) as the earlier "
           "ones did not verify")
    return replace(dec, assumption=f"{dec.assumption}; candidate {i + 1} of {len(cands)}, "
                   f"{how}; the others: {others}",
                   evidence=f"{dec.evidence}; chosen over: {others}")


def _record(pair: ParamPair, dec: Decision, n: int) -> ParamRecord:
    """The spec entry stating `dec` (None when no entry can state it, e.g. a
    2-D tiling read from a sharding annotation)."""
    a, b = pair.seq, pair.dist
    dist = b.number if b is not None and b.number != a.number else None
    why = "; ".join(x for x in (dec.evidence, pair.evidence and f"paired: {pair.evidence}") if x)
    if dec.rank0_only:
        entry: ParamSpec | None = ParamSpec("rank0_only", dist=dist)
    elif dec.pad is not None:
        entry = ParamSpec("split", dec.segment_dim, dist=dist, pad=dec.pad)
    elif dec.segments is not None:
        entry = ParamSpec("split", dec.segment_dim, dec.segments, dist=dist)
    else:
        rel = dec.relation
        assert rel is not None
        d = split_dim_of(rel, n)
        entry = (ParamSpec("replicated", dist=dist, reshaped=dec.reshaped) if rel.is_replicated()
                 else ParamSpec("split", d, dist=dist, reshaped=dec.reshaped) if d is not None
                 else None)
    return ParamRecord(a.number, b.number if b is not None else None, entry, why)


def _spec_decision(pair: ParamPair, ps: ParamSpec, n: int, spec_file: str) -> Decision:
    """The relation the spec states."""
    a, b = pair.seq, pair.dist
    assert b is not None
    where = f"parameter {a.number} ({b.name}): spec {ps.describe()}"
    if ps.reshaped:
        return _reshaped_decision(a, b, ps, n, spec_file, where)
    if ps.kind in ("replicated", "rank0_only"):
        if a.shape != b.shape:
            raise InputError(f"{where}, but the sequential shape {_shape_str(a.shape)} differs "
                             f"from the distributed {_shape_str(b.shape)}", spec_file, ps.line)
        if ps.kind == "rank0_only":
            return Decision(None, rank0_only=True)
        return Decision(replicated(a.shape, n))
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
        return Decision(None, d, ps.segments)
    even = a.shape[d] % n == 0 and b.shape == split_relation(a.shape, d, n).dist_shape
    if ps.pad is not None and not even:
        # blocks of the distributed size k along d (whole heads, say), n * k >= the dim
        k = b.shape[d] if len(b.shape) == len(a.shape) else 0
        if a.shape[:d] + a.shape[d + 1:] != b.shape[:d] + b.shape[d + 1:] or n * k < a.shape[d]:
            raise InputError(f"{where}: the distributed shape {_shape_str(b.shape)} is not "
                             f"{_shape_str(a.shape)} with dim {d} cut in {n} blocks that "
                             f"cover it", spec_file, ps.line)
        return Decision(None, d, pad=ps.pad)
    if a.shape[d] % n:
        raise InputError(f"{where}: dim {d} of size {a.shape[d]} does not split evenly over "
                         f"{n} ranks (a padded split: pad = \"zero\" or \"any\")", spec_file,
                         ps.line)
    rel = split_relation(a.shape, d, n)
    if rel.dist_shape != b.shape:
        raise InputError(f"{where} gives local shape {_shape_str(rel.dist_shape)}, but the "
                         f"distributed module declares {_shape_str(b.shape)}", spec_file, ps.line)
    return Decision(rel)


def _reshaped_decision(a: HloParam, b: HloParam, ps: ParamSpec, n: int, spec_file: str,
                       where: str) -> Decision:
    """A spec entry with `reshaped = true`: the block (or the whole value) has as many
    elements as the distributed parameter."""
    if ps.kind == "replicated":
        rel = replicated(a.shape, n)
    else:
        d = ps.dim
        assert d is not None
        if d >= len(a.shape) or a.shape[d] % n:
            raise InputError(f"{where}: dim {d} of the sequential shape {_shape_str(a.shape)} "
                             f"does not split evenly over {n} ranks", spec_file, ps.line)
        rel = split_relation(a.shape, d, n)
    if int(np.prod(rel.dist_shape)) != int(np.prod(b.shape)):
        raise InputError(f"{where}: the block {_shape_str(rel.dist_shape)} and the distributed "
                         f"parameter {_shape_str(b.shape)} hold different numbers of elements",
                         spec_file, ps.line)
    return Decision(rel, reshaped=rel.dist_shape != b.shape)


def _padded_inputs(seq: Graph, dist: Graph, ids: IdAllocator, a: HloParam, b: HloParam,
                   dec: Decision, n: int, label: str, loc: SourceLoc) -> list[BlockRelation]:
    """A padded split written as ops (boundary.padded_split_input): the distributed
    parameter becomes rank r's block of a replicated input padded past its end; with
    padding of unknown values (pad "any"), the padding is each rank's block of a fresh
    input pair no other op reads, put right after it in both graphs. The relations of
    the new inputs."""
    d = dec.segment_dim
    assert d is not None
    k = b.shape[d]
    junk_len = n * k - a.shape[d]
    junk = None
    rels = [replicated(a.shape, n)]
    if dec.pad == "any":
        junk_seq_shape = a.shape[:d] + (n * junk_len,) + a.shape[d + 1:]
        junk_dist_shape = a.shape[:d] + (junk_len,) + a.shape[d + 1:]
        junk_s = Tensor(ids(), junk_seq_shape, a.dtype, f"{label}.padding")
        junk = Tensor(ids(), junk_dist_shape, a.dtype, f"{label}.padding")
        seq.tensors[junk_s.id], dist.tensors[junk.id] = junk_s, junk
        rels.append(split_relation(junk_seq_shape, d, n))
    pos = dist.inputs.index(b.tensor)
    padded_split_input(dist, ids, b.tensor, d, a.shape[d], n,
                       None if junk is None else junk.id, label, loc)
    if junk is not None:
        seq.inputs.insert(seq.inputs.index(a.tensor) + 1, junk_s.id)
        dist.inputs.insert(pos + 1, junk.id)
        for names in (seq.input_names, dist.input_names):
            names.insert(pos + 1, f"{label}.padding")
    return rels


def _dist_only_values(dist: Graph, ids: IdAllocator, dp: list[HloParam], spec: Spec | None,
                      dist_file: str) -> None:
    """The distributed-only parameters the spec declares become what it says they
    hold (they are no longer inputs: `pair_modules` rebuilds the input list)."""
    if spec is None:
        return
    for j, ds in sorted(spec.dist_params.items()):
        b = dp[j]
        loc = SourceLoc((Frame(dist_file, b.line, b.name),), "")
        label = f"dist_param{j}"
        if ds.kind == "rank_id":
            if not is_int_dtype(b.dtype) or len(b.shape) > 1 or (b.shape and b.shape[0] != 1):
                raise InputError(f"[dist_params] {j} = \"rank_id\": {b.name} is "
                                 f"{_shape_str(b.shape, b.dtype)}, not an integer scalar",
                                 spec.file, ds.line)
            rank_id_value(dist, ids, b.tensor, label, loc)
        elif ds.kind == "value":
            if len(b.shape) and int(np.prod(b.shape)) != 1:
                raise InputError(f"[dist_params] {j} = {ds.describe()}: {b.name} is "
                                 f"{_shape_str(b.shape, b.dtype)}, not a scalar", spec.file, ds.line)
            assert ds.value is not None
            constant_value(dist, ids, b.tensor, ds.value, label, loc)
        else:
            opaque_value(dist, ids, b.tensor, label, loc)



def _spec_outputs(spec: Spec, seq_outs: list[tuple[int, ...]], dist_outs: list[tuple[int, ...]],
                  n: int) -> list[BlockRelation | None]:
    outputs: list[BlockRelation | None] = [None] * len(seq_outs)
    assert spec.outputs is not None
    for i, os_ in spec.outputs.items():
        if i >= len(outputs):
            raise InputError(f"the spec names output {i}, but the modules return "
                             f"{len(outputs)} arrays", spec.file, os_.line)
        s_shape, d_shape = seq_outs[i], dist_outs[i]
        if os_.kind in ("replicated", "sum", "mean"):
            rel = replicated(s_shape, n)   # a sum or mean is stated as ops: see pair_modules
            what = f'"{os_.kind}"'
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
                 instruction_frames: bool = False, name: str = "",
                 records: PairingRecord | None = None,
                 choice: dict[int, int] | None = None) -> Problem:
    """The Problem of a sequential module and a distributed (SPMD, one program
    per rank) module; see the module docstring for the steps. `dist_args`: the
    sequential parameter of each distributed parameter (default: the same
    number); `input_names`: names of the sequential parameters (default
    paramN); `expected_outputs`: output relations from the caller (used where
    the spec has no `[outputs]` entry; an output whose distributed shape
    disagrees with it is an error); `records`: if given, filled with what was
    decided (what `dlverify spec` prints) and with the parameters that had several
    candidate relations; `choice`: which candidate to take for such a parameter (by
    sequential parameter number; default the first, see dlverify/trial.py)."""
    rank_count = resolve_ranks(dist_mod, ranks, spec)
    n = rank_count.n
    spec_file = spec.file if spec is not None else ""
    seq, seq_info = hlo_to_graph(seq_mod, ids, "sequential", custom_calls=custom_calls,
                                 instruction_frames=instruction_frames)
    dist, dist_info = hlo_to_graph(dist_mod, ids, "distributed", ranks=n,
                                   custom_calls=custom_calls, instruction_frames=instruction_frames)
    assumptions = list(dict.fromkeys(seq_info.assumptions + dist_info.assumptions))
    if rank_count.evidence:
        assumptions.append(rank_count.evidence)
    pairs = _pair_params(seq, seq_info.params, dist, dist_info.params, dist_args, spec, n,
                         (seq_mod.file, dist_mod.file), assumptions)
    spec_params = spec.params if spec is not None else {}
    for k, ps in spec_params.items():
        if k >= len(pairs):
            raise InputError(f"the spec names parameter {k}, but the modules have {len(pairs)} "
                             f"parameters (0..{len(pairs) - 1})", spec_file, ps.line)
    if input_names is not None and len(input_names) != len(pairs):
        raise InputError(f"the sequential module has {len(pairs)} parameters for "
                         f"{len(input_names)} array arguments", seq_mod.file, seq_mod.entry.line)
    _dist_only_values(dist, ids, dist_info.params, spec, dist_mod.file)

    decisions: list[Decision] = []
    finders = (CutFinder(seq), CutFinder(dist))
    dist_inputs: list[int] = []
    for pair in pairs:
        a, b = pair.seq, pair.dist
        if b is None:  # unused by the distributed program: a replicated stand-in nothing reads
            tid = ids()
            dist.tensors[tid] = Tensor(tid, a.shape, a.dtype, a.name)
            dist_inputs.append(tid)
            decisions.append(Decision(replicated(a.shape, n)))
            continue
        dist_inputs.append(b.tensor)
        if a.dtype != b.dtype:
            raise InputError(f"parameter {a.number} ({b.name}) is {b.dtype} in the distributed "
                             f"module but {a.dtype} in the sequential one", dist_mod.file, b.line)
        ps = spec_params.get(a.number)
        if ps is None:
            cands = _unspecified(pair, n, policy, finders, dist_mod.file)
            if len(cands) > 1 and records is not None:
                records.candidates[a.number] = [c.label for c in cands]
            dec = _chosen(cands, (choice or {}).get(a.number, 0))
            if dec.assumption:
                assumptions.append(dec.assumption)
            decisions.append(dec)
        else:
            decisions.append(_spec_decision(pair, ps, n, spec_file))
    dist.inputs = dist_inputs
    if records is not None:
        records.rank_evidence = rank_count.evidence
        records.params.extend(_record(p, d, n) for p, d in zip(pairs, decisions))
    seq.input_names = list(input_names) if input_names is not None else \
        [f"param{p.seq.number}" for p in pairs]
    dist.input_names = list(seq.input_names)

    # Relations stated as ops (frontends/hlo/boundary.py); segmented parameters
    # split both graphs' inputs, highest position first so earlier positions stay valid.
    per_pos: list[list[BlockRelation]] = [[] for _ in pairs]
    for pos in reversed(range(len(pairs))):
        dec, a, b = decisions[pos], pairs[pos].seq, pairs[pos].dist
        if dec.relation is not None and not dec.reshaped:
            per_pos[pos] = [dec.relation]
            continue
        assert b is not None
        label = f"param{a.number}"
        seq_loc = SourceLoc((Frame(seq_mod.file, a.line, a.name),), "")
        dist_loc = SourceLoc((Frame(dist_mod.file, b.line, b.name),), "")
        if dec.relation is not None:   # reshaped
            reshaped_input(dist, ids, b.tensor, dec.relation.dist_shape, label, dist_loc)
            per_pos[pos] = [dec.relation]
            continue
        if dec.rank0_only:
            rank0_only_input(dist, ids, b.tensor, label, dist_loc)
            per_pos[pos] = [replicated(a.shape, n)]
            continue
        if dec.pad is not None:
            per_pos[pos] = _padded_inputs(seq, dist, ids, a, b, dec, n, label, dist_loc)
            continue
        d, sizes = dec.segment_dim, dec.segments
        assert d is not None and sizes is not None
        seg_seq = [a.shape[:d] + (s,) + a.shape[d + 1:] for s in sizes]
        seg_dist = [a.shape[:d] + (s // n,) + a.shape[d + 1:] for s in sizes]
        segment_input(seq, ids, seq.inputs.index(a.tensor), d, seg_seq, label, seq_loc)
        segment_input(dist, ids, dist.inputs.index(b.tensor), d, seg_dist, label, dist_loc)
        per_pos[pos] = [split_relation(sh, d, n) for sh in seg_seq]
    relations = [r for group in per_pos for r in group]

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
        for i, os_ in spec.outputs.items():
            if os_.kind in ("sum", "mean"):
                assumptions.append(f"output {i}: the {os_.kind} over the {n} ranks of their "
                                   f"outputs (the spec's [outputs] {i} = \"{os_.kind}\"), "
                                   f"stated as an all-reduce appended to the distributed module")
                reduce_output(dist, ids, i, n, os_.kind == "mean", f"out{i}.{os_.kind}",
                              SourceLoc((Frame(dist_mod.file, dist_mod.entry.root.line,
                                               dist_mod.entry.root.name),), ""))
    if input_names is not None:
        seq.output_names = dist.output_names = [f"out{i}" for i in range(len(seq_outs))]
    return Problem(seq, dist, Mesh((FLAT_AXIS,), (n,)), relations,  # type: ignore[arg-type]
                   outputs, ids, assumptions, name, normal_form=True)


__all__ = ["pair_modules", "resolve_ranks", "ParamPolicy", "ParamPair", "ParamRecord",
           "PairingRecord"]
