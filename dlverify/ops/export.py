"""Fact exporters of the IR op kinds: how dlverify/facts.py turns one op into rows
of the schema's input relations. The op-kind table (dlverify/ops/table.py)
names one exporter per kind; each returns the op's signature key, the tuple
that says when a sequential and a distributed op compute the same function.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dlverify import schema as S
from dlverify.ops.dtypes import is_float_dtype, is_int_dtype
from dlverify.ops.structural import clamped_starts

if TYPE_CHECKING:
    from dlverify.ir import Graph, Op
    from dlverify.passes import Folded

REDUCER_CODE = S.REDUCER_CODE  # "sum" -> its code in the rules
_REDUCE_KIND = {f"reduce_{name}": code for name, code in S.REDUCER_CODE.items()}


class FactSink(Protocol):
    """What an exporter writes to (facts.Exporter)."""

    iota_along: dict[int, set[int]]

    def add(self, rel: S.Relation, *row: Any) -> None: ...


@dataclass
class Site:
    """One op being exported, with what its exporter may read."""

    graph: Graph
    op: Op
    fold: Folded
    dist: bool
    shapes: list[tuple[int, ...]]   # operand shapes, in operand order
    out_shape: tuple[int, ...]


ExportFn = Callable[[FactSink, Site], tuple]


def prime_exponents(x: Fraction) -> tuple[int, int, int, int] | None:
    """x as 2^a 3^b 5^c 7^d, or None when x is not positive or has other factors."""
    if x <= 0:
        return None
    exps = []
    num, den = x.numerator, x.denominator
    for p in S.SCALE_PRIMES:
        e = 0
        while num % p == 0:
            num //= p
            e += 1
        while den % p == 0:
            den //= p
            e -= 1
        exps.append(e)
    if num != 1 or den != 1:
        return None
    return tuple(exps)  # type: ignore[return-value]


@dataclass(frozen=True)
class LiteralReading:
    """A float literal read as the 2,3,5,7-smooth rational `value`; `rounded` when
    the literal is that rational's rounding to float32 or float64 (`x * (1/3)`,
    `x * 0.1`), which the report lists as an assumption."""

    value: Fraction
    exponents: tuple[int, int, int, int]
    rounded: bool


def read_literal(f: float, max_den: int = 1 << 16) -> LiteralReading | None:
    """`f` exactly, when it is smooth; otherwise the simplest smooth rational q
    (a convergent of f's continued fraction, denominator <= max_den) whose float32
    or float64 rounding is f. Over the reals, `x * fl(1/3)` is not `x / 3`: the
    reading is the assumption that the author meant 1/3, as casts between float
    widths are read as identities."""
    if not np.isfinite(f) or f <= 0:
        return None
    exact = Fraction(float(f))
    e = prime_exponents(exact)
    if e is not None:
        return LiteralReading(exact, e, False)
    h0, h1, k0, k1, x = 0, 1, 1, 0, exact
    while True:   # the convergents h1/k1 of f
        a = x.numerator // x.denominator
        h0, h1, k0, k1 = h1, a * h1 + h0, k1, a * k1 + k0
        if k1 > max_den:
            return None
        q = Fraction(h1, k1)
        if q == exact:
            return None
        if float(q) == f or float(np.float32(q.numerator / q.denominator)) == f:
            e = prime_exponents(q)
            return LiteralReading(q, e, True) if e is not None else None
        x = 1 / (x - a)


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Split a reshape into groups of operand dims and output dims with equal
    products, size-1 dims standing alone. None when sizes do not factor."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and not (j < len(dst) and dst[j] == 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and not (i < len(src) and src[i] == 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        i += 1
        j += 1
        while pi != pj:
            if pi < pj:
                if i >= len(src):
                    return None
                pi *= src[i]
                gi.append(i)
                i += 1
            else:
                if j >= len(dst):
                    return None
                pj *= dst[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    return groups


def reshape_signature(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple | None:
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    sig = []
    for gi, gj in groups:
        inner = 1
        if len(gi) == 1 and len(gj) > 1:
            inner = int(np.prod([dst[j] for j in gj[1:]]))
        elif len(gi) > 1 and len(gj) == 1:
            inner = int(np.prod([src[i] for i in gi[1:]]))
        elif len(gi) > 1 and len(gj) > 1:
            inner = -1  # not a plain split or merge: no rule
        sig.append((len(gi), len(gj), inner))
    return tuple(sig)


def reshape_map(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """Rows (out_dim, mode, in_dim, k) of Reshape_Map (see schema)."""
    rows = []
    for gi, gj in reshape_groups(src, dst) or []:
        if len(gi) == 1 and len(gj) == 1:
            rows.append((gj[0], 0, gi[0], 1))
        elif len(gi) == 1 and len(gj) > 1:
            inner = int(np.prod([dst[j] for j in gj[1:]]))
            rows.append((gj[0], 0, gi[0], inner))
            rows += [(j, 2, -1, 0) for j in gj[1:]]
        elif len(gi) > 1 and len(gj) == 1:
            inner = int(np.prod([src[i] for i in gi[1:]]))
            rows.append((gj[0], 1, gi[0], inner))
        elif not gi:
            rows += [(j, 2, -1, 0) for j in gj]
    return rows


# ----------------------------------------------------------------- elementwise
def constant(ex: FactSink, s: Site) -> tuple:
    if s.op.params.get("value") is not None:
        ex.add(S.KNOWN_CONST, s.op.id)
    return (s.op.kind,)


def only_signature(ex: FactSink, s: Site) -> tuple:
    """No facts of its own: the op only matches an op of the same kind."""
    return (s.op.kind,)


def whole_function(ex: FactSink, s: Site) -> tuple:
    """An opaque but deterministic function of its whole operands (rng_bit_generator:
    bits from a state): equal signatures (kind, params, operand and result shapes and
    dtypes) and equal operands give equal results (datalog/whole_fn.dl)."""
    ex.add(S.WHOLE_FN, s.op.id)
    g = s.graph
    return (s.op.kind, tuple(sorted(s.op.params.items())),
            tuple((g.tensors[t].shape, g.tensors[t].dtype) for t in s.op.inputs),
            (s.out_shape, g.tensors[s.op.output].dtype))


def bitcast_convert(ex: FactSink, s: Site) -> tuple:
    """From an integer type a bitcast is a function of the operand's value (equal
    integers have equal bits), whatever it reads the bits as (random bits as a
    float's mantissa: dropout). Between types of one width it is elementwise, each
    element's bits read alone, so blocks pass through it (a dropout mask of a
    sharded activation, from partitioned threefry bits); between widths it is a
    whole function. From a float it is related by no rule: two equal reals need not
    have equal bits."""
    g = s.graph
    if not all(is_int_dtype(g.tensors[t].dtype) for t in s.op.inputs):
        return only_signature(ex, s)
    src, out = g.tensors[s.op.inputs[0]], g.tensors[s.op.output]
    if tuple(src.shape) != tuple(out.shape):
        return whole_function(ex, s)
    ex.add(S.ELEM_UNARY, s.op.id)
    return (s.op.kind, tuple(sorted(s.op.params.items())), src.dtype, out.dtype)


def elem_unary(ex: FactSink, s: Site) -> tuple:
    ex.add(S.ELEM_UNARY, s.op.id)
    return (s.op.kind, tuple(sorted(s.op.params.items())))


def elem_unary_linear(ex: FactSink, s: Site) -> tuple:
    ex.add(S.ELEM_UNARY_LINEAR, s.op.id)
    return (s.op.kind,)


def elem_addsub(ex: FactSink, s: Site) -> tuple:
    ex.add(S.ELEM_ADDSUB, s.op.id, 1 if s.op.kind == "add" else -1)
    return (s.op.kind,)


def elem_mul(ex: FactSink, s: Site) -> tuple:
    ex.add(S.ELEM_MUL, s.op.id)
    return (s.op.kind,)


def elem_nary(ex: FactSink, s: Site) -> tuple:
    ex.add(S.ELEM_NARY, s.op.id, len(s.op.inputs))
    return (s.op.kind,)


def elem_extremum(ex: FactSink, s: Site) -> tuple:
    ex.add(S.ELEM_EXTREMUM, s.op.id, REDUCER_CODE[s.op.kind])
    return elem_nary(ex, s)


def select_n(ex: FactSink, s: Site) -> tuple:
    ex.add(S.SELECT, s.op.id)
    return elem_nary(ex, s)


def elem_div(ex: FactSink, s: Site) -> tuple:
    if is_float_dtype(s.graph.tensors[s.op.output].dtype):
        ex.add(S.ELEM_DIV, s.op.id)
        return (s.op.kind,)
    return elem_nary(ex, s)  # integer division truncates: not linear, it only matches itself


# ----------------------------------------------------------------- layout
def broadcast_in_dim(ex: FactSink, s: Site) -> tuple:
    op, out_shape = s.op, s.out_shape
    bd = op.params["broadcast_dimensions"]
    expanded = tuple(s.shapes[0][i] != out_shape[j] for i, j in enumerate(bd))
    if not s.dist and op.inputs[0] in ex.iota_along:
        # A broadcast of an iota along i counts along the dim i maps to.
        ex.iota_along[op.output] = {bd[i] for i in ex.iota_along[op.inputs[0]] if not expanded[i]}
    ex.add(S.BROADCAST, op.id)
    mapped = {j: i for i, j in enumerate(bd) if not expanded[i]}
    for j in range(len(out_shape)):
        ex.add(S.BROADCAST_DIM, op.id, mapped.get(j, -1), j)
    return (op.kind, tuple(bd), expanded)


def transpose(ex: FactSink, s: Site) -> tuple:
    ex.add(S.TRANSPOSE, s.op.id)
    for j, i in enumerate(s.op.params["permutation"]):
        ex.add(S.TRANSPOSE_PERM, s.op.id, j, i)
    return (s.op.kind, tuple(s.op.params["permutation"]))


def rev(ex: FactSink, s: Site) -> tuple:
    dims = {int(d) for d in s.op.params["dimensions"]}
    for i in range(len(s.shapes[0])):
        ex.add(S.REV_DIM, s.op.id, i, int(i in dims))
    return (s.op.kind, tuple(sorted(dims)))


def reshape(ex: FactSink, s: Site) -> tuple:
    ex.add(S.RESHAPE, s.op.id)
    rsig = reshape_signature(s.shapes[0], s.out_shape)
    for row in reshape_map(s.shapes[0], s.out_shape):
        ex.add(S.RESHAPE_MAP, s.op.id, *row)
    if rsig is None:
        return (s.op.kind, s.op.id)
    return (s.op.kind, rsig, len(s.shapes[0]), len(s.out_shape))


def slice_(ex: FactSink, s: Site) -> tuple:
    strides = s.op.params.get("strides")
    if not strides or all(st == 1 for st in strides):
        for i, a in enumerate(s.op.params["start_indices"]):
            ex.add(S.SLICE_START, s.op.id, i, a)
    return (s.op.kind,)


def dynamic_slice(ex: FactSink, s: Site) -> tuple:
    """Starts known before run time, clamped as XLA clamps them (the evaluator's
    `clamp_start`); a start not known then gets no fact, so no rule applies."""
    op, fold = s.op, s.fold
    clamped = clamped_starts(fold.small, op.inputs[1:], s.shapes[0], s.out_shape, fold.ranks)
    if clamped is None:
        return (op.kind,)
    for r, row in enumerate(clamped):
        for i, start in enumerate(row):
            if s.dist:
                ex.add(S.DYNSLICE_START, op.id, r, i, start)
            elif r == 0:
                ex.add(S.SLICE_START, op.id, i, start)
    return (op.kind,)


def concatenate(ex: FactSink, s: Site) -> tuple:
    dim = s.op.params["dimension"]
    ex.add(S.CONCAT_DIM, s.op.id, dim)
    off = 0
    for pos, sh in enumerate(s.shapes):
        ex.add(S.CONCAT_OFFSET, s.op.id, pos, off, len(s.shapes))
        off += sh[dim]
    return (s.op.kind,)


def iota(ex: FactSink, s: Site) -> tuple:
    ex.add(S.IOTA_DIM, s.op.id, s.op.params["dimension"])
    if not s.dist:
        ex.iota_along[s.op.output] = {s.op.params["dimension"]}
    return (s.op.kind,)


def gather(ex: FactSink, s: Site) -> tuple:
    """Gather facts when the gather has the form the rules handle (see schema): every
    operand dim outside start_index_map and the batching dims sliced whole."""
    op, out_shape = s.op, s.out_shape
    p = op.params
    sig = ("gather", tuple(p["offset_dims"]), tuple(p["collapsed_slice_dims"]),
           tuple(p["start_index_map"]), p["index_vector_dim"],
           tuple(p.get("operand_batching_dims") or ()),
           tuple(p.get("start_indices_batching_dims") or ()))
    operand, indices = s.shapes[0], s.shapes[1]
    smap, collapsed = tuple(p["start_index_map"]), tuple(p["collapsed_slice_dims"])
    sizes, ivd = tuple(p["slice_sizes"]), p["index_vector_dim"]
    obd = tuple(p.get("operand_batching_dims") or ())
    sbd = tuple(p.get("start_indices_batching_dims") or ())
    if len(sizes) != len(operand) or len(set(smap)) != len(smap) or len(obd) != len(sbd):
        return sig
    # batching dims (take_along_axis): slices of one element, neither indexed nor collapsed
    if any(sizes[i] != 1 or i in smap or i in collapsed for i in obd):
        return sig
    if any(sizes[i] != operand[i] for i in range(len(operand)) if i not in smap and i not in obd):
        return sig
    if any(i not in smap or sizes[i] != 1 for i in collapsed):
        return sig
    ivd = len(indices) if ivd is None else ivd
    vec = ivd if ivd < len(indices) else -1
    if vec >= 0 and indices[vec] != len(smap):
        return sig
    if vec < 0 and len(smap) != 1:
        return sig
    if vec in sbd or any(operand[i] != indices[k] for i, k in zip(obd, sbd)):
        return sig
    kept = [i for i in range(len(operand)) if i not in collapsed and i not in obd]
    offset_dims = tuple(p["offset_dims"])
    if len(offset_dims) != len(kept):
        return sig
    batch_out = [j for j in range(len(out_shape)) if j not in offset_dims]
    batch_in = [k for k in range(len(indices)) if k != vec]
    if len(batch_out) != len(batch_in):
        return sig
    ex.add(S.GATHER, op.id, len(smap), vec)
    ex.add(S.GATHER_BATCHING, op.id, len(obd))
    for idx, (i, k) in enumerate(zip(obd, sbd)):
        ex.add(S.GATHER_OBATCH, op.id, idx, i, k)
    for idx, i in enumerate(smap):
        ex.add(S.GATHER_INDEXED, op.id, idx, i)
    for j, i in zip(offset_dims, kept):
        ex.add(S.GATHER_OFFSET, op.id, j, i, 1 if i in smap else 0)
    for j, kk in zip(batch_out, batch_in):
        ex.add(S.GATHER_BATCH, op.id, j, kk)
    return sig


# ----------------------------------------------------------------- contraction, reduction
def dot_general(ex: FactSink, s: Site) -> tuple:
    op, shapes = s.op, s.shapes
    lc, rc = op.params["lhs_contract"], op.params["rhs_contract"]
    lb, rb = op.params["lhs_batch"], op.params["rhs_batch"]
    ex.add(S.DOT, op.id, len(lc))
    for idx, (l, r) in enumerate(zip(lc, rc)):
        ex.add(S.DOT_CONTRACT, op.id, idx, l, r)
        if not s.dist:
            ex.add(S.CONTRACT_SIZE, op.id, idx, shapes[0][l])
    j = 0
    for l, r in zip(lb, rb):
        ex.add(S.DOT_OUT, op.id, j, 0, l, r)
        j += 1
    for i in range(len(shapes[0])):
        if i not in lc and i not in lb:
            ex.add(S.DOT_OUT, op.id, j, 0, i, -1)
            j += 1
    for i in range(len(shapes[1])):
        if i not in rc and i not in rb:
            ex.add(S.DOT_OUT, op.id, j, 1, i, -1)
            j += 1
    return (op.kind, lc, rc, lb, rb)


def reduction(ex: FactSink, s: Site) -> tuple:
    """Reductions: the reduced axes with their reducer code (sum, max, min; -1 for
    reductions that only relate over whole axes: prod, and/or/xor, argmax/argmin)."""
    op = s.op
    axes = tuple(op.params["axes"])
    red = _REDUCE_KIND.get(op.kind, -1)
    for idx, ax in enumerate(axes):
        ex.add(S.REDUCE_AXIS, op.id, idx, ax, len(axes), red)
        if not s.dist:
            ex.add(S.CONTRACT_SIZE, op.id, idx, s.shapes[0][ax])
    kept = [i for i in range(len(s.shapes[0])) if i not in axes]
    for j, i in enumerate(kept):
        ex.add(S.REDUCE_OUT, op.id, j, i)
    return (op.kind, axes)


def along_axis(ex: FactSink, s: Site) -> tuple:
    """cumsum/cumprod/cummax/cummin/cumlogsumexp (param `axis`) and sort (`dimension`): each
    row along the axis is processed alone, every other dim is kept."""
    p = s.op.params
    ex.add(S.ALONG_AXIS, s.op.id, int(p["axis"] if "axis" in p else p["dimension"]))
    if s.op.kind == "cumsum":
        ex.add(S.ALONG_LINEAR, s.op.id)
    return (s.op.kind, tuple(sorted(p.items())))


# ----------------------------------------------------------------- collectives
def _groups(ex: FactSink, op: Op) -> None:
    groups = op.params["groups"]
    for g, grp in enumerate(groups):
        for idx, r in enumerate(grp):
            ex.add(S.COLL_MEMBER, op.id, g, idx, r, len(grp))
    sizes = {len(grp) for grp in groups}
    if len(sizes) == 1:
        e = prime_exponents(Fraction(sizes.pop()))
        if e is not None:
            ex.add(S.GROUP_SCALE, op.id, *e)


def all_reduce(ex: FactSink, s: Site) -> tuple:
    _groups(ex, s.op)
    ex.add(S.ALL_REDUCE, s.op.id, REDUCER_CODE[s.op.params["reducer"]])
    return (s.op.kind,)


def all_gather(ex: FactSink, s: Site) -> tuple:
    _groups(ex, s.op)
    ex.add(S.ALL_GATHER, s.op.id, s.op.params["dimension"])
    return (s.op.kind,)


def reduce_scatter(ex: FactSink, s: Site) -> tuple:
    _groups(ex, s.op)
    if s.op.params.get("reducer", "sum") == "sum":
        ex.add(S.REDUCE_SCATTER, s.op.id, s.op.params["dimension"])
    return (s.op.kind,)


def all_to_all(ex: FactSink, s: Site) -> tuple:
    _groups(ex, s.op)
    ex.add(S.ALL_TO_ALL, s.op.id, s.op.params["split_dimension"], s.op.params["concat_dimension"])
    return (s.op.kind,)


def collective_permute(ex: FactSink, s: Site) -> tuple:
    for src, dst in s.op.params["pairs"]:
        ex.add(S.PERMUTE_PAIR, s.op.id, src, dst)
    return (s.op.kind,)
