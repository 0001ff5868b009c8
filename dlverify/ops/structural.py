"""Numpy semantics of the IR's non-elementwise op kinds: data movement, reductions,
scans, contraction, sort (per rank), and the collectives (across ranks).

Start indices of dynamic_slice, dynamic_update_slice and gather are clamped
into [0, dim - size] as XLA does, so the window always stays in bounds; the
fact exporter (dlverify/ops/export.py) clamps the folded starts with the same
function, `clamp_start`.
"""
from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlverify.ops.dtypes import is_exact
from dlverify.ops.semantics import Call, NotExecutable, cast_like_result

CollectiveFn = Callable[[dict, list[np.ndarray], tuple[int, ...]], list[np.ndarray]]


def clamp_start(start: int, dim: int, size: int) -> int:
    """XLA's clamp of one dynamic start index: the window [start, start + size)
    is moved inside [0, dim)."""
    return min(max(int(start), 0), dim - size)


def clamped_starts(small: dict, starts: Sequence[int], dims: Sequence[int], sizes: Sequence[int],
                   ranks: int) -> list[list[int]] | None:
    """Per rank, the start tensors `starts` (values known before run time: `small[t][r]`,
    passes.Folded's) clamped as XLA clamps them, windows of `sizes` in dims of `dims`
    elements; None when one is not known then or is not one integer."""
    if not all(t in small for t in starts):
        return None
    try:
        return [[clamp_start(scalar_index(small[t][r]), d, n) for t, d, n in zip(starts, dims, sizes)]
                for r in range(ranks)]
    except NotExecutable:
        return None


def scalar_index(x: np.ndarray) -> int:
    """A start index operand (a scalar, or a one-element array) as an int."""
    flat = np.asarray(x).reshape(-1)
    if flat.size != 1 or not np.issubdtype(flat.dtype, np.integer):
        raise NotExecutable("a start index that is not one integer")
    return int(flat[0])


# ----------------------------------------------------------------- data movement
def broadcast_in_dim(call: Call) -> np.ndarray:
    dims = list(call.params["broadcast_dimensions"])
    # HLO allows dims out of order (a broadcast that also transposes, as the facts read it):
    # operand dim i goes to output dim dims[i], so order the operand's dims by their targets
    order = sorted(range(len(dims)), key=dims.__getitem__)
    x = np.transpose(np.asarray(call.ins[0]), order)
    sh = [1] * len(call.out_shape)
    for i in order:
        sh[dims[i]] = np.shape(call.ins[0])[i]
    return np.broadcast_to(x.reshape(sh), call.out_shape)


def reshape(call: Call) -> np.ndarray:
    return np.asarray(call.ins[0]).reshape(call.out_shape)


def transpose(call: Call) -> np.ndarray:
    return np.transpose(call.ins[0], call.params["permutation"])


def rev(call: Call) -> np.ndarray:
    return np.flip(call.ins[0], axis=tuple(call.params["dimensions"]))


def slice_(call: Call) -> np.ndarray:
    p = call.params
    x = np.asarray(call.ins[0])
    st = p.get("strides") or (1,) * x.ndim
    return x[tuple(slice(a, b, s) for a, b, s in zip(p["start_indices"], p["limit_indices"], st))]


def concatenate(call: Call) -> np.ndarray:
    return np.concatenate([np.asarray(x) for x in call.ins], axis=call.params["dimension"])


def dynamic_slice(call: Call) -> np.ndarray:
    x = np.asarray(call.ins[0])
    shape = call.out_shape
    starts = [clamp_start(scalar_index(s), x.shape[i], shape[i]) for i, s in enumerate(call.ins[1:])]
    return x[tuple(slice(a, a + n) for a, n in zip(starts, shape))]


def dynamic_update_slice(call: Call) -> np.ndarray:
    x = np.array(call.ins[0], copy=True)
    u = np.asarray(call.ins[1])
    starts = [clamp_start(scalar_index(s), x.shape[i], u.shape[i]) for i, s in enumerate(call.ins[2:])]
    x = x.astype(np.result_type(x, u)) if not (is_exact(x) and is_exact(u)) else x
    x[tuple(slice(a, a + n) for a, n in zip(starts, u.shape))] = u
    return x


def pad(call: Call) -> np.ndarray:
    """lax.pad: low/high may be negative (crop), interior inserts pad values between elements."""
    x, value = np.asarray(call.ins[0]), np.asarray(call.ins[1])
    cfg = call.params["padding_config"]
    full = []
    for n, (lo, hi, interior) in zip(x.shape, cfg):
        if interior < 0:
            raise NotExecutable("pad with negative interior padding")
        inner = n + max(n - 1, 0) * interior
        full.append(max(lo, 0) + inner + max(hi, 0))
    out = np.full(full, value.reshape(()), dtype=np.result_type(x, value))
    at = tuple(slice(max(lo, 0), max(lo, 0) + n + max(n - 1, 0) * it, it + 1)
               for n, (lo, hi, it) in zip(x.shape, cfg))
    out[at] = x
    crop = tuple(slice(-min(lo, 0), f - (-min(hi, 0))) for f, (lo, hi, _) in zip(full, cfg))
    return out[crop]


def gather(call: Call) -> np.ndarray:
    """XLA gather: start indices clamped so every slice fits; an operand batching dim
    starts at the position of its paired index batch dim (of the same size)."""
    p = call.params
    x, idx = np.asarray(call.ins[0]), np.asarray(call.ins[1])
    out_shape = call.out_shape
    obd, sbd = tuple(p.get("operand_batching_dims") or ()), tuple(p.get("start_indices_batching_dims") or ())
    smap, collapsed, sizes = p["start_index_map"], p["collapsed_slice_dims"], p["slice_sizes"]
    ivd = p["index_vector_dim"]
    idx = idx.astype(np.int64)
    if ivd is None or ivd == idx.ndim:
        idx, ivd = idx[..., None], idx.ndim
    else:
        idx = np.moveaxis(idx, ivd, -1)
    if idx.shape[-1] != len(smap) or len(obd) != len(sbd):
        raise NotExecutable(f"gather index vectors of size {idx.shape[-1]} for {len(smap)} "
                            f"indexed dims")
    # where each index batch dim is among the index dims without the vector dim
    batch_at = [s - (s > ivd) for s in sbd]
    if any(s == ivd or x.shape[d] != idx.shape[a] for s, d, a in zip(sbd, obd, batch_at)):
        raise NotExecutable("gather batching dims of different sizes")
    kept = [i for i in range(x.ndim) if i not in collapsed and i not in obd]
    batch_out = [j for j in range(len(out_shape)) if j not in p["offset_dims"]]
    out = np.empty(out_shape, dtype=x.dtype)
    for b in np.ndindex(*idx.shape[:-1]):
        start = [0] * x.ndim
        for k, d in enumerate(smap):
            start[d] = clamp_start(idx[b][k], x.shape[d], sizes[d])
        for d, a in zip(obd, batch_at):
            start[d] = b[a]
        piece = x[tuple(slice(a, a + n) for a, n in zip(start, sizes))]
        at: list[Any] = [slice(None)] * len(out_shape)
        for j, v in zip(batch_out, b):
            at[j] = v
        out[tuple(at)] = piece.reshape([sizes[i] for i in kept])
    return out


# ----------------------------------------------------------------- reductions, scans
def _operand(call: Call) -> np.ndarray:
    return cast_like_result(call.ins[0], call.out_dtype)


def _reduce(fn: Callable[..., np.ndarray]) -> Callable[[Call], np.ndarray]:
    def ev(call: Call) -> np.ndarray:
        return fn(_operand(call), tuple(call.params["axes"]))
    return ev


def _max(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    init = np.iinfo(x.dtype).min if np.issubdtype(x.dtype, np.integer) else \
        (False if x.dtype == np.bool_ else -np.inf)
    return np.max(x, axis=axes, initial=init)


def _min(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    init = np.iinfo(x.dtype).max if np.issubdtype(x.dtype, np.integer) else \
        (True if x.dtype == np.bool_ else np.inf)
    return np.min(x, axis=axes, initial=init)


def _bitwise_reduce(ufunc: np.ufunc) -> Callable[[np.ndarray, tuple[int, ...]], np.ndarray]:
    """reduce_and/or/xor: logical on bool, bitwise on integers."""
    def fn(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        if not is_exact(x):
            raise NotExecutable("bitwise reduction of floats")
        return ufunc.reduce(x, axis=axes)
    return fn


reduce_sum = _reduce(lambda x, a: np.sum(x, axis=a))
reduce_prod = _reduce(lambda x, a: np.prod(x, axis=a))
reduce_max = _reduce(_max)
reduce_min = _reduce(_min)
reduce_and = _reduce(_bitwise_reduce(np.bitwise_and))
reduce_or = _reduce(_bitwise_reduce(np.bitwise_or))
reduce_xor = _reduce(_bitwise_reduce(np.bitwise_xor))


def _arg(fn: Callable[..., np.ndarray]) -> Callable[[Call], np.ndarray]:
    def ev(call: Call) -> np.ndarray:
        (ax,) = call.params["axes"]
        return fn(np.asarray(call.ins[0]), axis=ax)  # first index among ties and NaNs, like lax
    return ev


argmax = _arg(np.argmax)
argmin = _arg(np.argmin)


def _scan(fn: Callable[..., np.ndarray]) -> Callable[[Call], np.ndarray]:
    def ev(call: Call) -> np.ndarray:
        ax, reverse = call.params["axis"], call.params["reverse"]
        x = _operand(call)
        x = np.flip(x, ax) if reverse else x
        y = fn(x, axis=ax)
        return np.flip(y, ax) if reverse else y
    return ev


cumsum = _scan(np.cumsum)
cumprod = _scan(np.cumprod)
cummax = _scan(np.maximum.accumulate)
cummin = _scan(np.minimum.accumulate)
cumlogsumexp = _scan(np.logaddexp.accumulate)   # log(cumsum(exp x)), without overflow


def sort(call: Call) -> np.ndarray:
    """lax.sort: the operands sorted together along `dimension`, ordered by their
    first `num_keys` operands lexicographically and stably (argsort sorts values
    and an iota); the result is operand number `output` (default 0)."""
    p = call.params
    ax, keys, which = p["dimension"], int(p.get("num_keys", 1)), int(p.get("output", 0))
    xs = [np.moveaxis(np.asarray(x), ax, -1) for x in call.ins]
    if not 1 <= keys <= len(xs) or not 0 <= which < len(xs):
        raise NotExecutable(f"sort with {len(xs)} operands, num_keys {keys}, output {which}")
    order = np.lexsort(tuple(reversed(xs[:keys])), axis=-1)   # lexsort: the last key is primary
    return np.moveaxis(np.take_along_axis(xs[which], order, axis=-1), -1, ax)


def softmax(call: Call) -> np.ndarray:
    """exp(x) / sum exp(x) along `axis` (computed shifted by the row max, the same
    value over the reals); the canonical form of dlverify/softmax_form.py."""
    x = np.asarray(call.ins[0])
    ax = call.params["axis"]
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - np.max(x, axis=ax, keepdims=True))
        return e / np.sum(e, axis=ax, keepdims=True)


def top_k(call: Call) -> np.ndarray:
    """lax.top_k along `axis`: the k largest values in descending order, equal values
    by ascending index, +0 above -0 (XLA's total order); `output` 0 gives the
    values, 1 their indices."""
    p = call.params
    x = np.moveaxis(np.asarray(call.ins[0]), p["axis"], -1)
    n = x.shape[-1]
    # A stable ascending sort of the reversed row, read backwards: descending
    # values, ties in ascending index, for every dtype (no negation overflow).
    xr = x[..., ::-1]
    if is_exact(xr):
        order = np.argsort(xr, axis=-1, kind="stable")
    else:   # equal floats: -0 below +0 (np.lexsort: the last key is primary)
        xr = xr.astype(np.float64)
        order = np.lexsort((~np.signbit(xr), xr), axis=-1)
    idx = (n - 1 - order[..., ::-1])[..., :p["k"]]
    res = idx if p.get("output", 0) == 1 else np.take_along_axis(x, idx, axis=-1)
    return np.moveaxis(res, -1, p["axis"])


def _storage_dtype(name: str) -> np.dtype:
    """The numpy type that stores IR element type `name` (ml_dtypes for bfloat16
    and the float8 types)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # shipped with jaxlib
        try:
            return np.dtype(getattr(ml_dtypes, name))
        except AttributeError:
            raise NotExecutable(f"no storage type for element type {name}") from None


def bitcast_convert(call: Call) -> np.ndarray:
    """XLA's bitcast-convert: the operand, stored in its element type `from`,
    read as the result's element type (the float -> ordered-integer trick of
    sort comparators). Between widths (integer types only, as frontends/hlo
    emits it) a wider element becomes a last dim of narrower ones and a last
    dim of narrower ones one wider element, in the host's byte order, which is
    XLA's on CPU (little-endian); checked against jax.lax.bitcast_convert_type."""
    src, dst = _storage_dtype(call.params["from"]), _storage_dtype(call.out_dtype)
    x = np.asarray(call.ins[0])
    if is_exact(x) != (src.kind in "iub"):
        raise NotExecutable(f"bitcast-convert from {call.params['from']} of a {x.dtype} value")
    stored = np.ascontiguousarray(x.astype(src))
    if src.itemsize == dst.itemsize:
        return stored.view(dst)
    if src.kind not in "iu" or dst.kind not in "iu":
        raise NotExecutable(f"bitcast-convert {src} -> {dst} changes the width of a non-integer")
    if src.itemsize > dst.itemsize:
        return stored.reshape(stored.shape + (1,)).view(dst)
    if not stored.shape or stored.shape[-1] * src.itemsize != dst.itemsize:
        raise NotExecutable(f"bitcast-convert {src}{list(stored.shape)} -> {dst}: the last dim "
                            f"does not make one {dst} element")
    return stored.view(dst).reshape(stored.shape[:-1])


def dot_general(call: Call) -> np.ndarray:
    p = call.params
    a, b = (cast_like_result(x, call.out_dtype) for x in call.ins)
    letters = iter(string.ascii_letters)
    la = [next(letters) for _ in range(a.ndim)]
    lb = [""] * b.ndim
    for i, j in zip(p["lhs_batch"], p["rhs_batch"]):
        lb[j] = la[i]
    for i, j in zip(p["lhs_contract"], p["rhs_contract"]):
        lb[j] = la[i]
    for j in range(b.ndim):
        if not lb[j]:
            lb[j] = next(letters)
    out = [la[i] for i in p["lhs_batch"]]
    out += [la[i] for i in range(a.ndim) if i not in p["lhs_batch"] and i not in p["lhs_contract"]]
    out += [lb[j] for j in range(b.ndim) if j not in p["rhs_batch"] and j not in p["rhs_contract"]]
    return np.einsum(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", a, b, optimize=True)


# ----------------------------------------------------------------- collectives
# Each takes the op's params, its operand on every rank, and the result shape;
# ranks outside every group keep their operand (XLA leaves them alone).
_REDUCERS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add, "max": np.maximum, "min": np.minimum}


def _reducer(p: dict) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    name = p.get("reducer", "sum")
    if name not in _REDUCERS:
        raise NotExecutable(f"collective with reducer {name!r}")
    return _REDUCERS[name]


def _fill(out: list[np.ndarray | None], like: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [o if o is not None else like[r] for r, o in enumerate(out)]


def _group_reduce(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], xs: list[np.ndarray],
                  grp: Sequence[int]) -> np.ndarray:
    """The group's members combined with the reducer fn, in member order."""
    acc = xs[grp[0]]
    for m in grp[1:]:
        acc = fn(acc, xs[m])
    return acc


def all_reduce(p: dict, xs: list[np.ndarray], shape: tuple[int, ...]) -> list[np.ndarray]:
    fn = _reducer(p)
    out: list[np.ndarray | None] = [None] * len(xs)
    for grp in p["groups"]:
        acc = _group_reduce(fn, xs, grp)
        for m in grp:
            out[m] = acc
    return _fill(out, xs)


def all_gather(p: dict, xs: list[np.ndarray], shape: tuple[int, ...]) -> list[np.ndarray]:
    out: list[np.ndarray | None] = [None] * len(xs)
    for grp in p["groups"]:
        cat = np.concatenate([xs[m] for m in grp], axis=p["dimension"])
        for m in grp:
            out[m] = cat
    return _fill(out, xs)


def reduce_scatter(p: dict, xs: list[np.ndarray], shape: tuple[int, ...]) -> list[np.ndarray]:
    fn = _reducer(p)
    out: list[np.ndarray | None] = [None] * len(xs)
    for grp in p["groups"]:
        acc = _group_reduce(fn, xs, grp)
        parts = np.split(acc, len(grp), axis=p["dimension"])
        for q, m in enumerate(grp):
            out[m] = parts[q]
    return _fill(out, xs)


def all_to_all(p: dict, xs: list[np.ndarray], shape: tuple[int, ...]) -> list[np.ndarray]:
    out: list[np.ndarray | None] = [None] * len(xs)
    a, b = p["split_dimension"], p["concat_dimension"]
    for grp in p["groups"]:
        chunks = {m: np.split(xs[m], len(grp), axis=a) for m in grp}
        for q, m in enumerate(grp):
            out[m] = np.concatenate([chunks[src][q] for src in grp], axis=b)
    return _fill(out, xs)


def collective_permute(p: dict, xs: list[np.ndarray], shape: tuple[int, ...]) -> list[np.ndarray]:
    """Ranks that receive nothing get zeros (XLA's collective-permute)."""
    out = [np.zeros(shape, dtype=np.asarray(xs[0]).dtype) for _ in xs]
    for src, dst in p["pairs"]:
        out[dst] = xs[src]
    return out

