"""What the comparator computation of an HLO `sort` (or a TopK custom call)
orders by, found by running it on probe values.

The IR has one sort: stable, ascending, by the first `num_keys` operands. An
HLO sort instead carries a comparator `to_apply=` computation, `lt(a0, b0, a1,
b1, ...)`, whose text varies (JAX writes a total-order comparator out of
selects, bitcasts and xors; XLA may write a plain `compare(p0, p1),
direction=LT`). Rather than matching its text, the comparator is lowered like
any computation and evaluated by the one evaluator (dlverify/ops, through the
interpreter; every probe is one "rank") on pairs of probe values, then compared
with `a < b` (ascending) and `a > b` (descending) on operand 0, with the other
operands varied to show that they are ignored (num_keys = 1).

Accepted: exact agreement on every probe pair of ordinary values (equal values,
both infinities, subnormals, both zeros: -0 and +0 compare equal). Two
deviations are accepted with an assumption, because they only differ from `<`
on values that are not reals: ordering -0 before +0 (a bit-level total order),
and NaN. Anything else is an UnknownOpError naming the sort's line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dlverify.errors import InputError, UnknownOpError
from dlverify.frontends.hlo.model import HloComputation, HloInstruction, np_dtype
from dlverify.interpret import Interpreter, NotExecutable
from dlverify.ir import COLLECTIVES, Graph, GraphBuilder, IdAllocator, is_float_dtype

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


@dataclass(frozen=True)
class ComparatorOrder:
    """The order a comparator computes: ascending (`a < b`) or descending
    (`a > b`) on operand 0 alone; `assumptions` name the non-real values
    (signed zeros, NaN) on which it may differ from the IR's sort."""

    descending: bool
    assumptions: tuple[str, ...]


@dataclass(frozen=True)
class _Probes:
    """Comparator arguments, one probe per column: `args[k]` is parameter k's
    values; `lhs`/`rhs` the operand-0 values compared; `signed_zero` marks the
    pairs (-0, +0) and (+0, -0); `nan` the pairs holding a NaN."""

    args: list[list[np.ndarray]]
    lhs: np.ndarray
    rhs: np.ndarray
    signed_zero: np.ndarray
    nan: np.ndarray


def key_values(dtype: str) -> np.ndarray | None:
    """Probe values of a key type: extremes, neighbours of zero, both zeros,
    equal pairs come from the cross product. None: not an orderable type."""
    dt = np_dtype(dtype)
    if dtype == "bool":
        return np.array([False, True])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        vals = [info.min, info.min + 1, 0, 1, 7, info.max - 1, info.max]
        if dt.kind == "i":
            vals += [-7, -1]
        return np.array(sorted(set(vals)), dtype=dt)
    if is_float_dtype(dtype) and not dtype.startswith("complex"):
        base = np.array([-np.inf, -2.5, -1.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, 2.5, 1e30, np.inf])
        vals = base.astype(dt)
        return vals[~np.isnan(vals.astype(np.float64))]
    return None


def _lo_hi(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    dt = np_dtype(dtype)
    return np.array(False if dtype == "bool" else 0, dtype=dt), np.array(True if dtype == "bool" else 1, dtype=dt)


def _probes(dtypes: list[str], keys: np.ndarray) -> _Probes:
    others = [_lo_hi(d) for d in dtypes[1:]]
    cols: list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]] = []
    for a in keys:
        for b in keys:
            # other operands: lt, gt and equal pairs (none to vary without them)
            for pick in ((0, 1), (1, 0), (0, 0)) if others else ((0, 0),):
                cols.append((a, b, [x for lo_hi in others for x in (lo_hi[pick[0]], lo_hi[pick[1]])]))
    if is_float_dtype(dtypes[0]):
        nan = np.array(np.nan, dtype=keys.dtype)
        rest = [x for lo_hi in others for x in lo_hi]
        cols += [(a, nan, rest) for a in keys] + [(nan, a, rest) for a in keys] + [(nan, nan, rest)]
    lhs = np.array([c[0] for c in cols])
    rhs = np.array([c[1] for c in cols])
    args = [[c[0] for c in cols], [c[1] for c in cols]]
    args += [[c[2][k] for c in cols] for k in range(2 * len(others))]
    with np.errstate(invalid="ignore"):
        l64, r64 = lhs.astype(np.float64), rhs.astype(np.float64)
        signed_zero = (l64 == 0) & (r64 == 0) & (np.signbit(l64) != np.signbit(r64))
    return _Probes(args, l64, r64, signed_zero, np.isnan(l64) | np.isnan(r64))


def evaluate_scalar_computation(L: Lowerer, ins: HloInstruction, comp: HloComputation,
                                dtypes: list[str], columns: list[list[np.ndarray]],
                                role: str) -> list[np.ndarray]:
    """Computation `comp` (called by `ins` as its `role`: comparator, reducer)
    over scalar parameters of element types `dtypes`, evaluated by the shared
    evaluator on every probe (columns[k]: parameter k's values, one per probe).
    One array per element of its (tuple) root, one entry per probe; anything
    that cannot be evaluated is an UnknownOpError naming `ins`'s line."""
    from dlverify.frontends.hlo.lower import Lowerer as _Lowerer
    graph = Graph(f"{role} {comp.name}")
    b = GraphBuilder(graph, IdAllocator())
    sub = _Lowerer(L.m, b, L.ranks, L.registry)
    sub.bit_reinterpretation = True
    params = [b.tensor((), d, f"p{k}") for k, d in enumerate(dtypes)]
    graph.inputs = params
    n = len(columns[0]) if columns else 0
    try:
        root = sub.run_comp(comp, list(params), None, ins)
        leaves = list(root) if isinstance(root, tuple) else [root]
        if not all(isinstance(t, (int, np.integer)) and graph.tensors[int(t)].shape == ()
                   for t in leaves):
            raise L.err(ins, f"{role} %{comp.name} does not return scalars")
        ranked = [op.kind for op in graph.ops if op.kind in COLLECTIVES or op.kind == "axis_index"]
        if ranked:   # the probes run as ranks: the computation must not look across them
            raise L.unknown(ins, f"{role} %{comp.name} uses {ranked[0]}")
        vals = Interpreter(graph, n).run([[np.asarray(v) for v in col] for col in columns])
    except (InputError, UnknownOpError) as e:
        where = f" (line {e.line})" if e.line else ""
        raise L.unknown(ins, f"{role} %{comp.name} cannot be evaluated: {e.message}{where}") \
            from None
    except NotExecutable as e:
        raise L.unknown(ins, f"{role} %{comp.name} cannot be evaluated: {e}") from None
    return [np.array([np.asarray(v).reshape(()) for v in vals[int(t)]]) for t in leaves]


def _run(L: Lowerer, ins: HloInstruction, comp: HloComputation, dtypes: list[str],
         probes: _Probes) -> np.ndarray:
    """The comparator's value on every probe, by the shared evaluator."""
    res = evaluate_scalar_computation(L, ins, comp, [t for d in dtypes for t in (d, d)],
                                      probes.args, "comparator")
    if len(res) != 1 or res[0].dtype != np.bool_:
        raise L.unknown(ins, f"comparator %{comp.name} does not return pred[]")
    return res[0].astype(bool)


def comparator_order(L: Lowerer, ins: HloInstruction, comp: HloComputation,
                     dtypes: list[str]) -> ComparatorOrder:
    """The order comparator `comp` of `ins` (over operands of element types
    `dtypes`) computes, or an UnknownOpError naming `ins`'s line."""
    cache_key = (comp.name, tuple(dtypes))
    if cache_key in L.comparator_orders:
        order = L.comparator_orders[cache_key]
    else:
        order = _classify(L, ins, comp, dtypes)
        L.comparator_orders[cache_key] = order
    where = f"{ins.name} ({L.file}:{ins.line})"
    return ComparatorOrder(order.descending, tuple(a.format(where=where) for a in order.assumptions))


def _classify(L: Lowerer, ins: HloInstruction, comp: HloComputation,
              dtypes: list[str]) -> ComparatorOrder:
    params = comp.parameters()
    want = [d for d in dtypes for _ in (0, 1)]
    got = [params[k].shape.dtype if k in params and not params[k].shape.is_tuple
           and params[k].shape.dims == () else None for k in range(len(params))]
    if got != want:
        raise L.err(ins, f"comparator %{comp.name} takes ({', '.join(map(str, got))}), expected "
                         f"two scalars per operand ({', '.join(want)})")
    keys = key_values(dtypes[0])
    if keys is None:
        raise L.unknown(ins, f"sort keys of type {dtypes[0]} have no order the IR knows")
    probes = _probes(dtypes, keys)
    res = _run(L, ins, comp, dtypes, probes)
    real = ~probes.nan
    lhs, rhs = probes.lhs, probes.rhs
    with np.errstate(invalid="ignore"):
        refs = {False: lhs < rhs, True: lhs > rhs}
    for descending, ref in refs.items():
        plain = real & ~probes.signed_zero
        if not np.array_equal(res[plain], ref[plain]):
            continue
        notes = []
        sz = probes.signed_zero
        if not np.array_equal(res[sz], ref[sz]):
            # a bit-level total order: -0 before +0 ascending (after it descending)
            total = np.signbit(lhs[sz]) != descending
            if not np.array_equal(res[sz], total):
                continue
            notes.append("sort {where}: its comparator orders -0 before +0 (a total order), the IR "
                         "sorts them as equal: assumed no key row holds both zeros")
        nan = probes.nan
        if nan.any():
            # The IR puts NaN last in either direction (frontends/hlo/ops/sorting.py).
            lhs_nan, rhs_nan = np.isnan(lhs[nan]), np.isnan(rhs[nan])
            nan_last = rhs_nan & ~lhs_nan
            nan_first = lhs_nan & ~rhs_nan
            if np.array_equal(res[nan], nan_last):
                pass
            elif not res[nan].any() or np.array_equal(res[nan], nan_first):
                notes.append("sort {where}: its comparator orders NaN otherwise than the IR's "
                             "sort (NaN last): assumed the keys hold no NaN")
            else:
                continue
        return ComparatorOrder(descending, tuple(notes))
    bad = int(np.flatnonzero(real & (res != refs[False]))[0])
    raise L.unknown(ins, f"comparator %{comp.name} does not order like a < b or a > b on operand "
                         f"0 alone (num_keys=1): it gives {bool(res[bad])} on a={lhs[bad].item()}, "
                         f"b={rhs[bad].item()} with the other operands "
                         f"{[probes.args[k][bad].item() for k in range(2, len(probes.args))]}")
