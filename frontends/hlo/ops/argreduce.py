"""A variadic reduce over (values, iota indices) whose reducer picks the larger
(smaller) value, the lower index among equal ones: JAX's lowering of
jnp.argmax / lax.argmax (argmin). It becomes the IR's `argmax` (`argmin`) of
the values, and the values' result a `reduce_max` (`reduce_min`), as the
jaxpr frontend emits them.

The reducer `f(a, ia, b, ib) -> (value, index)` is recognised by evaluating it
with the shared evaluator on probe values (frontends/hlo/comparator.py), never
by its text: on every pair of ordinary values (equal ones, both infinities,
both zeros, subnormals) and index pairs in either order it must give exactly
the reference pick. The reduction order of XLA is unspecified, so an exact,
order-independent pick is what makes the result the first extremal index.
NaN: a reducer that lets a NaN win (the IR's argmax takes the first NaN, as
np.argmax does) is accepted; when two NaN meet it may keep either (JAX's
keeps `a`), so the first NaN is assumed to be the one XLA returns; any other
NaN handling is accepted with the assumption that the values hold no NaN.
The index operand must be an iota along the reduced dim and the inits the
identities (the lowest value, index 0); anything else is an UnknownOpError at
the reduce's line."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import ints
from dlverify.frontends.hlo.comparator import evaluate_scalar_computation, key_values
from dlverify.frontends.hlo.model import HloComputation, HloInstruction, np_dtype
from dlverify.ir import SourceLoc, is_float_dtype
from dlverify.ops.dtypes import is_int_dtype

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer

_INDEX_PAIRS = ((0, 1), (1, 0), (1, 3), (3, 1))


def is_iota_along(L: Lowerer, t: int, axis: int) -> bool:
    """Tensor t holds its position along `axis` (an iota, or its broadcast)."""
    shape = L.shape_of(t)
    want = np.broadcast_to(np.arange(shape[axis]).reshape(
        [-1 if d == axis else 1 for d in range(len(shape))]), shape)
    if t in L.known:
        return np.array_equal(np.asarray(L.known[t]), want)
    producer = L.b.graph.producer()
    op = producer.get(t)
    if op is not None and op.kind == "iota":
        return op.params["dimension"] == axis
    if op is not None and op.kind == "broadcast_in_dim":
        src = producer.get(op.inputs[0])
        return src is not None and src.kind == "iota" and len(L.shape_of(op.inputs[0])) == 1 \
            and tuple(op.params["broadcast_dimensions"]) == (axis,)
    return False


def _probe_columns(vdt: str, idt: str) -> tuple[list[np.ndarray], np.ndarray]:
    """Columns (a, ia, b, ib) of every probe, and which probes hold a NaN."""
    keys = key_values(vdt)
    vals = list(keys)
    if is_float_dtype(vdt):
        vals.append(np.array(np.nan, dtype=keys.dtype))
    cols: list[list] = [[], [], [], []]
    for a in vals:
        for b in vals:
            for ia, ib in _INDEX_PAIRS:
                for k, v in enumerate((a, np.array(ia, np_dtype(idt)), b, np.array(ib, np_dtype(idt)))):
                    cols[k].append(v)
    arrays = [np.array(c) for c in cols]
    with np.errstate(invalid="ignore"):
        nan = np.isnan(arrays[0].astype(np.float64)) | np.isnan(arrays[2].astype(np.float64))
    return arrays, nan


def _classify(L: Lowerer, ins: HloInstruction, comp: HloComputation, vdt: str,
              idt: str) -> tuple[str, list[str]] | None:
    """("argmax" | "argmin", assumptions) the reducer computes, or None."""
    cols, nan = _probe_columns(vdt, idt)
    out = evaluate_scalar_computation(L, ins, comp, [vdt, idt, vdt, idt], cols, "reducer")
    if len(out) != 2:
        return None
    a, ia, b, ib = (c.astype(np.float64) if k % 2 == 0 else c.astype(np.int64)
                    for k, c in enumerate(cols))
    val, idx = out[0].astype(np.float64), out[1].astype(np.int64)
    real = ~nan
    for kind, better in (("argmax", a > b), ("argmin", a < b)):
        pick_a = better | ((a == b) & (ia < ib))
        want_v, want_i = np.where(pick_a, a, b), np.where(pick_a, ia, ib)
        if not (np.array_equal(val[real], want_v[real]) and np.array_equal(idx[real], want_i[real])):
            continue
        if not nan.any():
            return kind, []
        an, bn = np.isnan(a[nan]), np.isnan(b[nan])
        one = an != bn
        nan_wins = np.isnan(val[nan]).all() and np.array_equal(
            idx[nan][one], np.where(an, ia[nan], ib[nan])[one]) and \
            ((idx[nan][~one] == ia[nan][~one]) | (idx[nan][~one] == ib[nan][~one])).all()
        if nan_wins:
            return kind, [f"{kind} {{where}}: where two NaN meet its reducer keeps either, the "
                          f"IR's {kind} takes the first: assumed XLA returns the first NaN's "
                          f"index or no row holds two NaN"]
        return kind, [f"{kind} {{where}}: its reducer handles NaN otherwise than the IR's "
                      f"{kind} (the first NaN wins): assumed the values hold no NaN"]
    return None


def _values_used(ins: HloInstruction, comp: HloComputation) -> bool:
    """Whether anything in `comp` reads `ins` other than as its index result."""
    return any(ins.name in user.operands and not (
        user.opcode == "get-tuple-element" and ints(user.attrs.get("index")) == (1,))
        for user in comp.instructions) or comp.root is ins


def arg_reduce(L: Lowerer, ins: HloInstruction, ops: list, comp: HloComputation,
               loc: SourceLoc, identities) -> tuple:
    """The (values, indices) results of an argmax/argmin variadic reduce."""
    refuse = "variadic (tuple) reduce is supported only as argmax/argmin over (values, iota)"
    if len(ops) != 4 or not ins.shape.is_tuple or len(ins.shape.elements) != 2:
        raise L.unknown(ins, f"{refuse}; this one reduces {len(ops) // 2} operands")
    x, idx, xinit, iinit = (L.tid(ins, v) for v in ops)
    shape, vdt, idt = L.shape_of(x), L.dtype_of(x), L.dtype_of(idx)
    axes = ints(ins.attrs.get("dimensions"))
    if len(axes) != 1 or not 0 <= axes[0] < len(shape):
        raise L.unknown(ins, f"{refuse} along one dim; dimensions={list(axes)}")
    axis = axes[0]
    if L.shape_of(idx) != shape or not is_int_dtype(idt) or not is_iota_along(L, idx, axis):
        raise L.unknown(ins, f"{refuse}: operand 1 is not an iota along dim {axis}")
    if key_values(vdt) is None:
        raise L.unknown(ins, f"{refuse}: values of type {vdt} have no order the IR knows")
    cname = (ins.attrs.get("to_apply") or "").strip().lstrip("%")
    if cname not in L.m.computations:
        raise L.err(ins, "reduce without a to_apply computation")
    found = _classify(L, ins, L.m.computations[cname], vdt, idt)
    if found is None:
        raise L.unknown(ins, f"{refuse}: reducer %{cname} does not pick the larger (or smaller) "
                             f"value with the lower index among equal ones")
    kind, notes = found
    inits = [L.known.get(t) for t in (xinit, iinit)]
    if any(v is None or np.shape(v) != () for v in inits):
        raise L.unknown(ins, f"{kind} with init values that are not known scalar constants")
    v0, i0 = (np.asarray(v).item() for v in inits)
    if not any(v0 == o for o in identities("maximum" if kind == "argmax" else "minimum", vdt)) \
            or i0 != 0:
        raise L.unknown(ins, f"{kind} with init ({v0}, {i0}), not (the identity, 0)")
    where = f"{ins.name} ({L.file}:{ins.line})"
    for note in notes:
        L.assume(note.format(where=where))
    res = ins.shape.elements
    if res[0].dims != res[1].dims or res[0].dtype != vdt or res[1].dtype != idt:
        raise L.err(ins, f"{kind} of {vdt}{list(shape)} declares the result {ins.shape}")
    params = {"axes": (axis,)}
    index = L.emit(kind, [x], res[1].dims, idt, params, loc, ins.name)
    if not _values_used(ins, comp):   # only the indices are read (jnp.argmax)
        return None, index
    values = L.emit("reduce_max" if kind == "argmax" else "reduce_min", [x], res[0].dims, vdt,
                    params, loc, ins.name)
    return values, index
