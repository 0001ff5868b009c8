"""Convolutions (`lax.conv_general_dilated`, HLO `convolution`) expanded into their
definition in existing IR ops, so every rule family that relates pads, slices,
reshapes, dots and adds relates convolutions too, and the shared evaluator checks
the same ops the rules read. Both frontends parse their attributes into one
`ConvSpec` and call `lower_conv`.

The definition (XLA's operation semantics), with the operand laid out as
x[n, c, s...] and the kernel as w[o, i, k...]:

    xp = x with lo/hi padding and (lhs_dilation - 1) zeros between elements
    out[n, o, p...] = sum over taps t... and i of
                      xp[n, g*I + i, p*stride + t*rhs_dilation] * w[o, i, t]

where g is o's feature group (feature_group_count groups: input features I per
group, output features O/G per group); with batch_group_count B the batch is
split into B groups instead, output feature group b reading batch group b. So:
one dot per kernel tap, of a slice of the padded operand with that tap's weights,
summed over the taps. A stride s reads every s-th element: the tap's slice is cut
to out*s elements (after zeros appended at the high end, which no tap reads),
split into (out, s) and its first column kept, all slices of stride 1, which is
what the layout rules relate. Windows that tile the operand (stride = window, no
padding or dilation: a ViT patch embedding) are one dot of the operand split into
(patches, window). With fewer output positions than taps (a kernel gradient),
the windows of all positions are stacked and contracted with the whole kernel
in one dot (im2col). Which form a convolution takes depends on its sizes, so both
programs must see the same choice. Each step is an identity over the reals;
tests/test_conv.py checks the expansion against `lax.conv_general_dilated`
numerically. The window pieces (padding, strided rows) are dlverify/window_lowering.py's.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from dlverify.errors import InputError, UnknownOpError
from dlverify.window_lowering import (WindowSite, balanced, extra_high, out_sizes, padded, reshape,
                                      slice_, transpose, window_rows)

@dataclass(frozen=True)
class ConvSpec:
    """A convolution's attributes, one entry per spatial dim where per-dim.
    lhs_spec: (batch dim, feature dim, spatial dims...) of the operand; rhs_spec:
    (output feature dim, input feature dim, spatial dims...) of the kernel;
    out_spec: (batch dim, feature dim, spatial dims...) of the result (JAX's
    ConvDimensionNumbers; HLO's dim_labels)."""

    lhs_spec: tuple[int, ...]
    rhs_spec: tuple[int, ...]
    out_spec: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    feature_group_count: int = 1
    batch_group_count: int = 1


def _check(spec: ConvSpec, x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...],
           where: tuple[str, int | None]) -> tuple[int, ...]:
    """The output's spatial sizes, after checking the attributes fit the shapes."""
    k = len(x) - 2
    per_dim = (spec.strides, spec.padding, spec.lhs_dilation, spec.rhs_dilation)
    if len(w) != k + 2 or len(out) != k + 2 or any(len(v) != k for v in per_dim) or \
            sorted(spec.lhs_spec) != list(range(k + 2)) or \
            sorted(spec.rhs_spec) != list(range(k + 2)) or \
            sorted(spec.out_spec) != list(range(k + 2)):
        raise InputError(f"convolution with inconsistent dims: operand {x}, kernel {w}, "
                             f"result {out}, {spec}", *where)
    if any(v < 1 for v in spec.strides + spec.lhs_dilation + spec.rhs_dilation):
        raise InputError(f"convolution with a stride or dilation below 1: {spec}", *where)
    G, B = spec.feature_group_count, spec.batch_group_count
    n, c, o, i = x[0], x[1], w[0], w[1]
    if G < 1 or B < 1 or (G > 1 and B > 1) or c != i * G or o % (G * B) or n % B:
        raise InputError(f"convolution groups do not fit: {G} feature groups, {B} batch "
                             f"groups, operand {x}, kernel {w}", *where)
    sizes = out_sizes(x[2:], w[2:], spec.strides, _pads(spec), spec.rhs_dilation)
    want = (n // B, o) + tuple(sizes)
    if tuple(out[p] for p in spec.out_spec) != want:
        raise InputError(f"convolution result {out} does not fit operand {x}, kernel {w} "
                             f"and {spec}", *where)
    return tuple(sizes)


def _pads(spec: ConvSpec) -> tuple[tuple[int, int, int], ...]:
    """(lo, hi, interior) of each spatial dim."""
    return tuple((lo, hi, ld - 1) for (lo, hi), ld in zip(spec.padding, spec.lhs_dilation))


def _padded(site: WindowSite, x: int, shape: tuple[int, ...], spec: ConvSpec,
            extra: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """The operand, in its own layout (spatial dim d is dim lhs_spec[2 + d]: a halo
    exchange pads or concatenates in that layout), zero-padded with its padding,
    lhs dilation and `extra` zeros at the high end of each spatial dim."""
    pads = [(0, 0, 0)] * len(shape)
    more = [0] * len(shape)
    for d, dim in enumerate(spec.lhs_spec[2:]):
        pads[dim] = _pads(spec)[d]
        more[dim] = extra[d]
    return padded(site, x, shape, tuple(pads), tuple(more), site.scalar(0.0))


def _tap_rows(site: WindowSite, xp: int, shape: tuple[int, ...], tap: tuple[int, ...],
              spec: ConvSpec, sizes: tuple[int, ...]) -> int:
    """The padded operand's elements one tap reads: [n, c, out...], every stride-th."""
    start = (0, 0) + tuple(t * rd for t, rd in zip(tap, spec.rhs_dilation))
    return window_rows(site, xp, shape, start, shape[:2] + sizes, (1, 1) + spec.strides)


def _dot(site: WindowSite, xt: int, wt: int, n: int, c: int, o: int, i: int,
         sizes: tuple[int, ...], win: tuple[int, ...], G: int, B: int) -> tuple[int, tuple[int, ...]]:
    """xt [n, c, out..., win...] times wt [o, i, win...], contracting the input
    features and the window dims (one tap: no window; one output position: no out
    dims), in the dot's own output layout."""
    k, m = len(sizes), len(win)
    if G == 1 and B == 1:   # -> [n, out..., o]
        out = (n,) + sizes + (o,)
        return site.emit("dot_general", [xt, wt], out, {
            "lhs_contract": (1,) + tuple(2 + k + j for j in range(m)),
            "rhs_contract": (1,) + tuple(2 + j for j in range(m)),
            "lhs_batch": (), "rhs_batch": ()}), out
    if G > 1:   # [n, G, i, out..., win...] x [G, o/G, i, win...] -> [G, n, out..., o/G]
        xs = reshape(site, xt, (n, c) + sizes + win, (n, G, i) + sizes + win)
        ws = reshape(site, wt, (o, i) + win, (G, o // G, i) + win)
        out = (G, n) + sizes + (o // G,)
        return site.emit("dot_general", [xs, ws], out, {
            "lhs_contract": (2,) + tuple(3 + k + j for j in range(m)),
            "rhs_contract": (2,) + tuple(3 + j for j in range(m)),
            "lhs_batch": (1,), "rhs_batch": (0,)}), out
    # batch groups: [B, n/B, c, out..., win...] x [B, o/B, i, win...] -> [B, n/B, out..., o/B]
    xs = reshape(site, xt, (n, c) + sizes + win, (B, n // B, c) + sizes + win)
    ws = reshape(site, wt, (o, i) + win, (B, o // B, i) + win)
    out = (B, n // B) + sizes + (o // B,)
    return site.emit("dot_general", [xs, ws], out, {
        "lhs_contract": (2,) + tuple(3 + k + j for j in range(m)),
        "rhs_contract": (2,) + tuple(3 + j for j in range(m)),
        "lhs_batch": (0,), "rhs_batch": (0,)}), out


def _canonical(site: WindowSite, y: int, shape: tuple[int, ...], n: int, o: int,
               sizes: tuple[int, ...], G: int, B: int) -> int:
    """The summed taps as [n', o, out...] (n' = n / B)."""
    k = len(sizes)
    if G == 1 and B == 1:   # [n, out..., o]
        y, _ = transpose(site, y, shape, (0, k + 1) + tuple(range(1, k + 1)))
        return y
    if G > 1:   # [G, n, out..., o/G] -> [n, G, o/G, out...]
        y, sh = transpose(site, y, shape, (1, 0, k + 2) + tuple(range(2, k + 2)))
        return reshape(site, y, sh, (n, o) + sizes)
    # [B, n/B, out..., o/B] -> [n/B, B, o/B, out...]
    y, sh = transpose(site, y, shape, (1, 0, k + 2) + tuple(range(2, k + 2)))
    return reshape(site, y, sh, (n // B, o) + sizes)


def _patches(site: WindowSite, x: int, xs: tuple[int, ...], w: int, ws: tuple[int, ...],
             sizes: tuple[int, ...]) -> int:
    """Windows that tile the operand: x [n, c, s...] cut to out*k and split into
    (out, k) per spatial dim, contracted with w [o, i, k...] over (c, k...) in one
    dot: [n, out..., o]."""
    kern = ws[2:]
    used = xs[:2] + tuple(o * kk for o, kk in zip(sizes, kern))
    x = slice_(site, x, xs, (0,) * len(xs), used)
    split = xs[:2] + tuple(v for o, kk in zip(sizes, kern) for v in (o, kk))
    x = reshape(site, x, used, split)
    k = len(sizes)
    out = (xs[0],) + sizes + (ws[0],)
    return site.emit("dot_general", [x, w], out, {
        "lhs_contract": (1,) + tuple(3 + 2 * d for d in range(k)),
        "rhs_contract": (1,) + tuple(2 + d for d in range(k)),
        "lhs_batch": (), "rhs_batch": ()})


def _taps(site: WindowSite, xp: int, ps: tuple[int, ...], w: int, ws: tuple[int, ...],
          spec: ConvSpec, sizes: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """The sum over kernel taps of each tap's dot (rows of the padded operand), a
    balanced tree of adds."""
    n, c, o, i, k = ps[0], ps[1], ws[0], ws[1], len(sizes)
    G, B = spec.feature_group_count, spec.batch_group_count
    dots, ys = [], ()
    for tap in itertools.product(*(range(kk) for kk in ws[2:])):
        xt = _tap_rows(site, xp, ps, tap, spec, sizes)
        wt = slice_(site, w, ws, (0, 0) + tap, (o, i) + tuple(t + 1 for t in tap))
        wt = reshape(site, wt, (o, i) + (1,) * k, (o, i))
        d, ys = _dot(site, xt, wt, n, c, o, i, sizes, (), G, B)
        dots.append(d)
    y = balanced(site, "add", dots, ys)
    return _canonical(site, y, ys, n, o, sizes, G, B), ys


def _positions(site: WindowSite, xp: int, ps: tuple[int, ...], w: int, ws: tuple[int, ...],
               spec: ConvSpec, sizes: tuple[int, ...]) -> int:
    """The windows of every output position (contiguous: no kernel dilation)
    stacked along a new leading dim, contracted with the whole kernel in one dot
    (im2col). Chosen when there are fewer positions than taps: in a kernel
    gradient, whose window is the forward's output, a rank's share of the forward's
    batch and positions is then a contracted block of one dot, a partial sum the
    rules follow like any dot's."""
    n, c, o, i = ps[0], ps[1], ws[0], ws[1]
    G, B = spec.feature_group_count, spec.batch_group_count
    win = ws[2:]
    m = len(win)
    # each window with its batch or feature dim split by group (a row of the stacked
    # operand): the stack is then the dot's operand itself, whose positions the rewrites
    # split into one dot each (rewrites.py), as they split an ungrouped convolution's.
    # A batch group of one is not written: the batch dim is the group dim (a depthwise
    # kernel gradient, as XLA computes it: each channel's dot batched over the channel)
    nb, ob = int(n // B > 1), int(o // B > 1)
    row = (n, G, i) if G > 1 else (B,) + (n // B,) * nb + (c,) if B > 1 else (n, c)
    rows = []
    for pos in itertools.product(*(range(q) for q in sizes)):
        start = (0, 0) + tuple(p * st for p, st in zip(pos, spec.strides))
        limit = (n, c) + tuple(a + kk for a, kk in zip(start[2:], win))
        xt = slice_(site, xp, ps, start, limit)
        rows.append(reshape(site, xt, (n, c) + win, (1,) + row + win))
    P = len(rows)
    x = rows[0] if P == 1 else site.emit("concatenate", rows, (P,) + row + win, {"dimension": 0})
    if G == 1 and B == 1:   # [P, n, c, win] x [o, i, win] -> [P, n, o] -> [n, o, P]
        y = site.emit("dot_general", [x, w], (P, n, o), {
            "lhs_contract": (2,) + tuple(3 + j for j in range(m)),
            "rhs_contract": (1,) + tuple(2 + j for j in range(m)), "lhs_batch": (), "rhs_batch": ()})
        y, _ = transpose(site, y, (P, n, o), (1, 2, 0))
        return reshape(site, y, (n, o, P), (n, o) + sizes)
    if G > 1:   # [P, n, G, i, win] x [G, o/G, i, win] -> [G, P, n, o/G] -> [n, G, o/G, P]
        wg = reshape(site, w, (o, i) + win, (G, o // G, i) + win)
        out = (G, P, n, o // G)
        y = site.emit("dot_general", [x, wg], out, {
            "lhs_contract": (3,) + tuple(4 + j for j in range(m)),
            "rhs_contract": (2,) + tuple(3 + j for j in range(m)), "lhs_batch": (2,), "rhs_batch": (0,)})
        y, sh = transpose(site, y, out, (2, 0, 3, 1))
        return reshape(site, y, sh, (n, o) + sizes)
    # [P, B, n/B, c, win] x [B, o/B, i, win] -> [B, P, n/B, o/B] -> [n/B, B, o/B, P]
    # (n/B and o/B only when above 1)
    wb = reshape(site, w, (o, i) + win, (B,) + (o // B,) * ob + (i,) + win)
    out = (B, P) + (n // B,) * nb + (o // B,) * ob
    y = site.emit("dot_general", [x, wb], out, {
        "lhs_contract": (2 + nb,) + tuple(3 + nb + j for j in range(m)),
        "rhs_contract": (1 + ob,) + tuple(2 + ob + j for j in range(m)),
        "lhs_batch": (1,), "rhs_batch": (0,)})
    y, sh = transpose(site, y, out, (2,) * nb + (0,) + (2 + nb,) * ob + (1,))
    return reshape(site, y, sh, (n // B, o) + sizes)


def lower_conv(site: WindowSite, lhs: int, lhs_shape: tuple[int, ...], rhs: int,
               rhs_shape: tuple[int, ...], out_shape: tuple[int, ...], spec: ConvSpec,
               where: tuple[str, int | None]) -> int:
    """The convolution's result, of `out_shape`, as IR ops emitted through `site`.
    `where` (file, line) names the instruction in errors."""
    xs = tuple(lhs_shape[p] for p in spec.lhs_spec)
    w, ws = transpose(site, rhs, rhs_shape, spec.rhs_spec)
    sizes = _check(spec, xs, ws, tuple(out_shape), where)
    k = len(sizes)
    n, o = xs[0], ws[0]
    G, B = spec.feature_group_count, spec.batch_group_count
    if 0 in xs or 0 in ws or 0 in sizes:
        raise UnknownOpError(f"convolution with an empty dim: operand {xs}, kernel {ws}", *where)
    plain = all(p == (0, 0) for p in spec.padding) and \
        all(v == 1 for v in spec.lhs_dilation + spec.rhs_dilation)
    if plain and G == 1 and B == 1 and k and tuple(spec.strides) == ws[2:]:
        x, _ = transpose(site, lhs, lhs_shape, spec.lhs_spec)
        y = _patches(site, x, xs, w, ws, sizes)
        y = _canonical(site, y, (n,) + sizes + (o,), n, o, sizes, G, B)
    else:
        # zeros at the high end so every tap's cut of out*stride elements fits
        extra = extra_high(xs[2:], ws[2:], sizes, spec.strides, _pads(spec), spec.rhs_dilation)
        xp, ps = _padded(site, lhs, tuple(lhs_shape), spec, extra)
        xp, ps = transpose(site, xp, ps, spec.lhs_spec)
        if math.prod(sizes) < math.prod(ws[2:]) and all(rd == 1 for rd in spec.rhs_dilation):
            y = _positions(site, xp, ps, w, ws, spec, sizes)
        else:
            y, _ = _taps(site, xp, ps, w, ws, spec, sizes)
    # [n', o, out...] -> the result's layout: out dim out_spec[j] holds canonical dim j
    inv = [0] * (k + 2)
    for j, d in enumerate(spec.out_spec):
        inv[d] = j
    y, _ = transpose(site, y, (n // B, o) + sizes, tuple(inv))
    return y
