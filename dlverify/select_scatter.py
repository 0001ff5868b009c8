"""Select-and-scatter (the gradient of max and min pooling: jaxpr
`select_and_scatter_add`, HLO `select-and-scatter`) expanded into existing IR
ops, shared by both frontends.

XLA's semantics: every window position p of the operand x (window, stride,
padding as in reduce-window, no dilation) selects one element by scanning the
window's valid offsets (padding is never selected) in row-major order, keeping
the element selected so far while `select(selected, candidate)` holds and
taking the candidate otherwise; source[p] is then scattered (added) onto the
selected position of a result that starts at `init` everywhere. A window with
no valid offset selects nothing.

The expansion follows that scan exactly, one elementwise step per window offset
t, over all window positions at once (row_t = the strided slice of the padded
operand that offset t reads, as window_lowering.window_rows cuts it):

    take_t = valid_t and (nothing valid before t, or not select(cur, row_t))
    cur    = take_t ? row_t : cur
    sel_t  = take_t and no later take      (the offset the scan ends on)
    out    = init + sum_t place_t(sel_t ? source : 0)

place_t puts position p at p * stride + t - lo of the operand: a pad with
interior padding stride - 1, cropped where negative. valid_t, whether offset t
of each position lies inside the operand, is a constant over the padded dims
only (broadcast along the others), so sharded batch and channel dims never meet
a constant of their size. Any select comparison is followed as it is (ties keep
the first maximum for `ge`, the last for `gt`; NaN as the comparison treats it),
so the expansion is exact, not only over the reals. tests/test_select_scatter.py
checks it against JAX and XLA on random data with ties, padding and overlap.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dlverify.errors import InputError, UnknownOpError
from dlverify.window_lowering import (WindowSite, balanced, extra_high, out_sizes, padded,
                                      window_rows)

# (kind, inputs, shape, dtype, params) -> the new op's result, at the op's location
Emit = Callable[[str, list[int], tuple[int, ...], str, dict], int]

SELECTS = ("ge", "gt", "le", "lt")   # select(selected, candidate): keep the selected one


@dataclass(frozen=True)
class SelectSite:
    """How to emit an op (in any dtype) and a known constant (values converted
    to the given IR dtype) at the select-and-scatter's location."""

    emit: Emit
    constant: Callable[[np.ndarray, str], int]


@dataclass(frozen=True)
class SelectWindow:
    """A select-and-scatter's comparison (one of SELECTS, selected vs candidate)
    and, per dim, window size, stride and (lo, hi) padding."""

    select: str
    window: tuple[int, ...]
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]


def at_dtype(site: SelectSite, dtype: str) -> WindowSite:
    """The window pieces' site (window_lowering) that emits through `site` in `dtype`."""
    return WindowSite(lambda kind, ins, shape, params: site.emit(kind, ins, shape, dtype, params),
                      lambda value: site.constant(np.asarray(value), dtype))


def _valid(site: SelectSite, shape: tuple[int, ...], sizes: tuple[int, ...], sw: SelectWindow,
           tap: tuple[int, ...]) -> int | None:
    """Whether offset `tap` of each window position lies inside the operand: None
    when it always does, else a pred tensor of `sizes`, a constant over the dims
    where it does not (broadcast along the rest)."""
    dims, rows = [], []
    for d, (n, o, s, (lo, _), t) in enumerate(zip(shape, sizes, sw.strides, sw.padding, tap)):
        idx = np.arange(o) * s + t - lo
        ok = (idx >= 0) & (idx < n)
        if not ok.all():
            dims.append(d)
            rows.append(ok)
    if not dims:
        return None
    mask = rows[0]
    for r in rows[1:]:
        mask = np.logical_and.outer(mask, r)
    c = site.constant(mask, "bool")
    return site.emit("broadcast_in_dim", [c], sizes, "bool",
                     {"broadcast_dimensions": tuple(dims)})


def _check(shape: tuple[int, ...], src_shape: tuple[int, ...], sw: SelectWindow,
           where: tuple[str, int | None]) -> tuple[int, ...]:
    k = len(shape)
    if sw.select not in SELECTS:
        raise UnknownOpError(f"select-and-scatter selecting by {sw.select}: supported "
                             f"{', '.join(SELECTS)}", *where)
    if any(len(v) != k for v in (sw.window, sw.strides, sw.padding)) or \
            any(v < 1 for v in sw.window + sw.strides):
        raise InputError(f"select-and-scatter attributes do not fit an operand of rank {k}: {sw}",
                         *where)
    if any(lo < 0 or hi < 0 for lo, hi in sw.padding):
        raise UnknownOpError("select-and-scatter with negative padding", *where)
    sizes = out_sizes(shape, sw.window, sw.strides, tuple((lo, hi, 0) for lo, hi in sw.padding),
                      (1,) * k)
    if sizes != tuple(src_shape):
        raise InputError(f"select-and-scatter source {tuple(src_shape)} does not fit operand "
                         f"{shape} and {sw} (windows {sizes})", *where)
    if 0 in sizes or 0 in shape:
        raise UnknownOpError(f"select-and-scatter with an empty dim: operand {shape}", *where)
    return sizes


@dataclass(frozen=True)
class WindowScan:
    """The scan over every window at once (the module docstring): window
    positions `sizes`; per offset in row-major order, where the scan ends on it
    (`selected`: a pred of `sizes`, None: everywhere; offsets it never ends on
    are left out); the value it ends with (`value`); and where some offset is
    valid (`seen`: None when every window has one)."""

    sizes: tuple[int, ...]
    pads: tuple[tuple[int, int, int], ...]
    extra: tuple[int, ...]
    selected: tuple[tuple[tuple[int, ...], int | None], ...]
    value: int
    seen: int | None


def scan_windows(site: SelectSite, x: int, shape: tuple[int, ...], x_dtype: str,
                 sw: SelectWindow, sizes: tuple[int, ...]) -> WindowScan:
    """Follow the select-and-scatter's scan of `x` over windows `sw` as IR ops."""
    k = len(shape)
    xs = at_dtype(site, x_dtype)

    def pred(kind: str, ins: list[int]) -> int:
        return site.emit(kind, ins, sizes, "bool", {})

    def both(a: int | None, b: int | None) -> int | None:   # None: true everywhere
        return b if a is None else a if b is None else pred("and", [a, b])

    pads = tuple((lo, hi, 0) for lo, hi in sw.padding)
    extra = extra_high(shape, sw.window, sizes, sw.strides, pads, (1,) * k)
    xp, ps = padded(xs, x, shape, pads, extra, xs.scalar(0))
    taps = list(itertools.product(*(range(w) for w in sw.window)))
    cur = seen = None     # the selected values; some offset so far is valid (None: all)
    takes: list[int | None] = []    # per offset, where the scan takes it (None: everywhere)
    for tap in taps:
        row = window_rows(xs, xp, ps, tap, sizes, sw.strides)
        valid = _valid(site, shape, sizes, sw, tap)
        if cur is None:
            take, cur, seen = valid, row, valid
        else:
            take = pred("not", [pred(sw.select, [cur, row])])
            if seen is not None:        # nothing valid selected yet: take any valid one
                take = pred("or", [take, pred("not", [seen])])
            take = both(take, valid)
            cur = site.emit("select_n", [take, cur, row], sizes, x_dtype, {})
            seen = None if seen is None or valid is None else pred("or", [seen, valid])
        takes.append(take)
    selected, later = [], None      # later: some offset after t is taken (None: none is)
    for tap, take in reversed(list(zip(taps, takes))):
        selected.append((tap, take if later is None else both(take, pred("not", [later]))))
        if take is None:
            break       # every position takes t: no earlier offset ends the scan
        later = take if later is None else pred("or", [later, take])
    return WindowScan(sizes, pads, extra, tuple(selected), cur, seen)


def lower_select_and_scatter(site: SelectSite, x: int, shape: tuple[int, ...], x_dtype: str,
                             source: int, src_shape: tuple[int, ...], dtype: str,
                             init: int | None, sw: SelectWindow,
                             where: tuple[str, int | None]) -> int:
    """The select-and-scatter's result (operand's shape, source's `dtype`) as IR ops;
    `init` is the initial value: a tensor id of a scalar, or None for zero."""
    sizes = _check(shape, src_shape, sw, where)
    k = len(shape)
    ss = at_dtype(site, dtype)
    scan = scan_windows(site, x, shape, x_dtype, sw, sizes)
    zero = ss.scalar(0)
    zeros = site.emit("broadcast_in_dim", [zero], sizes, dtype, {"broadcast_dimensions": ()})
    placed = []
    for tap, sel in scan.selected:
        part = source if sel is None else site.emit("select_n", [sel, zeros, source], sizes,
                                                    dtype, {})
        cfg = tuple((t - lo, n - (t - lo + (o - 1) * s + 1), s - 1)
                    for t, (lo, _), n, o, s in zip(tap, sw.padding, shape, sizes, sw.strides))
        placed.append(padded(ss, part, sizes, cfg, (0,) * k, zero)[0])
    out = balanced(ss, "add", placed, shape)
    if init is not None:
        out = site.emit("add", [out, site.emit("broadcast_in_dim", [init], shape, dtype,
                                               {"broadcast_dimensions": ()})], shape, dtype, {})
    return out


def selected_payload(site: SelectSite, scan: WindowScan, payload: int, shape: tuple[int, ...],
                     dtype: str, strides: tuple[int, ...], fill: int) -> int:
    """Per window, the element of `payload` (the scanned operand's shape, `dtype`)
    at the position the scan ends on; the scalar tensor `fill` where no offset of
    the window is valid (a variadic reduce-window's carried values: the positions
    XLA's select-and-scatter expander carries as iotas)."""
    ps = at_dtype(site, dtype)
    pp, psh = padded(ps, payload, shape, scan.pads, scan.extra, fill)
    zeros = site.emit("broadcast_in_dim", [ps.scalar(0)], scan.sizes, dtype,
                      {"broadcast_dimensions": ()})
    parts = []
    for tap, sel in scan.selected:
        row = window_rows(ps, pp, psh, tap, scan.sizes, strides)
        parts.append(row if sel is None else
                     site.emit("select_n", [sel, zeros, row], scan.sizes, dtype, {}))
    out = balanced(ps, "add", parts, scan.sizes)
    if scan.seen is None:
        return out
    fills = site.emit("broadcast_in_dim", [fill], scan.sizes, dtype, {"broadcast_dimensions": ()})
    return site.emit("select_n", [scan.seen, fills, out], scan.sizes, dtype, {})
