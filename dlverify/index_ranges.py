"""Integer index ranges and interval predicates, per rank, for folding masks.

Index arithmetic decides where a gather may read: `ids % V` lies in [0, V),
`ids - axis_index * V/N` is a per-rank shift of it, `(local < 0) | (local >= n)`
is the set of rows another rank owns, `where(outside, 0, local)` lies in
[0, n). This module derives, from the program alone and exactly:

* `values(t)`: per rank, a set of integers (a union of half-open intervals)
  that contains every element of integer tensor t, for all inputs;
* `affine(t)`: t = broadcast(b) + c_r elementwise, with b a base tensor and c_r
  an integer known on each rank (without wrap-around: checked on b's values);
* `predicate(t)`: bool t = (broadcast(b) in S_r) elementwise, for a base b and
  a set S_r per rank (comparisons with known integers, and/or/not/xor of
  predicates over the same base, broadcasts, reductions along dims the base
  does not vary on).

`known_bool(t)` is the value of a predicate that holds (or fails) for every
value its base can take on each rank: e.g. the in-bounds mask of
`jnp.take(x, where(outside, 0, local))` is all true, so the fill value of the
gather is never selected. `dlverify.passes.fold` records these as splats.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from dlverify.ir import Graph, Op
from dlverify.ops.dtypes import exact_dtype

Intervals = tuple[tuple[int, int], ...]   # disjoint, sorted, half-open [lo, hi)
BIG = 1 << 70                             # beyond every integer type: an open end
MAX_DEPTH = 64                            # producer chains followed per query (Python stack)
MAX_TERMS = 8                             # known integers added to one base (no quadratic chains)


def _norm(ivs: list[tuple[int, int]]) -> Intervals:
    out: list[list[int]] = []
    for lo, hi in sorted(i for i in ivs if i[0] < i[1]):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    return _norm([(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b])


def complement(a: Intervals) -> Intervals:
    out, lo = [], -BIG
    for x0, x1 in a:
        out.append((lo, x0))
        lo = x1
    out.append((lo, BIG))
    return _norm(out)


def union(a: Intervals, b: Intervals) -> Intervals:
    return _norm(list(a) + list(b))


def shift(a: Intervals, c: int) -> Intervals:
    return tuple((x0 + c if x0 > -BIG else x0, x1 + c if x1 < BIG else x1) for x0, x1 in a)


def subset(a: Intervals, b: Intervals) -> bool:
    return intersect(a, complement(b)) == ()


def unit_reshape_dims(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict[int, int] | None:
    """For a reshape that only inserts, deletes or moves size-1 dims (the other dims
    in order): where each operand dim lands in the result, as far as it does. A sized
    dim lands on its sized dim; a size-1 dim on the first free size-1 result dim after
    the image of the operand dim before it and before that of the next sized dim
    (none there: it is deleted, and absent from the map). Row-major order puts the one
    element of a size-1 dim anywhere: the choice keeps dims in order, and is the same
    for every tensor of the two shapes. None when the reshape moves sized dims."""
    src = [d for d, n in enumerate(in_shape) if n != 1]
    dst = [d for d, n in enumerate(out_shape) if n != 1]
    if [in_shape[d] for d in src] != [out_shape[d] for d in dst]:
        return None
    where = dict(zip(src, dst))
    low = -1
    for d in range(len(in_shape)):
        if d in where:
            low = where[d]
            continue
        high = next((where[e] for e in range(d + 1, len(in_shape)) if e in where), len(out_shape))
        spot = next((e for e in range(low + 1, high) if out_shape[e] == 1), None)
        if spot is not None:
            where[d] = low = spot
    return where


@dataclass(frozen=True)
class Affine:
    """t = broadcast(base, t.shape, dims) + offset[r] on rank r. `terms` are rank-0
    integer tensors of the graph whose signed sum is the offset on every rank."""

    base: int
    dims: tuple[int, ...]
    offset: tuple[int, ...]
    terms: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Predicate:
    """Bool t = (broadcast(base, t.shape, dims) in sets[r]) on rank r."""

    base: int
    dims: tuple[int, ...]
    sets: tuple[Intervals, ...]


@dataclass(frozen=True)
class MaskPrefix:
    """On one rank, a bool tensor is `value` at the indices below `length` along
    `dim` and the opposite at the others, alike along every other dim."""

    dim: int
    length: int
    value: bool


_CMP: dict[str, Callable[[int], Intervals]] = {   # x <op> k as a set of x
    "lt": lambda k: ((-BIG, k),), "le": lambda k: ((-BIG, k + 1),),
    "gt": lambda k: ((k + 1, BIG),), "ge": lambda k: ((k, BIG),),
    "eq": lambda k: ((k, k + 1),), "ne": lambda k: ((-BIG, k), (k + 1, BIG)),
}
_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_COMBINE: dict[str, Callable[[Intervals, Intervals], Intervals]] = {
    "and": intersect, "or": union,
    "ne": lambda a, b: union(intersect(a, complement(b)), intersect(b, complement(a))),
    "eq": lambda a, b: complement(union(intersect(a, complement(b)), intersect(b, complement(a)))),
}


def _dtype_range(dtype: str) -> Intervals | None:
    d = exact_dtype(dtype)
    if d is None or d == np.bool_:
        return None
    info = np.iinfo(d)
    return ((int(info.min), int(info.max) + 1),)


class IndexFacts:
    """Lazy, memoised analysis of one graph. `splat` (tensor -> one value per rank)
    is read as it stands when a tensor is first queried: query in op order."""

    def __init__(self, graph: Graph, ranks: int, splat: dict[int, list]) -> None:
        self.g, self.ranks, self.splat = graph, ranks, splat
        self.producer: dict[int, Op] = {op.output: op for op in graph.ops}
        self._values: dict[int, tuple[Intervals, ...] | None] = {}
        self._affine: dict[int, Affine | None] = {}
        self._pred: dict[int, Predicate | None] = {}
        self._depth = 0

    # ------------------------------------------------------------------ helpers
    def _int_splat(self, t: int) -> list[int] | None:
        vals = self.splat.get(t)
        if vals is None or exact_dtype(self.g.tensors[t].dtype) in (None, np.bool_):
            return None
        return [int(v) for v in vals]

    def bool_splat(self, t: int) -> list[bool] | None:
        vals = self.splat.get(t)
        if vals is None or self.g.tensors[t].dtype != "bool":
            return None
        return [bool(v) for v in vals]

    def _scalar_source(self, t: int) -> int | None:
        """A rank-0 tensor that t broadcasts (t itself when rank 0)."""
        while self.g.tensors[t].rank:
            op = self.producer.get(t)
            if op is None or op.kind not in ("broadcast_in_dim", "reshape") or \
                    int(np.prod(self.g.tensors[op.inputs[0]].shape)) != 1:
                return None
            t = op.inputs[0]
        return t

    def _memo(self, table: dict, t: int, fn: Callable[[int], object]):
        if t in table:
            return table[t]
        if self._depth >= MAX_DEPTH:
            return None
        self._depth += 1
        try:
            table[t] = fn(t)
        finally:
            self._depth -= 1
        return table[t]

    @staticmethod
    def moved_dims(op: Op, dims: tuple[int, ...], in_shape: tuple[int, ...],
                    out_shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """Where dims of a broadcast_in_dim / reshape operand land in its output
        (reshapes only when they insert, drop or move size-1 dims: unit_reshape_dims)."""
        if op.kind == "broadcast_in_dim":
            bd = op.params["broadcast_dimensions"]
            if any(in_shape[d] != out_shape[bd[d]] for d in dims):
                return None
            return tuple(bd[d] for d in dims)
        if op.kind == "reshape":
            where = unit_reshape_dims(in_shape, out_shape)
            if where is None or any(d not in where for d in dims):
                return None
            return tuple(where[d] for d in dims)
        return None

    def _moved(self, op: Op, inner):
        """An Affine or Predicate of a broadcast_in_dim / reshape operand, for its output."""
        if inner is None:
            return None
        dims = self.moved_dims(op, inner.dims, self.g.tensors[op.inputs[0]].shape,
                                self.g.tensors[op.output].shape)
        return None if dims is None else replace(inner, dims=dims)

    # ------------------------------------------------------------------ values
    def values(self, t: int) -> tuple[Intervals, ...] | None:
        """Per rank, a set holding every element of integer tensor t."""
        return self._memo(self._values, t, self._values_of)

    def _values_of(self, t: int) -> tuple[Intervals, ...] | None:
        full = _dtype_range(self.g.tensors[t].dtype)
        if full is None:
            return None
        known = self._int_splat(t)
        if known is not None:
            return tuple(((v, v + 1),) for v in known)
        op = self.producer.get(t)
        got = self._derive_values(op) if op is not None else None
        if got is None:
            return tuple(full for _ in range(self.ranks))
        return tuple(intersect(v, full) for v in got)

    def _derive_values(self, op: Op) -> tuple[Intervals, ...] | None:
        out = self.g.tensors[op.output]
        if op.kind == "iota":
            n = out.shape[op.params["dimension"]]
            return tuple(((0, n),) for _ in range(self.ranks))
        if op.kind in ("broadcast_in_dim", "reshape", "transpose", "slice", "rev") or \
                (op.kind == "convert_to_int" and self._fits(op.inputs[0], out.dtype)):
            return self.values(op.inputs[0])
        if op.kind == "clamp":
            lo, hi = self._int_splat(op.inputs[0]), self._int_splat(op.inputs[2])
            x = self.values(op.inputs[1])
            if lo is None or hi is None or x is None:
                return None
            return tuple(intersect(x[r], ((lo[r], hi[r] + 1),)) for r in range(self.ranks))
        if op.kind == "rem":
            c = self._int_splat(op.inputs[1])
            x = self.values(op.inputs[0])
            if c is None or x is None or any(v <= 0 for v in c):
                return None
            return tuple(((0 if subset(x[r], ((0, BIG),)) else 1 - c[r], c[r]),)
                         for r in range(self.ranks))
        if op.kind == "select_n" and len(op.inputs) == 3:
            return self._select_values(op)
        if op.kind in ("max", "min"):   # jnp.clip: max(min(x, hi), lo), on the operands' hulls
            a, b = (self.values(i) for i in op.inputs)
            if a is None or b is None or any(not v for v in a + b):
                return None
            pick = max if op.kind == "max" else min
            return tuple(((pick(x[0][0], y[0][0]), pick(x[-1][1] - 1, y[-1][1] - 1) + 1),)
                         for x, y in zip(a, b))
        if op.kind in ("add", "sub"):   # x +- a known integer, when it cannot wrap around
            for i in ((0, 1) if op.kind == "add" else (0,)):
                k, x = self._int_splat(op.inputs[1 - i]), self.values(op.inputs[i])
                full = _dtype_range(out.dtype)
                if k is None or x is None or full is None:
                    continue
                moved = tuple(shift(x[r], k[r] if op.kind == "add" else -k[r]) for r in range(self.ranks))
                if all(subset(m, full) for m in moved):
                    return moved
        aff = self.affine(op.output)
        if aff is not None and aff.base != op.output:
            base = self.values(aff.base)
            if base is not None:
                return tuple(shift(base[r], aff.offset[r]) for r in range(self.ranks))
        return None

    def _fits(self, t: int, dtype: str) -> bool:
        v, full = self.values(t), _dtype_range(dtype)
        return v is not None and full is not None and all(subset(x, full) for x in v)

    def _select_values(self, op: Op) -> tuple[Intervals, ...] | None:
        """select_n(p, a, b): a's values where p is false, b's where p is true; when
        p is a predicate over the base of a case, only that base's values where
        the case is taken count."""
        p, cases = op.inputs[0], op.inputs[1:]
        picked = self.bool_splat(p)
        pred = self.predicate(p)
        out = []
        for r in range(self.ranks):
            acc: Intervals = ()
            for taken, case in zip((False, True), cases):
                if picked is not None and picked[r] != taken:
                    continue
                vals = self._case_values(case, pred, taken, r)
                if vals is None:
                    return None
                acc = union(acc, vals)
            out.append(acc)
        return tuple(out)

    def _case_values(self, case: int, pred: Predicate | None, taken: bool, r: int) -> Intervals | None:
        aff = self.affine(case)
        if pred is not None and aff is not None and aff.base == pred.base and aff.dims == pred.dims:
            base = self.values(aff.base)
            if base is not None:
                where = pred.sets[r] if taken else complement(pred.sets[r])
                return shift(intersect(base[r], where), aff.offset[r])
        vals = self.values(case)
        return None if vals is None else vals[r]

    # ------------------------------------------------------------------ affine
    def affine(self, t: int) -> Affine | None:
        """t as a broadcast base plus a per-rank integer (t itself when nothing better)."""
        if _dtype_range(self.g.tensors[t].dtype) is None:
            return None
        return self._memo(self._affine, t, self._affine_of)

    def _affine_of(self, t: int) -> Affine:
        me = Affine(t, tuple(range(self.g.tensors[t].rank)), (0,) * self.ranks)
        op = self.producer.get(t)
        if op is None:
            return me
        if op.kind in ("add", "sub"):
            for i in ((0, 1) if op.kind == "add" else (0,)):
                k, x = op.inputs[1 - i], op.inputs[i]
                got = self._shifted(x, k, 1 if op.kind == "add" else -1, t)
                if got is not None:
                    return got
            return me
        if op.kind in ("broadcast_in_dim", "reshape"):
            return self._moved(op, self.affine(op.inputs[0])) or me
        if op.kind == "select_n" and len(op.inputs) == 3:
            picked = self.bool_splat(op.inputs[0])
            if picked is not None and len(set(picked)) == 1:
                inner = self.affine(op.inputs[2 if picked[0] else 1])
                return inner if inner is not None else me
        return me

    def _shifted(self, x: int, k: int, sign: int, t: int) -> Affine | None:
        ks, src = self._int_splat(k), self._scalar_source(k)
        inner = self.affine(x)
        if ks is None or src is None or inner is None or len(inner.terms) >= MAX_TERMS:
            return None
        off = tuple(o + sign * c for o, c in zip(inner.offset, ks))
        base = self.values(inner.base)
        full = _dtype_range(self.g.tensors[t].dtype)
        if base is None or full is None or \
                not all(subset(shift(base[r], off[r]), full) for r in range(self.ranks)):
            return None   # the sum may wrap around: not an affine function of the base
        return Affine(inner.base, inner.dims, off, inner.terms + ((src, sign),))

    # ------------------------------------------------------------------ predicates
    def predicate(self, t: int) -> Predicate | None:
        if self.g.tensors[t].dtype != "bool":
            return None
        return self._memo(self._pred, t, self._pred_of)

    def _pred_of(self, t: int) -> Predicate | None:
        op = self.producer.get(t)
        if op is None:
            return None
        if op.kind in _CMP and len(op.inputs) == 2:
            for i, kind in ((0, op.kind), (1, _MIRROR[op.kind])):
                x, k = op.inputs[i], op.inputs[1 - i]
                ks, aff = self._int_splat(k), self.affine(x)
                if ks is not None and aff is not None and self._int_splat(x) is None:
                    return Predicate(aff.base, aff.dims,
                                     tuple(_CMP[kind](ks[r] - aff.offset[r]) for r in range(self.ranks)))
        if op.kind in _COMBINE and len(op.inputs) == 2:
            return self._combine(op)
        if op.kind == "not":
            inner = self.predicate(op.inputs[0])
            return None if inner is None else \
                Predicate(inner.base, inner.dims, tuple(complement(s) for s in inner.sets))
        if op.kind in ("broadcast_in_dim", "reshape"):
            return self._moved(op, self.predicate(op.inputs[0]))
        if op.kind in ("reduce_and", "reduce_or"):
            inner = self.predicate(op.inputs[0])
            axes = set(op.params["axes"])
            in_shape = self.g.tensors[op.inputs[0]].shape
            if inner is None or axes & set(inner.dims) or any(in_shape[a] == 0 for a in axes):
                return None   # the base varies along a reduced dim (or nothing is reduced)
            return Predicate(inner.base, tuple(d - sum(a < d for a in axes) for d in inner.dims),
                             inner.sets)
        return None

    def _combine(self, op: Op) -> Predicate | None:
        a, b = (self.predicate(i) for i in op.inputs)
        ka, kb = (self.bool_splat(i) for i in op.inputs)
        fn = _COMBINE[op.kind]
        every: Intervals = ((-BIG, BIG),)
        if a is not None and b is None and kb is not None:
            return Predicate(a.base, a.dims, tuple(fn(s, every if kb[r] else ())
                                                   for r, s in enumerate(a.sets)))
        if b is not None and a is None and ka is not None:
            return Predicate(b.base, b.dims, tuple(fn(every if ka[r] else (), s)
                                                   for r, s in enumerate(b.sets)))
        if a is None or b is None or (a.base, a.dims) != (b.base, b.dims):
            return None
        return Predicate(a.base, a.dims, tuple(fn(x, y) for x, y in zip(a.sets, b.sets)))

    # ------------------------------------------------------------------ folding
    def visit(self, t: int) -> list[bool] | None:
        """Analyse t once its producer's operands are analysed (fold's op order, so
        that no query recurses deeply): a bool's value when decided, else None."""
        dtype = self.g.tensors[t].dtype
        if dtype == "bool":
            return self.known_bool(t)
        if _dtype_range(dtype) is not None:
            self.values(t)
            self.affine(t)
        return None

    def known_bool(self, t: int) -> list[bool] | None:
        """The value bool t holds everywhere on each rank, when its predicate is decided
        by the values its base can take there (reductions of a known bool included)."""
        op = self.producer.get(t)
        if op is not None and op.kind in ("reduce_and", "reduce_or"):
            inner = self.bool_splat(op.inputs[0])
            in_shape = self.g.tensors[op.inputs[0]].shape
            if inner is not None and all(in_shape[a] > 0 for a in op.params["axes"]):
                return inner
        pred = self.predicate(t)
        if pred is None:
            return None
        base = self.values(pred.base)
        if base is None:
            return None
        out = []
        for r in range(self.ranks):
            if subset(base[r], pred.sets[r]):
                out.append(True)
            elif intersect(base[r], pred.sets[r]) == ():
                out.append(False)
            else:
                return None
        return out

    def prefix(self, t: int) -> list[MaskPrefix | None] | None:
        """Per rank, bool t as a prefix along one dim: a comparison of an iota
        (shifted by a known integer per rank) whose true set inside the dim is
        [0, n) or [n, size). The mask XLA puts on uneven shards' padding."""
        pred = self.predicate(t)
        if pred is None:
            return None
        base = self.producer.get(pred.base)
        if base is None or base.kind != "iota":
            return None
        j = pred.dims[base.params["dimension"]]
        size = self.g.tensors[t].shape[j]
        out: list[MaskPrefix | None] = []
        for r in range(self.ranks):
            inside = intersect(pred.sets[r], ((0, size),))
            if inside == ():
                out.append(MaskPrefix(j, 0, True))
            elif inside[0][0] == 0 and len(inside) == 1:
                out.append(MaskPrefix(j, inside[0][1], True))
            elif inside[-1][1] == size and len(inside) == 1:
                out.append(MaskPrefix(j, inside[0][0], False))
            else:
                out.append(None)
        return out if any(m is not None for m in out) else None
