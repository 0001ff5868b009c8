"""What a pair of HLO modules says about its own boundary when no spec does.

Three questions, each answered with the evidence that answered it (the
evidence goes into the verdict's assumptions and into `dlverify spec`'s
comments, so a wrong guess is visible, never hidden behind "verified"):

* `ranks_from_collectives`: the rank count of a module that declares no
  num_partitions / replica_count, from the largest rank its collectives name
  (replica groups, collective-permute pairs).
* `match_params`: which distributed parameter is which sequential one when the
  parameter numbers do not line up (torch_xla numbers parameters by first use
  and adds its own). Parameters pair by metadata (op_name), then by shape
  compatibility, use signature (the kinds of the ops that read them) and
  finally by number, as one maximum-weight assignment (scipy).
* `infer_segments`: a parameter whose product the sequential program cuts into
  pieces along the dim the ranks split (a fused QKV weight: Q | K | V) is a
  segmented split: each rank holds its even share of every piece. The pieces
  come from the sequential program (the reference); the distributed program's
  own cuts are only corroboration, so a wrong distributed slice is still a bug
  located at that slice rather than a reason to pick another relation.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np
from dlverify.frontends.hlo.attributes import ints, parse_replica_groups
from dlverify.frontends.hlo.lower import HloParam
from dlverify.frontends.hlo.model import HloModule
from scipy.optimize import linear_sum_assignment

from dlverify.ir import Graph, Op
from dlverify.ops.table import KINDS, Family
from dlverify.relations import even_split_dim, padded_split_dim
from dlverify.rewrites import _dot_out_dim


@dataclass(frozen=True)
class RankCount:
    """A rank count read from a module's collectives, and where it was read."""

    n: int
    evidence: str


def ranks_from_collectives(mod: HloModule) -> RankCount | None:
    """The number of ranks the collectives of `mod` address: one more than the
    largest rank any replica group or collective-permute pair names. None when
    no collective names a rank (`replica_groups={}` means "every rank", which
    says nothing about how many there are)."""
    best: tuple[int, str, int] | None = None
    for comp in mod.computations.values():
        for ins in comp.instructions:
            members: list[int] = []
            try:
                groups = parse_replica_groups(ins.attrs.get("replica_groups"))
            except ValueError:
                groups = None     # the lowering reports the bad attribute at its line
            for g in groups or ():
                members.extend(g)
            members.extend(ints(ins.attrs.get("source_target_pairs")))
            if members and (best is None or max(members) + 1 > best[0]):
                best = (max(members) + 1, ins.opcode, ins.line)
    if best is None:
        return None
    n, opcode, line = best
    return RankCount(n, f"{n} ranks from the replica groups of {opcode} at "
                        f"{mod.file.rsplit('/', 1)[-1]}:{line} (the module declares no "
                        f"num_partitions)")


# ---------------------------------------------------------------------------
# Parameter pairing

def shapes_compatible(seq: tuple[int, ...], dist: tuple[int, ...], n: int) -> bool:
    """Whether some relation the shapes can state links the two: equal shapes
    (replicated), or one dim of the sequential shape divided by `n`, evenly or in
    padded blocks."""
    return (seq == dist or even_split_dim(seq, dist, n) is not None
            or padded_split_dim(seq, dist, n) is not None)


def use_signatures(g: Graph, tensors: list[int]) -> dict[int, tuple[tuple[str, int], ...]]:
    """For each of `tensors`: the kinds of the ops that read it and the operand
    position they read it at, sorted: how a parameter is used, independent of
    its number. Collectives are left out (only the distributed program has
    them). One pass over the graph."""
    wanted = set(tensors)
    sig: dict[int, list[tuple[str, int]]] = {t: [] for t in tensors}
    for op in g.ops:
        kind = KINDS.get(op.kind)
        if kind is not None and kind.family is Family.COLLECTIVE:
            continue
        for pos, t in enumerate(op.inputs):
            if t in wanted:
                sig[t].append((op.kind, pos))
    return {t: tuple(sorted(v)) for t, v in sig.items()}


@dataclass(frozen=True)
class ParamMatch:
    """Distributed parameter `dist` is sequential parameter `seq`'s counterpart."""

    seq: int          # sequential parameter number
    dist: int         # distributed parameter number
    evidence: str


@dataclass(frozen=True)
class Pairing:
    """The outcome of `match_params`: the pairs, and the distributed parameters
    (numbers) and sequential ones that found no partner."""

    matches: tuple[ParamMatch, ...]
    unpaired_dist: tuple[int, ...]
    unpaired_seq: tuple[int, ...]


def match_params(sp: list[HloParam], dp: list[HloParam], seq_g: Graph, dist_g: Graph,
                 fits: Callable[[HloParam, HloParam], bool]) -> Pairing:
    """Pair parameters by a maximum-weight assignment (scipy's
    linear_sum_assignment) over the pairs that `fits` (dtype and shapes admit a
    relation). Weights, strongest first: the same non-empty metadata op_name;
    the same use signature; the same number. `fits` is asked once per distinct
    (sequential, distributed) dtype-and-shape pair, the rest is array
    arithmetic. Deterministic."""
    if not sp or not dp:
        return Pairing((), tuple(b.number for b in dp), tuple(a.number for a in sp))
    s_sig = use_signatures(seq_g, [a.tensor for a in sp])
    d_sig = use_signatures(dist_g, [b.tensor for b in dp])

    def codes(keys_s: list, keys_d: list) -> tuple[np.ndarray, np.ndarray]:
        table: dict = {}
        cs = np.array([table.setdefault(k, len(table)) for k in keys_s])
        cd = np.array([table.setdefault(k, len(table)) for k in keys_d])
        return cs, cd
    shape_s, shape_d = codes([(a.dtype, a.shape) for a in sp], [(b.dtype, b.shape) for b in dp])
    rep_s = {c: a for c, a in zip(shape_s.tolist(), sp)}
    rep_d = {c: b for c, b in zip(shape_d.tolist(), dp)}
    size = int(max(shape_s.max(), shape_d.max())) + 1
    table = np.zeros((size, size), dtype=bool)
    for i, a in rep_s.items():
        for j, b in rep_d.items():
            table[i, j] = fits(a, b)
    compat = table[np.ix_(shape_s, shape_d)]
    name_s, name_d = codes([a.op_name or None for a in sp], [b.op_name or None for b in dp])
    sig_s, sig_d = codes([s_sig[a.tensor] for a in sp], [d_sig[b.tensor] for b in dp])
    num_s = np.array([a.number for a in sp])
    num_d = np.array([b.number for b in dp])
    named = np.array([a.op_name != "" for a in sp])[:, None]
    same_name = (name_s[:, None] == name_d[None, :]) & named
    same_uses = sig_s[:, None] == sig_d[None, :]
    same_num = num_s[:, None] == num_d[None, :]
    weight = 1 + 1000 * same_name + 100 * same_uses + 10 * same_num
    weight = np.where(compat, weight, -1_000_000)
    rows, cols = linear_sum_assignment(weight, maximize=True)
    matches = []
    for i, j in zip(rows.tolist(), cols.tolist()):
        if not compat[i, j]:
            continue
        reasons = ["compatible shapes"]
        if same_name[i, j]:
            reasons.insert(0, f"same op_name {sp[i].op_name!r}")
        if same_uses[i, j]:
            reasons.append("same uses")
        if same_num[i, j]:
            reasons.append("same number")
        matches.append(ParamMatch(sp[i].number, dp[j].number, ", ".join(reasons)))
    matches.sort(key=lambda m: m.seq)
    got_s = {m.seq for m in matches}
    got_d = {m.dist for m in matches}
    return Pairing(tuple(matches), tuple(b.number for b in dp if b.number not in got_d),
                   tuple(a.number for a in sp if a.number not in got_s))


# ---------------------------------------------------------------------------
# Segmented splits

# How far from the parameter the cuts are looked for (ops on the tracked dim).
_TRACK_DEPTH = 4


def _dim_through(op: Op, g: Graph, pos: int, dim: int) -> int | None:
    """Where dim `dim` of operand `pos` lands in `op`'s output, when the op keeps
    that dim whole and in order (None: it does not, or we do not follow it)."""
    kind = KINDS.get(op.kind)
    if kind is None:
        return None
    out_shape = g.tensors[op.output].shape
    in_shape = g.tensors[op.inputs[pos]].shape
    if kind.family is Family.ELEMENTWISE and out_shape == in_shape:
        return dim
    if op.kind == "transpose":
        return list(op.params["permutation"]).index(dim)
    if op.kind == "broadcast_in_dim":
        return op.params["broadcast_dimensions"][dim]
    if op.kind == "dot_general" and pos in (0, 1):
        p = op.params
        key = "lhs" if pos == 0 else "rhs"
        if dim in p[f"{key}_contract"]:
            return None
        if dim in p[f"{key}_batch"]:
            return list(p[f"{key}_batch"]).index(dim)
        return _dot_out_dim(p, len(g.tensors[op.inputs[0]].shape),
                            len(g.tensors[op.inputs[1]].shape), pos, dim)
    return None


@dataclass(frozen=True)
class Cut:
    """A slice that takes [lo, hi) of the tracked dim, at `line` of the file."""

    lo: int
    hi: int
    where: str


class CutFinder:
    """The proper slices of a tensor's dim in one graph (`cuts`), with the
    graph's consumer index built once, on first use (pairing asks for every
    parameter whose shapes say "split", often none)."""

    def __init__(self, g: Graph) -> None:
        self.g = g

    @cached_property
    def uses(self) -> dict[int, list[Op]]:
        return self.g.consumers()

    def cuts(self, tensor: int, dim: int) -> list[Cut]:
        """The proper slices of `tensor`'s dim `dim`, followed through ops that
        keep that dim whole (elementwise, transpose, broadcast, the free dims of
        a dot) up to `_TRACK_DEPTH` ops away."""
        g, uses = self.g, self.uses
        size = g.tensors[tensor].shape[dim]
        cuts: list[Cut] = []
        front = [(tensor, dim)]
        seen = {(tensor, dim)}
        for _ in range(_TRACK_DEPTH):
            nxt = []
            for t, d in front:
                for op in uses.get(t, ()):
                    if op.kind == "slice":
                        lo, hi = op.params["start_indices"][d], op.params["limit_indices"][d]
                        strides = op.params.get("strides")
                        if (strides is None or strides[d] == 1) and (lo, hi) != (0, size):
                            cuts.append(Cut(lo, hi, _where(op)))
                        continue
                    for pos, x in enumerate(op.inputs):
                        if x != t:
                            continue
                        d2 = _dim_through(op, g, pos, d)
                        if d2 is not None and g.tensors[op.output].shape[d2] == size \
                                and (op.output, d2) not in seen:
                            seen.add((op.output, d2))
                            nxt.append((op.output, d2))
            front = nxt
        return cuts


def _where(op: Op) -> str:
    """`file:line` of the op (its instruction's line in an HLO file)."""
    if op.loc is None or not op.loc.frames:
        return op.name or op.kind
    return f"{op.loc.file.rsplit('/', 1)[-1]}:{op.loc.line}"


@dataclass(frozen=True)
class Segments:
    """A segmented split of dim `dim` (sizes `sizes`, in the sequential
    program), with the evidence for it."""

    dim: int
    sizes: tuple[int, ...]
    evidence: str


def infer_segments(seq: CutFinder, seq_t: int, dist: CutFinder, dist_t: int, dim: int,
                   n: int) -> Segments | None:
    """A segmented split of the parameter (`seq_t` / `dist_t`) along `dim`, when
    the sequential program cuts its products there into pieces that each split
    evenly over `n` ranks and the distributed program cuts its local products
    too (a program that never cuts its local block holds a plain even split)."""
    size = seq.g.tensors[seq_t].shape[dim]
    seq_cuts = seq.cuts(seq_t, dim)
    bounds = sorted({b for c in seq_cuts for b in (c.lo, c.hi)} - {0, size})
    if not bounds:
        return None
    sizes = tuple(b - a for a, b in zip([0] + bounds, bounds + [size]))
    if any(s % n for s in sizes):
        return None
    dist_cuts = dist.cuts(dist_t, dim)
    if not dist_cuts:
        return None
    local = sorted({b for c in dist_cuts for b in (c.lo, c.hi)}
                   - {0, dist.g.tensors[dist_t].shape[dim]})
    agree = local == [b // n for b in bounds]
    seq_at = ", ".join(sorted({c.where for c in seq_cuts}))
    dist_at = ", ".join(sorted({c.where for c in dist_cuts}))
    return Segments(dim, sizes,
                    f"the sequential program cuts dim {dim} of its products at {bounds} "
                    f"({seq_at}); the distributed program cuts its local products at {local} "
                    f"({dist_at}){'' if agree else ', which is not the same cut divided by ' + str(n)}")


__all__ = ["RankCount", "ranks_from_collectives", "ParamMatch", "Pairing", "match_params",
           "shapes_compatible", "use_signatures", "Cut", "CutFinder", "Segments",
           "infer_segments"]
