"""Max (min) pooling's gradient as XLA's select-and-scatter expander writes it
(XLA CPU and GPU rewrite every `select-and-scatter` before codegen):

    (v, p_0, .., p_k) = reduce-window((x, iota_0, .., iota_k), (init, s, .., s))
    out = scatter-add(base, concat(reshape(p_j)...), reshape(source))

The reduce-window carries, beside the values, the position of the element each
window selects (one iota per dim of x), with `s` (e.g. -1, out of range) as
"nothing selected yet"; its reducer keeps the accumulated pair unless that is
`s` or `select(acc, candidate)` fails. The scatter then adds each window's
source element at the selected position.

1. `variadic_reduce_window` lowers the reduce-window exactly, through the scan of
   dlverify/select_scatter.py: the values are the scan's final values, each
   carried operand the element at the offset the scan ends on. The reducer is
   recognised by evaluating it on probe values (frontends/hlo/comparator.py),
   never by its text. It is not order-independent (ties keep the accumulator):
   the row-major order of window offsets, the accumulator first, is assumed and
   listed in the report (the order XLA's expander relies on).
2. `fold_selection_scatter` recognises a scatter-add whose indices are those
   positions laid out by data movement only (reshape, transpose, concatenate,
   slice, ...) and whose updates are a tensor of the windows' shape laid out the
   same way: it is `base + select_and_scatter(x, source)`, lowered as the HLO
   `select-and-scatter` is, so both programs have one form whether XLA expanded
   it or not. Which window each index row and each update comes from is found by
   evaluating the movement ops (the shared evaluator) on distinct codes, not by
   matching their shapes; anything else keeps the scatter's own lowering (a
   one-hot contraction of the exact positions), which is exact too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import ints, parse_window
from dlverify.frontends.hlo.comparator import evaluate_scalar_computation, key_values
from dlverify.frontends.hlo.model import HloComputation, HloInstruction, np_dtype
from dlverify.frontends.hlo.ops.argreduce import is_iota_along
from dlverify.frontends.hlo.ops.select_scatter import select_site
from dlverify.ir import Op, SourceLoc, is_float_dtype
from dlverify.ops.dtypes import is_int_dtype
from dlverify.ops.evaluate import evaluate
from dlverify.select_scatter import (SELECTS, SelectWindow, lower_select_and_scatter, scan_windows,
                                     selected_payload)
from dlverify.window_lowering import out_sizes

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer

# ops whose every output element is a copy of one input element, at a position
# that does not depend on values: the layouts between the positions and the scatter
_MOVES = frozenset({"reshape", "transpose", "concatenate", "slice", "rev", "broadcast_in_dim"})

_COMPARE = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less}


@dataclass(frozen=True)
class WindowSelection:
    """A recognised reduce-window: the scanned operand `x`, its windows, the dim
    each carried operand is an iota along, and the carried results' tensor ids."""

    x: int
    shape: tuple[int, ...]
    dtype: str
    window: SelectWindow
    sizes: tuple[int, ...]
    iota_dims: tuple[int, ...]
    positions: tuple[int, ...]


def _select_of(L: Lowerer, ins: HloInstruction, vdt: str, idt: str, n: int,
               sentinel: int) -> str | None:
    """The select (one of SELECTS) the reducer follows, or None: on every probe
    (values: the type's extremes, zeros, NaN; positions: `sentinel` or not, on
    either side) it must give exactly the scan's step."""
    cname = (ins.attrs.get("to_apply") or "").strip().lstrip("%")
    comp = L.m.computations.get(cname)
    if comp is None:
        raise L.err(ins, "reduce-window without a to_apply computation")
    vals = list(key_values(vdt))
    if is_float_dtype(vdt):
        vals.append(np.array(np.nan, dtype=vals[0].dtype))
    real = [v for v in (0, 1, 2, 3) if v != sentinel][:2]
    rows = [(a, b, ls, rs) for a in vals for b in vals for ls in (False, True) for rs in (False, True)]
    a = np.array([r[0] for r in rows], dtype=np_dtype(vdt))
    b = np.array([r[1] for r in rows], dtype=np_dtype(vdt))
    ls = np.array([r[2] for r in rows])
    rs = np.array([r[3] for r in rows])
    ia = np.where(ls, sentinel, real[0]).astype(np_dtype(idt))
    ib = np.where(rs, sentinel, real[1]).astype(np_dtype(idt))
    cols = [a] + [ia] * n + [b] + [ib] * n
    out = evaluate_scalar_computation(L, ins, comp, [vdt] + [idt] * n + [vdt] + [idt] * n,
                                      [list(c) for c in cols], "reducer")
    if len(out) != n + 1:
        return None
    for select in SELECTS:
        with np.errstate(invalid="ignore"):
            keep = rs | (~ls & _COMPARE[select](a.astype(np.float64), b.astype(np.float64)))
        want_v, want_i = np.where(keep, a, b), np.where(keep, ia, ib)
        if np.array_equal(out[0].astype(np.float64), want_v.astype(np.float64), equal_nan=True) \
                and all(np.array_equal(o.astype(np.int64), want_i.astype(np.int64))
                        for o in out[1:]):
            return select
    return None


def variadic_reduce_window(L: Lowerer, ins: HloInstruction, ops: list, comp: HloComputation,
                           loc: SourceLoc) -> tuple:
    """The results of a reduce-window over (values, iotas) that selects an element
    per window as select-and-scatter does (the module docstring)."""
    refuse = ("variadic (tuple) reduce-window is supported as a windowed selection over "
              "(values, iotas) (XLA's select-and-scatter expander)")
    n = len(ops) // 2 - 1
    res = ins.shape.elements if ins.shape.is_tuple else []
    if n < 1 or len(ops) != 2 * (n + 1) or len(res) != n + 1:
        raise L.unknown(ins, f"{refuse}; this one has {len(ops)} operands")
    tids = [L.tid(ins, v) for v in ops]
    x, carried, x_init, inits = tids[0], tids[1:n + 1], tids[n + 1], tids[n + 2:]
    shape, vdt = L.shape_of(x), L.dtype_of(x)
    idt = L.dtype_of(carried[0])
    win = parse_window(ins.attrs.get("window"), len(shape))
    if any(v != 1 for k in ("lhs_dilate", "rhs_dilate") for v in win[k]) or \
            any(win["rhs_reversal"]) or any(lo < 0 or hi < 0 for lo, hi in win["pad"]):
        raise L.unknown(ins, f"{refuse}; this one has dilation, reversal or negative padding")
    known = [L.known.get(t) for t in inits]
    if any(v is None or np.shape(v) != () for v in known) or \
            len({np.asarray(v).item() for v in known}) != 1 or key_values(vdt) is None:
        raise L.unknown(ins, f"{refuse}; the carried operands' inits are not one known scalar")
    sentinel = int(np.asarray(known[0]).item())
    dims = []
    for t in carried:
        d = next((d for d in range(len(shape)) if L.shape_of(t) == shape and
                  is_iota_along(L, t, d)), None)
        if d is None or L.dtype_of(t) != idt or not is_int_dtype(idt) or 0 <= sentinel < shape[d]:
            raise L.unknown(ins, f"{refuse}; a carried operand is not an iota of {list(shape)}, "
                                 f"or the init {sentinel} is a position in it")
        dims.append(d)
    select = _select_of(L, ins, vdt, idt, n, sentinel)
    if select is None:
        raise L.unknown(ins, f"{refuse}; its reducer does not keep the accumulated element "
                             f"while a GE, GT, LE or LT compare holds and the init {sentinel} "
                             f"marks nothing selected")
    sw = SelectWindow(select, tuple(win["size"]), tuple(win["stride"]),
                      tuple(tuple(p) for p in win["pad"]))
    sizes = out_sizes(shape, sw.window, sw.strides, tuple((lo, hi, 0) for lo, hi in sw.padding),
                      (1,) * len(shape))
    if any(r.dims != sizes for r in res) or res[0].dtype != vdt or \
            any(r.dtype != idt for r in res[1:]) or 0 in sizes:
        raise L.err(ins, f"reduce-window of {vdt}{list(shape)} over windows {list(sizes)} "
                         f"declares the result {ins.shape}")
    L.assume(f"reduce-window {ins.name} ({L.file}:{ins.line}): among equal elements its "
             f"reducer keeps the one it met first; XLA is assumed to visit each window's "
             f"elements in row-major order, the accumulator first (as its select-and-scatter "
             f"expander does)")
    site = select_site(L, ins, loc)
    scan = scan_windows(site, x, shape, vdt, sw, sizes)
    values = scan.value
    if scan.seen is not None:
        fill = L.emit("broadcast_in_dim", [x_init], sizes, vdt, {"broadcast_dimensions": ()},
                      loc, ins.name)
        values = L.emit("select_n", [scan.seen, fill, values], sizes, vdt, {}, loc, ins.name)
    positions = tuple(selected_payload(site, scan, t, shape, idt, sw.strides, inits[0])
                      for t in carried)
    sel = WindowSelection(x, shape, vdt, sw, sizes, tuple(dims), positions)
    for j, t in enumerate(positions):
        L.window_selections[t] = (sel, j)
    return (values,) + positions


def _moved(producer: dict[int, Op], t: int, leaf) -> list[Op] | None:
    """The data-movement ops from the tensors `leaf` accepts to t (inputs first),
    or None when t is reached otherwise."""
    order: list[Op] = []
    seen: set[int] = set()

    def visit(u: int) -> bool:
        if u in seen or leaf(u):
            return True
        op = producer.get(u)
        if op is None or op.kind not in _MOVES or not all(visit(i) for i in op.inputs):
            return False
        seen.add(u)
        order.append(op)
        return True
    return order if visit(t) else None


def _evaluated(L: Lowerer, ops: list[Op], codes: dict[int, np.ndarray], t: int) -> np.ndarray:
    vals = dict(codes)
    for op in ops:
        out = L.b.graph.tensors[op.output]
        vals[op.output] = evaluate(op.kind, op.params, [vals[i] for i in op.inputs], out.shape,
                                   "int64")
    return np.asarray(vals[t])


def _window_of_rows(L: Lowerer, ins: HloInstruction, idx: int, ivd: int,
                    K: tuple[int, ...]) -> tuple[WindowSelection, np.ndarray] | None:
    """(the selection, the window of every index row in row-major order of the
    index batch dims) when idx is the selection's positions moved into place."""
    producer = {op.output: op for op in L.b.graph.ops}
    ops = _moved(producer, idx, lambda u: u in L.window_selections)
    if ops is None:
        return None
    leaves = {i for op in ops for i in op.inputs if i in L.window_selections} or \
        ({idx} if idx in L.window_selections else set())
    sels = {L.window_selections[u][0] for u in leaves}
    if len(sels) != 1:
        return None
    sel = sels.pop()
    J, cells = len(sel.positions), int(np.prod(sel.sizes))
    grid = np.arange(cells, dtype=np.int64).reshape(sel.sizes)
    codes = {u: grid * J + L.window_selections[u][1] for u in leaves}
    rows = _evaluated(L, ops, codes, idx)
    rows = rows[..., None] if ivd == rows.ndim else np.moveaxis(rows, ivd, -1)
    rows = rows.reshape(-1, rows.shape[-1])
    if rows.shape[1] != len(K) or len(rows) != cells:
        return None
    cols, window = rows % J, rows[:, 0] // J     # (which position, which window) per entry
    if not (cols == cols[0]).all() or any(sel.iota_dims[j] != k for j, k in zip(cols[0], K)) \
            or not (rows // J == window[:, None]).all() \
            or not np.array_equal(np.sort(window), np.arange(cells)):
        return None
    return sel, window


def _source_of(L: Lowerer, upd: int, scatter_dims: list[int], sel: WindowSelection,
               window: np.ndarray, dtype: str) -> int | None:
    """A tensor of the windows' shape that the updates move into place, row n of
    the updates holding its element of window `window[n]`."""
    producer = {op.output: op for op in L.b.graph.ops}
    cands, t = [], upd
    while True:
        if L.shape_of(t) == sel.sizes and L.dtype_of(t) == dtype:
            cands.append(t)
        op = producer.get(t)
        if op is None or op.kind not in _MOVES or len(op.inputs) != 1:
            break
        t = op.inputs[0]
    for s in cands:
        ops = _moved(producer, upd, lambda u, s=s: u == s)
        grid = np.arange(int(np.prod(sel.sizes)), dtype=np.int64).reshape(sel.sizes)
        got = _evaluated(L, ops, {s: grid}, upd)
        rest = [d for d in range(got.ndim) if d not in scatter_dims]
        got = np.transpose(got, scatter_dims + rest).reshape(len(window), -1)
        if got.shape[1] == 1 and np.array_equal(got[:, 0], window):
            return s
    return None


def fold_selection_scatter(L: Lowerer, ins: HloInstruction, operand: int, idx: int, upd: int,
                           loc: SourceLoc) -> int | None:
    """`operand + select_and_scatter(x, source)` when this scatter-add puts each
    window's source element at the position a recognised reduce-window selected
    in it (the module docstring); None when it does not."""
    if not L.window_selections or ins.attrs.get("input_batching_dims") or \
            ins.attrs.get("scatter_indices_batching_dims"):
        return None
    O = L.shape_of(operand)
    K = ints(ins.attrs.get("scatter_dims_to_operand_dims"))
    windows = ints(ins.attrs.get("update_window_dims"))
    ivd_attr = ints(ins.attrs.get("index_vector_dim"))
    ivd = ivd_attr[0] if ivd_attr else len(L.shape_of(idx))
    U = L.shape_of(upd)
    if sorted(K) != list(range(len(O))) or any(U[w] != 1 for w in windows):
        return None
    found = _window_of_rows(L, ins, idx, ivd, tuple(K))
    if found is None:
        return None
    sel, window = found
    dtype = L.array_shape(ins).dtype
    if sel.shape != O or L.dtype_of(operand) != dtype:
        return None
    source = _source_of(L, upd, [d for d in range(len(U)) if d not in windows], sel, window,
                        dtype)
    if source is None:
        return None
    out = lower_select_and_scatter(select_site(L, ins, loc), sel.x, sel.shape, sel.dtype, source,
                                   sel.sizes, dtype, None, sel.window, (L.file, ins.line))
    base = L.known.get(operand)
    if base is not None and not np.asarray(base).any():
        return out
    return L.emit("add", [operand, out], O, dtype, {}, loc, ins.name)
