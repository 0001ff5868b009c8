"""A gather's index as `base + c_r` on the rows a mask keeps (an exact argument).

A masked gather (dlverify/masked_gather.py) is a one-hot contraction when, on
every row the mask keeps, the gather reads at `base + c_r` (the base of the
mask's predicate, shifted by an integer known on each rank). Programs write that
index in many ways that agree on the kept rows only:

    where(outside, 0, labels - first)          a select the mask decides
    clip(labels - first, 0, n - 1)             max/min with known bounds
    clip(labels, first, first + n - 1) - first  bounds, then a known shift

This module walks from the index back to a tensor whose affine form
(dlverify/index_ranges.py) has the predicate's base, through size-1 reshapes and
broadcasts (positions move, values stay), selects decided on the kept rows,
`max`/`min`/`clamp` with bounds known per rank, and adds or subtracts of known
integers; then it proves, bottom up on the values the kept rows hold, that every
bound is the identity there (the kept values lie inside it) and every shift is
exact (no wrap-around). The proof uses the integer sets only, never the op
spelling: a bound that cuts a kept value (a clip to n - 2) refuses the walk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from dlverify.index_ranges import BIG, MAX_TERMS, Affine, IndexFacts, Intervals, _dtype_range, shift, subset
from dlverify.diagnosis_origin import own_loc
from dlverify.ir import Graph, Op
from dlverify.verdict import Failure

MAX_STEPS = 64   # producers followed from the index (a chain, no search)
KIND = "index-cut-on-kept-rows"


class _Surgery(Protocol):
    """What the walk needs of masked_gather._Graph."""

    g: Graph
    facts: IndexFacts
    producer: dict[int, Op]

    def _inverse_dims(self, op: Op, dims: tuple[int, ...]) -> tuple[int, ...] | None: ...

    def _case_on_kept(self, op: Op, base: int, dims: tuple[int, ...],
                      kept: tuple[Intervals, ...]) -> int | None: ...


@dataclass(frozen=True)
class _Bound:
    """The values pass through unchanged when they lie in [lo, hi] (None: no bound);
    `op`: the max, min or clamp that applies it."""

    lo: tuple[int, ...] | None
    hi: tuple[int, ...] | None
    op: Op


@dataclass(frozen=True)
class Refusal:
    """A bound that changes the index on rows the mask keeps: the walk reached the
    mask's base, so the gather reads another element there than base + c_r (a located
    diagnosis, never part of the verdict)."""

    op: Op
    rank: int
    message: str

    def failure(self, consumers: dict[int, list[Op]], producer: dict[int, Op],
                operand_views: Callable[[Op, int], list[str]]) -> Failure:
        """As a failure at the bound's own line, with what its operands held on the rank."""
        loc = own_loc(self.op, consumers, producer)
        return Failure(self.op.kind, loc.file, loc.line, self.message, "distributed", loc.frames,
                       (self.rank,), kind=KIND, operand_views={self.rank: operand_views(self.op, self.rank)})


@dataclass(frozen=True)
class _Shift:
    """The values plus sign * k_r; `term`: a rank-0 tensor holding k_r on every rank."""

    k: tuple[int, ...]
    sign: int
    term: int


def _bound(gs: _Surgery, op: Op) -> tuple[int, _Bound] | None:
    """max/min with a per-rank known operand, clamp with known bounds: (the other operand, bound)."""
    known = gs.facts._int_splat
    if op.kind == "clamp" and len(op.inputs) == 3:
        lo, hi = known(op.inputs[0]), known(op.inputs[2])
        if lo is not None and hi is not None:
            return op.inputs[1], _Bound(tuple(lo), tuple(hi), op)
        return None
    if op.kind not in ("max", "min") or len(op.inputs) != 2:
        return None
    for i in (0, 1):
        k = known(op.inputs[1 - i])
        if k is not None and known(op.inputs[i]) is None:
            k = tuple(k)
            return op.inputs[i], (_Bound(k, None, op) if op.kind == "max" else _Bound(None, k, op))
    return None


def _shift(gs: _Surgery, op: Op) -> tuple[int, _Shift] | None:
    """x + k, k + x, x - k with k a known integer per rank broadcast from a rank-0 tensor."""
    if op.kind not in ("add", "sub") or len(op.inputs) != 2:
        return None
    facts = gs.facts
    for i in ((0, 1) if op.kind == "add" else (0,)):
        k, src = facts._int_splat(op.inputs[1 - i]), facts._scalar_source(op.inputs[1 - i])
        if k is not None and src is not None and facts._int_splat(op.inputs[i]) is None:
            return op.inputs[i], _Shift(tuple(k), 1 if op.kind == "add" else -1, src)
    return None


def index_on_kept(gs: _Surgery, t: int, base: int, dims: tuple[int, ...],
                  kept: tuple[Intervals, ...], refused: list[Refusal] | None = None) -> tuple[int, Affine] | None:
    """(src, aff): t equals broadcast(base, dims) + aff.offset[r] at every position whose
    base value lies in kept[r] (t's dims: `dims`); src is where the walk reached base's
    affine form. aff's terms sum to its offset on every rank, and base + offset never
    wraps around for any value base takes (so the one-hot of it is zero off the kept rows).
    A bound that cuts a kept value is appended to `refused`."""
    facts = gs.facts
    steps: list[_Bound | _Shift] = []
    for _ in range(MAX_STEPS):
        aff = facts.affine(t)
        if aff is not None and aff.base == base and aff.dims == dims:
            return _prove(gs, t, aff, steps, kept, refused)
        op = gs.producer.get(t)
        if op is None or facts.affine(t) is None:
            return None
        if op.kind in ("broadcast_in_dim", "reshape"):
            moved = gs._inverse_dims(op, dims)
            if moved is None:
                return None
            t, dims = op.inputs[0], moved
            continue
        if op.kind == "select_n" and len(op.inputs) == 3:
            case = gs._case_on_kept(op, base, dims, kept)
            if case is None:
                return None
            t = op.inputs[case]
            continue
        got = _bound(gs, op) or _shift(gs, op)
        if got is None:
            return None
        t, step = got
        steps.append(step)
    return None


def _prove(gs: _Surgery, src: int, aff: Affine, steps: list, kept: tuple[Intervals, ...],
           refused: list[Refusal] | None) -> tuple[int, Affine] | None:
    """Apply the steps bottom up to the kept values at src: every bound must hold them,
    every shift must stay in the dtype of the tensor it computes (checked on the widest
    dtype range of the walk: the index's integer type, the same along it)."""
    full = _dtype_range(gs.g.tensors[src].dtype)
    base_vals = gs.facts.values(aff.base)
    if full is None or base_vals is None:
        return None
    ranks = gs.facts.ranks
    offset, terms = list(aff.offset), list(aff.terms)
    vals = [shift(k, c) for k, c in zip(kept, offset)]
    for step in reversed(steps):
        if isinstance(step, _Bound):
            for r in range(ranks):
                lo = -BIG if step.lo is None else step.lo[r]
                hi = BIG if step.hi is None else step.hi[r] + 1
                if not subset(vals[r], ((lo, hi),)):   # the bound changes a kept value
                    if refused is not None:
                        refused.append(Refusal(step.op, r, _cut_message(step.op, r, vals[r], lo, hi)))
                    return None
            continue
        if len(terms) >= MAX_TERMS:
            return None
        vals = [shift(v, step.sign * k) for v, k in zip(vals, step.k)]
        offset = [o + step.sign * k for o, k in zip(offset, step.k)]
        terms.append((step.term, step.sign))
        if not all(subset(v, full) for v in vals):
            return None   # the shift may wrap around on a kept row
    if not all(subset(shift(base_vals[r], offset[r]), full) for r in range(ranks)):
        return None   # base + offset may wrap around: its one-hot may hit a masked row
    return src, Affine(aff.base, aff.dims, tuple(offset), tuple(terms))


def _text(ivs: Intervals) -> str:
    return " u ".join(f"[{'-inf' if lo <= -BIG else lo}, {'inf' if hi >= BIG else hi})" for lo, hi in ivs)


def _cut_message(op: Op, rank: int, vals: Intervals, lo: int, hi: int) -> str:
    bound = f"[{'-inf' if lo <= -BIG else lo}, {'inf' if hi >= BIG else hi})"
    return (f"diagnosis: this {op.kind} changes the gather's index on rows the mask keeps: on rank "
            f"{rank} the kept rows' index takes the values {_text(vals)}, and {op.kind} maps the "
            f"ones outside {bound} elsewhere, so those rows read another element than their own "
            "(the bound must hold every index of the rank's shard)")
