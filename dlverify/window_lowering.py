"""Windowed ops expanded into existing IR ops, shared by both frontends: the
building blocks of a window over a padded operand (pad with a value, interior
padding for a base dilation, negative padding as a slice; the elements one window
position reads, every stride-th, as slices of stride 1), used by the convolution
expansion (dlverify/conv_lowering.py), and reduce-window (pooling:
`lax.reduce_window_{sum,max,min}`, HLO `reduce-window`) expanded into them:

    out[p] = reduce over window offsets t of xp[p * stride + t * window_dilation]

with xp the operand padded with the reducer's identity (0, -inf, +inf, ...),
which changes no window's reduction: elementwise adds (maxima, minima, ...) of one
strided slice per window offset, as a balanced tree. Windows that tile the padded
operand (stride = window, padding not negative, no dilation: 2x2 pooling, XLA's
tree-reduction rewriter) are the reduction over the window dims of the operand
split into (windows, window). tests/test_windows.py checks both
against JAX on random data.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

from dlverify.errors import InputError, UnknownOpError

# (kind, inputs, shape, params) -> the new op's result tensor, in the op's dtype,
# reported at its source location
Emit = Callable[[str, list[int], tuple[int, ...], dict], int]

# a window's elementwise combiner -> the reduction over a tiled window's dims
_REDUCE = {"add": "reduce_sum", "mul": "reduce_prod", "max": "reduce_max", "min": "reduce_min",
           "and": "reduce_and", "or": "reduce_or", "xor": "reduce_xor"}


@dataclass(frozen=True)
class WindowSite:
    """Where a windowed op is expanded: how to emit an op, and a scalar constant of
    its dtype (a padding value)."""

    emit: Emit
    scalar: Callable[[float], int]


def transpose(site: WindowSite, t: int, shape: tuple[int, ...],
              perm: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    if perm == tuple(range(len(perm))):
        return t, shape
    out = tuple(shape[p] for p in perm)
    return site.emit("transpose", [t], out, {"permutation": perm}), out


def reshape(site: WindowSite, t: int, shape: tuple[int, ...], out: tuple[int, ...]) -> int:
    return t if out == shape else site.emit("reshape", [t], out, {})


def slice_(site: WindowSite, t: int, shape: tuple[int, ...], start: tuple[int, ...],
           limit: tuple[int, ...]) -> int:
    if start == (0,) * len(shape) and limit == shape:
        return t
    return site.emit("slice", [t], tuple(b - a for a, b in zip(start, limit)),
                     {"start_indices": start, "limit_indices": limit, "strides": None})


def dilated(site: WindowSite, x: int, shape: tuple[int, ...], interior: tuple[int, ...],
            value: int) -> tuple[int, tuple[int, ...]]:
    """x with interior[d] elements of the scalar tensor `value` between neighbours
    along each dim d, written with pads that have no interior padding (the form the
    rules relate, Pad_Dim): each such dim split into (n, 1), padded to (n, it + 1),
    merged back and cut to (n - 1) * (it + 1) + 1."""
    if not any(interior):
        return x, shape
    split = tuple(v for n, it in zip(shape, interior) for v in ((n, 1) if it else (n,)))
    wide = tuple(v for n, it in zip(shape, interior) for v in ((n, it + 1) if it else (n,)))
    cfg = tuple(c for it in interior for c in (((0, 0, 0), (0, it, 0)) if it else ((0, 0, 0),)))
    t = site.emit("pad", [reshape(site, x, shape, split), value], wide, {"padding_config": cfg})
    flat = tuple(n * (it + 1) for n, it in zip(shape, interior))
    t = reshape(site, t, wide, flat)
    out = tuple((n - 1) * (it + 1) + 1 for n, it in zip(shape, interior))
    return slice_(site, t, flat, (0,) * len(shape), out), out


def padded(site: WindowSite, x: int, shape: tuple[int, ...], pads: tuple[tuple[int, int, int], ...],
           extra: tuple[int, ...], value: int) -> tuple[int, tuple[int, ...]]:
    """x with (lo, hi, interior) padding per dim and `extra` elements more at the
    high end, all of the scalar tensor `value`. Interior padding comes first
    (`dilated`); negative padding crops the padded (and dilated) operand: a slice
    after the positive part, and the extra elements after that."""
    x, shape = dilated(site, x, shape, tuple(it for _, _, it in pads), value)
    pads = tuple((lo, hi, 0) for lo, hi, _ in pads)
    def pad(t: int, sh: tuple[int, ...], cfg: list[tuple[int, int, int]]) -> tuple[int, tuple[int, ...]]:
        if all(c == (0, 0, 0) for c in cfg):
            return t, sh
        out = tuple(lo + (n - 1) * (it + 1) + 1 + hi for n, (lo, hi, it) in zip(sh, cfg))
        return site.emit("pad", [t, value], out, {"padding_config": tuple(cfg)}), out

    cropped = any(lo < 0 or hi < 0 for lo, hi, _ in pads)
    t, sh = pad(x, shape, [(max(lo, 0), max(hi, 0) + (0 if cropped else e), it)
                           for (lo, hi, it), e in zip(pads, extra)])
    if not cropped:
        return t, sh
    start = tuple(-min(lo, 0) for lo, _, _ in pads)
    limit = tuple(n + min(hi, 0) for n, (_, hi, _) in zip(sh, pads))
    t = slice_(site, t, sh, start, limit)
    sh = tuple(b - a for a, b in zip(start, limit))
    return pad(t, sh, [(0, e, 0) for e in extra])


def window_rows(site: WindowSite, xp: int, shape: tuple[int, ...], start: tuple[int, ...],
                sizes: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """xp[start + p * stride] for p < sizes, per dim: a slice of sizes * stride
    elements (xp holds them: see `extra`), split into (sizes, stride) where the
    stride is above one and cut to the first of each."""
    limit = tuple(a + o * s for a, o, s in zip(start, sizes, strides))
    t = slice_(site, xp, shape, start, limit)
    if all(s == 1 for s in strides):
        return t
    cut = tuple(b - a for a, b in zip(start, limit))
    split = tuple(v for o, s in zip(sizes, strides) for v in ((o, s) if s > 1 else (o,)))
    t = reshape(site, t, cut, split)
    first = tuple(v for o, s in zip(sizes, strides) for v in ((o, 1) if s > 1 else (o,)))
    t = slice_(site, t, split, (0,) * len(split), first)
    return reshape(site, t, first, tuple(sizes))


def extra_high(shape: tuple[int, ...], window: tuple[int, ...], sizes: tuple[int, ...],
               strides: tuple[int, ...], pads: tuple[tuple[int, int, int], ...],
               window_dilation: tuple[int, ...]) -> tuple[int, ...]:
    """Elements to append at the high end of each padded dim so that every window
    offset's cut of sizes * stride elements fits (none is read)."""
    return tuple(max(0, (w - 1) * wd + o * s - ((n - 1) * (it + 1) + 1 + lo + hi))
                 for n, w, o, s, (lo, hi, it), wd in
                 zip(shape, window, sizes, strides, pads, window_dilation))


def out_sizes(shape: tuple[int, ...], window: tuple[int, ...], strides: tuple[int, ...],
              pads: tuple[tuple[int, int, int], ...], window_dilation: tuple[int, ...]) -> tuple[int, ...]:
    """The number of window positions per dim (0 when the window does not fit)."""
    out = []
    for n, w, s, (lo, hi, it), wd in zip(shape, window, strides, pads, window_dilation):
        span = (w - 1) * wd + 1
        total = (n - 1) * (it + 1) + 1 + lo + hi
        out.append((total - span) // s + 1 if total >= span else 0)
    return tuple(out)


def balanced(site: WindowSite, kind: str, items: list[int], shape: tuple[int, ...]) -> int:
    """items combined by the associative, commutative elementwise `kind` as a
    balanced tree (its depth, log2 of the count, bounds the derivations and
    explanations that follow it, where a chain would grow with the kernel)."""
    while len(items) > 1:
        pairs = [site.emit(kind, items[i:i + 2], shape, {}) if i + 1 < len(items) else items[i]
                 for i in range(0, len(items), 2)]
        items = pairs
    return items[0]


@dataclass(frozen=True)
class ReduceWindow:
    """A reduce-window: its reducer (add, max, min) and, per dim, window size,
    stride, (lo, hi) padding, base and window dilation."""

    reducer: str
    window: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    base_dilation: tuple[int, ...]
    window_dilation: tuple[int, ...]


def lower_reduce_window(site: WindowSite, x: int, shape: tuple[int, ...],
                        out_shape: tuple[int, ...], rw: ReduceWindow, init: int,
                        where: tuple[str, int | None]) -> int:
    """The reduce-window's result, of `out_shape`, as IR ops emitted through `site`;
    `init` is a scalar tensor holding the reducer's identity (the caller checks it),
    the padding value."""
    k = len(shape)
    if rw.reducer not in _REDUCE:
        raise UnknownOpError(f"reduce-window with reducer {rw.reducer}: supported "
                             f"{', '.join(sorted(_REDUCE))}", *where)
    per_dim = (rw.window, rw.strides, rw.padding, rw.base_dilation, rw.window_dilation)
    if any(len(v) != k for v in per_dim) or \
            any(v < 1 for v in rw.window + rw.strides + rw.base_dilation + rw.window_dilation):
        raise InputError(f"reduce-window attributes do not fit an operand of rank {k}: {rw}",
                         *where)
    pads = tuple((lo, hi, bd - 1) for (lo, hi), bd in zip(rw.padding, rw.base_dilation))
    sizes = out_sizes(shape, rw.window, rw.strides, pads, rw.window_dilation)
    if sizes != tuple(out_shape):
        raise InputError(f"reduce-window result {tuple(out_shape)} does not fit operand "
                         f"{shape} and {rw}", *where)
    if 0 in sizes or 0 in shape:
        raise UnknownOpError(f"reduce-window with an empty dim: operand {shape}", *where)
    tiled = rw.strides == rw.window and all(lo >= 0 and hi >= 0 and it == 0 for lo, hi, it in pads) \
        and all(v == 1 for v in rw.window_dilation)
    if tiled:   # padded, cut to whole windows, split into (windows, window), reduced
        t, ps = padded(site, x, shape, pads, (0,) * k, init)
        used = tuple(o * w for o, w in zip(sizes, rw.window))
        t = slice_(site, t, ps, (0,) * k, used)
        split, axes = [], []
        for o, w in zip(sizes, rw.window):
            split.append(o)
            if w > 1:
                axes.append(len(split))
                split.append(w)
        t = reshape(site, t, used, tuple(split))
        if not axes:
            return t
        return site.emit(_REDUCE[rw.reducer], [t], tuple(sizes), {"axes": tuple(axes)})
    extra = extra_high(shape, rw.window, sizes, rw.strides, pads, rw.window_dilation)
    xp, ps = padded(site, x, shape, pads, extra, init)
    rows = [window_rows(site, xp, ps, tuple(t * wd for t, wd in zip(tap, rw.window_dilation)),
                        sizes, rw.strides)
            for tap in itertools.product(*(range(w) for w in rw.window))]
    return balanced(site, rw.reducer, rows, sizes)
