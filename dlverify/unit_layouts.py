"""Size-1 dims the distributed module never had, placed as the sequential program has
them: identities of the distributed graph, whose form is chosen by the other
program's (the normal form of dlverify/simplify.py sees one graph at a time).

A rank that holds one head of a dim the sequential program batches over (one KV
head per rank, replicated KV heads sliced out of the projection, a batch of one, a
decoding step of length 1) holds a block of size 1 there. The program as written keeps
that dim; XLA deletes it: it slices the rank's KV head straight out of the weight, so
its K and V never have the head dim, and the attention dots batch over the batch dim
alone, the query's head dim of one left free. Nothing in the distributed module says
where the dim was: a dot with a size-1 free dim in one operand is the same function
as the dot batching over it with a size-1 dim inserted into the other operand, and a
reshape that inserts size-1 dims is the same as a reshape to any order of them
followed by the transpose that moves them. Which form meets the sequential program
is read from that program:

* `lone_units_batched` (in the normal form's pass, distributed graph only): a dot
  with size-1 free dims in one operand and none in the other batches over the first
  k of them, a size-1 dim inserted into the other operand for each, when the
  sequential program has a dot with that many batch, free and contracted dims
  (its `dot_roles`) and none with the dot's own. The result differs by size-1 dims
  only and is reshaped back (simplify_forms._dot_then_unit_reshape). The datalog
  rules pair dots by their dimension numbers (datalog/contraction.dl), so a head
  dim batched on one side and absent on the other never met.
* `unit_layouts_as_sequential` (after the normal form, distributed graph only): the
  other way round, a dot's lone size-1 free dims deleted from their operand when that
  gives the dim counts of a sequential dot and its own are none's (the normal form
  takes a size-1 dim merged into a contraction out of it, simplify_merged.py, where the
  program merges the head dim into the output projection's contraction); and a
  chain of reshapes and transposes from x (a few ops) whose result is
  transpose(reshape(x, C), P) for a transpose P of a reshaped tensor of the sequential
  program (the program's [b, s, h*d] -> [b, s, h, d] -> [b, h, s, d]), or
  reshape(transpose(x, P)) for a reshape of a transposed one (the heads merged back),
  is written so, C read off the result (or x) and P, when it places every element
  alike (checked on the index array of x: data movement is fixed by where each
  element goes). The normal form writes a
  transpose that moves size-1 dims only as one reshape (simplify_layouts.py); on
  the sequential side the head dim is sized, the transpose stays, and the rules
  pair reshape with reshape (datalog/layout_algebra.dl) and transpose with
  transpose of the same permutation (datalog/layout.dl).

* the size-1 pairs of a dot (one size-1 dim in each operand) are batched by default
  (simplify_forms.unit_dims_batched), the KV groups a program batches over; with one
  head per rank XLA deletes the head dim where the program contracts it ((h, e) in the
  attention output projection: [b*s, e] x [e, D]), or keeps it free (query slots):
  `unit_pairs_as_sequential` batches or contracts each free pair (contracts one only
  beside an operand a dot batched over a size-1 dim: a micro-batch stays batched), and
  `keeps_unit_pairs_free` leaves them free, as the sequential dots do. The choice
  reads more than dim counts (which many dots share): `_fits` asks for a sequential dot
  with as many dims in each role, each dist dim's size dividing that dot's (a rank's
  block). Likewise unit_dims_into_dot takes a deleted head into a dot that contracts
  its neighbours when the program's dot keeps the head (`fits_better`: the weight
  gradient of the output projection, [d, h, e]), and keeps lone size-1 dims out when
  the dot already fits and would no longer (`keeps_lone_units_out`: lone_units_batched
  deletes a fused QKV's size-1 query slot beside the head of one it batches).
* chains may hold unit-stride slices: a slice under a transpose (XLA transposes the
  fused QKV projection once, then slices q and v) is written as the slice of the box of
  x it keeps, then the program's pair.
* dlverify/unit_placement.py: a unit move under a transpose in one form on both graphs
  before the chains are read, and a dot operand's deleted size-1 dims read through the
  transpose a sequential dot reads there (a query's weight gradient, one head per rank).

All rewrite the distributed graph by identities only; the sequential program only
chooses among equal forms, so a wrong choice costs a relation, never soundness.
tests/test_unit_layouts.py checks each numerically and where it must not fire.
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from dlverify.ir import CHAIN_DEPTH, Graph, IdAllocator, Op
from dlverify.ops.table import KINDS, Family
from dlverify.simplify_forms import _FormRules
from dlverify.unit_insertion import units_inserted
from dlverify.unit_placement import (canonical_units, deleted_units_transposed, free_units_placed,
                                     merged_dims_split, transposed_operands, transposed_reshapes,
                                     units_placed_as_operand, units_placed_as_operands)

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier

_CHAIN_KINDS = ("reshape", "transpose", "slice")   # (what a layout chain may hold)
DotRoles = tuple[int, tuple[int, int], int]   # batch dims, free dims per operand (sorted), contracted


def _roles(params: dict, lrank: int, rrank: int) -> DotRoles:
    nb, nc = len(params["lhs_batch"]), len(params["lhs_contract"])
    return nb, tuple(sorted((lrank - nb - nc, rrank - nb - nc))), nc


class PartnerDots(frozenset):
    """The sequential program's dot_roles, and the sizes of each dot's dims by role
    (`shapes`, see _dot_sizes) for the rules that read more than counts."""

    shapes: frozenset = frozenset()


def _dot_sizes(p: dict, lshape: tuple[int, ...], rshape: tuple[int, ...]) -> tuple:
    """(batch sizes, lhs free sizes, rhs free sizes, contracted sizes), in dim order."""
    free = [tuple(n for d, n in enumerate(shape) if d not in p[f"{key}_batch"]
                  and d not in p[f"{key}_contract"])
            for shape, key in ((lshape, "lhs"), (rshape, "rhs"))]
    return (tuple(lshape[d] for d in p["lhs_batch"]), free[0], free[1],
            tuple(lshape[d] for d in p["lhs_contract"]))


def _fits(p: dict, lshape: tuple[int, ...], rshape: tuple[int, ...], partner: PartnerDots) -> bool:
    """Whether a dot of params p over operands of these shapes could compute a block of a
    sequential dot: one with as many dims in each role (either operand first), each
    dim's size dividing that dot's (a rank's block of a dim, size 1 for one head)."""
    b, lf, rf, c = _dot_sizes(p, lshape, rshape)
    def divides(mine: tuple[int, ...], theirs: tuple[int, ...]) -> bool:
        return len(mine) == len(theirs) and all(t % m == 0 for m, t in zip(mine, theirs))
    return any(divides(b, tb) and divides(c, tc) and (
        divides(lf, tl) and divides(rf, tr) or divides(lf, tr) and divides(rf, tl))
        for tb, tl, tr, tc in partner.shapes)


def dot_roles(g: Graph) -> PartnerDots:
    """How many batch, free (per operand, unordered) and contracted dims each dot of g
    has (and the sizes: PartnerDots.shapes)."""
    dots = [(op.params, g.tensors[op.inputs[0]].shape, g.tensors[op.inputs[1]].shape)
            for op in g.ops if op.kind == "dot_general" and len(op.inputs) == 2]
    roles = PartnerDots(_roles(p, len(ls), len(rs)) for p, ls, rs in dots)
    roles.shapes = frozenset(_dot_sizes(p, ls, rs) for p, ls, rs in dots)
    return roles


def _lone_units(p: dict, shapes: list[tuple[int, ...]]) -> list[list[int]]:
    """Each operand's size-1 free dims, when one operand has some and the other none
    (else two empty lists)."""
    units = [[d for d, n in enumerate(shape) if n == 1
              and d not in p[f"{key}_batch"] and d not in p[f"{key}_contract"]]
             for shape, key in zip(shapes, ("lhs", "rhs"))]
    return units if bool(units[0]) != bool(units[1]) else [[], []]


def lone_units_batched(s: "_Simplifier", op: Op) -> bool:
    """See the module docstring; `s.partner_dots` is the sequential program's
    dot_roles (None: the rule is off, as on the sequential graph). The first k units
    are batched for the least k that gives a sequential dot's dim counts as it is, else
    with the next m of them deleted too (the least m first), unless deleting alone gives
    them (lone_units_deleted does, after the normal form) (a query slot's size-1 dim sliced out of a
    fused QKV projection beside the query's head of one). Which k of them does not
    matter: a reshape is its shapes, whichever size-1 dims it is said to move."""
    partner = getattr(s, "partner_dots", None)
    if not partner or op.kind != "dot_general" or len(op.inputs) != 2:
        return False
    p = op.params
    ranks = [len(s.shape(t)) for t in op.inputs]
    units = _lone_units(p, [s.shape(t) for t in op.inputs])
    if not any(units):
        return merged_dims_split(s, op, partner) or units_inserted(s, op, partner)
    if _roles(p, *ranks) in partner:
        return False
    side = 0 if units[0] else 1
    key, okey = ("lhs", "rhs")[side], ("lhs", "rhs")[1 - side]
    if any(_roles(p, *[n - m * (i == side) for i, n in enumerate(ranks)]) in partner
           for m in range(1, len(units[side]) + 1)):
        return False                         # (deleted after the normal form: lone_units_deleted)
    for k, deleted in sorted(itertools.product(range(1, len(units[side]) + 1),
                                               range(len(units[side]))), key=lambda c: c[::-1]):
        if k + deleted > len(units[side]):
            continue
        grown = list(ranks)
        grown[1 - side] += k
        q = dict(p)
        q[f"{key}_batch"] = tuple(p[f"{key}_batch"]) + tuple(units[side][:k])
        # the other operand's k new size-1 dims go right after its batch dims
        at = max(p[f"{okey}_batch"], default=-1) + 1
        q[f"{okey}_batch"] = tuple(d + k * (d >= at) for d in p[f"{okey}_batch"]) + \
            tuple(range(at, at + k))
        q[f"{okey}_contract"] = tuple(d + k * (d >= at) for d in p[f"{okey}_contract"])
        if _roles(q, *[n - deleted * (i == side) for i, n in enumerate(grown)]) not in partner:
            continue
        other = op.inputs[1 - side]
        oshape = s.shape(other)
        ins = list(op.inputs)
        ins[1 - side] = s.new_op("reshape", [other], oshape[:at] + (1,) * k + oshape[at:],
                                 s.g.tensors[other].dtype, {}, op)
        if deleted:                          # (the next lone dims, which the program has not)
            t = op.inputs[side]
            gone = units[side][k:k + deleted]
            keep = [d for d in range(ranks[side]) if d not in gone]
            ins[side] = s.new_op("reshape", [t], tuple(s.shape(t)[d] for d in keep),
                                 s.g.tensors[t].dtype, {}, op)
            at_kept = {d: i for i, d in enumerate(keep)}
            for role in ("batch", "contract"):
                q[f"{key}_{role}"] = tuple(at_kept[d] for d in q[f"{key}_{role}"])
        return s._dot_then_unit_reshape(op, ins, q)
    return False


def keeps_unit_pairs_free(s: "_Simplifier", op: Op, q: dict) -> bool:
    """Whether the dot `op` keeps its size-1 free pairs free rather than batching them
    (simplify_forms.unit_dims_batched, giving params q): when its dim counts are a
    sequential dot's and the batched dot's are none's. A rank's size-1 block of a dim
    the sequential dot keeps free in both operands (query slots split one per rank
    beside a size-1 block of the KV slots) is free there too; the KV groups of one head
    per rank, which the program batches, are not (the dot's own counts are then no
    sequential dot's, or the batched ones are one's)."""
    partner = getattr(s, "partner_dots", None)
    if not partner:
        return False
    shapes = [s.shape(t) for t in op.inputs]
    return _fits(op.params, *shapes, partner) and not _fits(q, *shapes, partner)


def fits_better(s: "_Simplifier", new: tuple[list[int], dict], op: Op) -> bool:
    """Whether the dot of `new` (operands, params) could compute a block of a sequential
    dot (_fits) and the dot `op` as it is could not."""
    partner = getattr(s, "partner_dots", None)
    ins, q = new
    return bool(partner) and _fits(q, *[s.shape(t) for t in ins], partner) \
        and not _fits(op.params, *[s.shape(t) for t in op.inputs], partner)


def keeps_lone_units_out(s: "_Simplifier", op: Op, ins: list[int], q: dict) -> bool:
    """Whether the dot `op` keeps out of it the size-1 dims its operands' reshapes delete
    (simplify_forms.unit_dims_into_dot would make them free dims of the dot of `ins`,
    the reshapes' operands, with params q): when they would be lone there (size-1 free
    dims in one operand, none in the other to pair with) and the dot could compute a
    block of a sequential dot, which the new one could not. lone_units_batched deletes
    such dims to the sequential dots' counts; taken back into the dot, the two rules
    would undo each other."""
    partner = getattr(s, "partner_dots", None)
    if not partner or not any(_lone_units(q, [s.shape(t) for t in ins])):
        return False
    return fits_better(s, (list(op.inputs), op.params), _Dot(ins, q))


class _Dot(NamedTuple):
    """A dot not (yet) in the graph: its operands and params, as fits_better reads an op."""

    inputs: list[int]
    params: dict


def _with_role(p: dict, pair: tuple[int, int], role: str) -> dict:
    """p with the dim pair (lhs dim, rhs dim) moved to `role` ("batch" or "contract"):
    among that role's dims by its lhs position when those are in lhs order (as a
    program's einsum lists them), else last."""
    q = dict(p)
    for old in ("batch", "contract"):
        keep = [i for i, d in enumerate(p[f"lhs_{old}"]) if d != pair[0]]
        for key in ("lhs", "rhs"):
            q[f"{key}_{old}"] = tuple(p[f"{key}_{old}"][i] for i in keep)
    lr, rr = list(q[f"lhs_{role}"]), list(q[f"rhs_{role}"])
    at = sum(1 for d in lr if d < pair[0]) if lr == sorted(lr) else len(lr)
    lr.insert(at, pair[0])
    rr.insert(at, pair[1])
    q[f"lhs_{role}"], q[f"rhs_{role}"] = tuple(lr), tuple(rr)
    return q


MAX_UNIT_PAIRS = 4   # (two roles each: the 2**n choices are enumerated)


HEAD_DEPTH = 12   # ops followed back from a dot operand to the head-batched dot it derives from


def _from_unit_batch(s: "_Simplifier", t: int) -> bool:
    """Whether t is, through reshapes, transposes and elementwise ops of values of its shape
    (the softmax of the rank's scores), a dot batching over a size-1 dim."""
    todo, seen = [t], set()
    while todo and len(seen) <= HEAD_DEPTH:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        op = s.producer.get(t)
        if op is not None and op.kind == "dot_general":
            if 1 in s.shape(op.output)[:len(op.params["lhs_batch"])]:
                return True
        elif op is not None and op.kind in ("reshape", "transpose"):
            todo.append(op.inputs[0])
        elif op is not None and op.inputs and KINDS[op.kind].family is Family.ELEMENTWISE:
            todo.extend(x for x in op.inputs if s.shape(x) == s.shape(t))
    return False


def unit_pairs_as_sequential(s: "_Simplifier", op: Op) -> bool:
    """A dot's size-1 free pairs (one free dim of each operand, both size 1, paired in
    order) each batched or contracted as the sequential program's dots are: the first
    choice (fewest contracted; a free pair is never left free here, see
    simplify_forms.unit_dims_batched) with which the dot could compute a block of a
    sequential dot (_fits: its dims by role, sizes dividing), when as it is it could
    not. Pairs the dot batches already stay batched (micro-batches, once batched, are
    summed by simplify_accumulate.py). A size-1 pair summed is
    its one product, batched it is the same product at the one index of a size-1 result
    dim, and as free dims it is that product at a size-1 dim of each: the result differs
    by size-1 dims only (reshaped back, simplify_forms._dot_then_unit_reshape). With one
    head per rank XLA deletes the head dim before the attention output projection
    ([b*s, e] x [e, D]); taken back into the dot (unit_dims_into_dot) it would be batched
    by default, where the program contracts (h, e); the KV groups a program batches over
    stay batched. `s.partner_dots`: the sequential program's dot_roles (None: off)."""
    partner = getattr(s, "partner_dots", None)
    if not partner or op.kind != "dot_general" or len(op.inputs) != 2:
        return False
    p = op.params
    shapes = [s.shape(t) for t in op.inputs]
    if _fits(p, *shapes, partner):
        return False
    pairs: list[tuple[tuple[int, int], tuple[str, ...]]] = []   # (pair, roles it may take)
    free = [[d for d, n in enumerate(shape) if n == 1 and d not in p[f"{key}_batch"]
             and d not in p[f"{key}_contract"]] for shape, key in zip(shapes, ("lhs", "rhs"))]
    # contracted only beside a head: an operand derived from a dot batched over a size-1
    # dim (the attention output, batched over the rank's one head, or the probabilities
    # of its scores); a micro-batch's size-1 dim,
    # a free dim of the dots it went through, stays batched (simplify_accumulate.py sums
    # the micro-batches' dots)
    head = any(_from_unit_batch(s, t) for t in op.inputs)
    pairs += [(pair, ("batch", "contract") if head else ("batch",)) for pair in zip(*free)]
    if not pairs or len(pairs) > MAX_UNIT_PAIRS:
        return False
    choices = sorted(itertools.product(*(roles for _, roles in pairs)),
                     key=lambda c: sum(r != roles[0] for r, (_, roles) in zip(c, pairs)))
    for choice in choices:
        q = p
        for (pair, _), role in zip(pairs, choice):
            q = _with_role(q, pair, role)
        if q != p and _fits(q, *shapes, partner):
            return s._dot_then_unit_reshape(op, list(op.inputs), q)
    return False


def _inverse_permuted(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """C with transpose(C, perm) of shape `shape`: C[perm[j]] = shape[j]."""
    out = [0] * len(perm)
    for j, d in enumerate(perm):
        out[d] = shape[j]
    return tuple(out)


class _Target(NamedTuple):
    """A sequential layout pair: `first` ("reshape" or "transpose") then the other op;
    the transpose's permutation, the shape between the two, and the ranks of the
    pair's operand and result."""

    first: str
    perm: tuple[int, ...]
    mid: tuple[int, ...]
    start_rank: int
    end_rank: int


def _pair_form(ys: tuple[int, ...], out: tuple[int, ...], t: _Target) -> tuple[int, ...] | None:
    """The shape between the two ops when a tensor of shape ys goes to `out` in t's
    form, its blocks fitting t's (each dim dividing t's), else None."""
    if t.start_rank != len(ys) or t.end_rank != len(out) or len(t.perm) != len(
            out if t.first == "reshape" else ys):
        return None
    c = _inverse_permuted(out, t.perm) if t.first == "reshape" else \
        tuple(ys[d] for d in t.perm)
    if math.prod(c) != math.prod(ys) or any(m % n for n, m in zip(c, t.mid)):
        return None
    return c


def _targets(seq: Graph) -> list[_Target]:
    """The sequential layout pairs, in program order, each once."""
    producer = seq.producer()
    targets: list[_Target] = []
    for op in seq.ops:
        under = producer.get(op.inputs[0]) if op.inputs else None
        if under is None or {op.kind, under.kind} != {"reshape", "transpose"}:
            continue
        perm = op if op.kind == "transpose" else under
        target = _Target(under.kind, tuple(perm.params["permutation"]),
                         seq.tensors[under.output].shape,
                         len(seq.tensors[under.inputs[0]].shape), len(seq.tensors[op.output].shape))
        if target not in targets:
            targets.append(target)
    return targets


class _UnitLayouts(_FormRules):
    """unit_layouts_as_sequential's pass over the distributed graph."""

    def __init__(self, graph: Graph, ids: IdAllocator, seq: Graph) -> None:
        super().__init__(graph, ids)
        self.partner_dots = dot_roles(seq)
        self.targets = _targets(seq)
        self.transposed = transposed_operands(seq)   # (deleted_units_transposed's)
        self.merges = transposed_reshapes(seq)        # (free_units_placed's)

    def bases(self, op: Op):
        """(y, the ops from y's reader to op) for each tensor y that op's chain of
        reshapes, transposes and unit-stride slices (at most CHAIN_DEPTH of them) starts
        from, nearest first."""
        ops = [op]
        while len(ops) <= CHAIN_DEPTH:
            yield ops[-1].inputs[0], ops[::-1]
            under = self.producer.get(ops[-1].inputs[0])
            if under is None or under.kind not in _CHAIN_KINDS or under.kind == "slice" and any(
                    n != 1 for n in under.params.get("strides") or ()):
                return
            ops.append(under)

    def _moved(self, y: int, ops: list[Op]) -> np.ndarray:
        """The index array of y moved by `ops` (reshapes, transposes and unit-stride
        slices, in order)."""
        ys = self.shape(y)
        moved = np.arange(int(np.prod(ys, dtype=np.int64))).reshape(ys)
        for o in ops:
            if o.kind == "slice":
                moved = moved[tuple(slice(a, b) for a, b in zip(o.params["start_indices"],
                                                                 o.params["limit_indices"]))]
            else:
                moved = np.transpose(moved, o.params["permutation"]) if o.kind == "transpose" \
                    else moved.reshape(self.shape(o.output))
        return moved

    def _box(self, y: int, moved: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The (start, limit) of the box of y whose elements `moved` holds, when they are
        exactly one box (else None)."""
        at = np.unravel_index(moved.ravel(), self.shape(y))
        lo = tuple(int(a.min()) for a in at)
        hi = tuple(int(a.max()) + 1 for a in at)
        return (lo, hi) if math.prod(b - a for a, b in zip(lo, hi)) == moved.size else None

    def _units_only(self, t: int) -> bool:
        """Whether t is a reshape that only inserts or deletes size-1 dims."""
        r = self.producer.get(t)
        return r is not None and r.kind == "reshape" and \
            [n for n in self.shape(t) if n > 1] == [n for n in self.shape(r.inputs[0]) if n > 1]

    def rewrite(self, op: Op) -> bool:
        out = self.shape(op.output)
        chains = list(self.bases(op))
        if len(chains) > 1:
            near = chains[1][1]                    # (op and the op under it)
            # (a pair over a reshape that only moves size-1 dims is written from that
            # reshape's operand, when a sequential pair takes it: the rank's query
            # gradient [b, 1, s, 1, d] read as [b, 1, s, d] by the key's pair)
            if [o.kind for o in near] in (["reshape", "transpose"], ["transpose", "reshape"]) \
                    and not self._units_only(chains[1][0]) \
                    and any(_pair_form(self.shape(chains[1][0]), out, t)
                            == self.shape(near[0].output)
                            and tuple(near[near[0].kind == "reshape"].params["permutation"])
                            == t.perm and t.first == near[0].kind for t in self.targets):
                return False                       # (already so written)
        for y, ops in reversed(chains):            # (the longest chain first)
            box = None                             # (the part of y a slice in the chain keeps)
            if any(o.kind == "slice" for o in ops):
                box = self._box(y, self._moved(y, ops))
                if box is None:
                    continue
            ys = self.shape(y) if box is None else tuple(b - a for a, b in zip(*box))
            if 1 not in ys and 1 not in out:
                continue
            moved = None
            for t in self.targets:
                c = _pair_form(ys, out, t)
                if c is None:
                    continue
                index = np.arange(math.prod(self.shape(y))).reshape(self.shape(y))
                if box is not None:
                    index = index[tuple(slice(a, b) for a, b in zip(*box))]
                form = np.transpose(index.reshape(c), t.perm) if t.first == "reshape" \
                    else np.transpose(index, t.perm).reshape(out)
                moved = self._moved(y, ops) if moved is None else moved
                if not np.array_equal(form, moved):
                    continue
                dtype = self.g.tensors[op.output].dtype
                if box is not None:                # (a slice first, then the program's pair)
                    y = self.new_op("slice", [y], ys, dtype,
                                    {"start_indices": box[0], "limit_indices": box[1],
                                     "strides": None}, ops[0])
                if t.first == "reshape":
                    x = self.new_op("reshape", [y], c, dtype, {}, ops[0])
                    self.new_op("transpose", [x], out, dtype, {"permutation": t.perm}, op,
                                output=op.output)
                else:
                    x = self.new_op("transpose", [y], c, dtype, {"permutation": t.perm}, ops[0])
                    self.new_op("reshape", [x], out, dtype, {}, op, output=op.output)
                return True
        return False

    def lone_units_deleted(self, op: Op) -> bool:
        """A dot with size-1 free dims in one operand and none in the other reads that
        operand with the first k of them deleted (the result reshaped back) when the
        sequential program has a dot with the dim counts that gives and none with the
        dot's own: the normal form takes a size-1 dim merged into a contracted dim out
        of it (simplify_merged.unit_dims_out_of_contraction), where the program merges
        the head dim into the output projection's contraction ([b, s, g*j*d], a rank
        holding g = 1). After the normal form, so that no rule takes it out again."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        p = op.params
        ranks = [len(self.shape(t)) for t in op.inputs]
        units = _lone_units(p, [self.shape(t) for t in op.inputs])
        if not any(units) or _roles(p, *ranks) in self.partner_dots:
            return False
        side = 0 if units[0] else 1
        for k in range(1, len(units[side]) + 1):
            shrunk = list(ranks)
            shrunk[side] -= k
            if _roles(p, *shrunk) not in self.partner_dots:
                continue
            keep = [d for d in range(ranks[side]) if d not in units[side][:k]]
            t = op.inputs[side]
            x = self.new_op("reshape", [t], tuple(self.shape(t)[d] for d in keep),
                            self.g.tensors[t].dtype, {}, op)
            return self._dot_reading(op, side, ("lhs", "rhs")[side], x,
                                     {d: i for i, d in enumerate(keep)})
        return False

    def run(self) -> bool:
        changed = False
        readers = self.g.consumers()
        for op in self.g.ops:
            taken = readers.get(op.output, [])
            if op.kind in ("reshape", "transpose") and taken \
                    and all(r.kind in ("reshape", "transpose") for r in taken):
                pass                               # (its readers take it: the whole chain)
            elif op.kind in ("reshape", "transpose") and op.inputs and self.rewrite(op) \
                    or self.lone_units_deleted(op) \
                    or deleted_units_transposed(self, op, self.transposed) \
                    or free_units_placed(self, op, self.merges) \
                    or units_placed_as_operand(self, op, self.partner_dots):
                changed = True
                continue
            self.out.append(op)
            self.producer[op.output] = op
        if changed:
            self.g.ops = self.out
        return changed


_POST_PASSES = 4   # (a dot's operand deleted in one pass is a chain the next one writes)


def unit_layouts_as_sequential(seq: Graph, dist: Graph, ids: IdAllocator) -> bool:
    """Rewrite `dist` in place (see the module docstring); whether anything changed.
    The pairs of a unit move and a transpose are first written in one form each, on both
    graphs (unit_placement.canonical_units; on `dist`, not those already in the form of a
    sequential pair)."""
    canonical_units(seq, ids)
    units_placed_as_operands(seq, ids)
    targets = _targets(seq)
    def written(ys: tuple[int, ...], mid: tuple[int, ...], perm: tuple[int, ...],
                out: tuple[int, ...], first: str) -> bool:
        """Whether a pair is so written as a sequential pair whose op `first` comes first
        (kept: the chains would move it back)."""
        return any(t.first == first and t.perm == perm and _pair_form(ys, out, t) == mid
                   for t in targets)
    changed = canonical_units(dist, ids, written)
    for _ in range(_POST_PASSES):
        if not _UnitLayouts(dist, ids, seq).run():
            break
        changed = True
    return changed


__all__ = ["dot_roles", "fits_better", "keeps_lone_units_out", "keeps_unit_pairs_free",
           "lone_units_batched", "unit_layouts_as_sequential", "unit_pairs_as_sequential"]
