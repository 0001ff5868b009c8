"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier`
runs `merged_forms` in its pass): dims that a compiled exchange merges, taken
apart again so the ops after it read them as the program does.

XLA lays a GShard all_to_all out on merged dims: the experts' buffers
(e, g, c, d) of a rank are one [e, g*c, d] array, the exchange
(dlverify/resharding.py: an all_gather and a dynamic_slice at the rank's
offset) slices the merged g*c dim at multiples of c, and the combine einsum
contracts (g, c, e) merged into one dim of its operand, the group dim of size
1 on a rank among them, while the program keeps every dim apart and batches
over the groups. Two identities bring the merged form to the program's:

* a dynamic_slice of a reshape is the reshape of a dynamic_slice: every dim
  the slice cuts is one the reshape keeps as it is, or the leading sized dim
  of a merged run, whose start and size are whole rows of the operand's run.
  The start is proven a multiple of the row (a literal, or an element of a
  literal 1-D table: how XLA and resharding.py write a rank's offset, `T[i]`
  for any index i), and the new start is the same lookup in the table divided
  by the row. HLO clamps a start into [0, dim - size]; both bounds are whole
  rows, so clamping before or after the division gives the same rows.
* a size-1 dim merged into a contracted dim is a size-1 free dim of the dot:
  a dot operand reshape(y) whose contracted dim merges a run of y's dims with
  size-1 dims among them reads y reshaped with those size-1 dims apart (the
  element order is the same: size-1 dims do not change a row-major index),
  free dims of the dot; its result differs by size-1 dims only and is
  reshaped back. The run's sized dims then meet the other operand's
  (simplify.py: split_contraction), and a size-1 free dim of each operand
  becomes a batch dim (simplify_forms.py: unit_dims_batched).

Each an identity of data movement or of real arithmetic for every input,
applied to both graphs alike; tests/test_simplify_merged.py checks each
numerically (on several ranks for the per-rank offsets) and where it must not
fire. No rule merges a sized dim or moves a slice before a reshape, so none
undoes another.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from dlverify.ir import Op, literal_value
from dlverify.simplify_forms import _merge_groups, _unit_deletion

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier


def refinement(src: tuple[int, ...], to: tuple[int, ...]) -> tuple[int, ...] | None:
    """The coarsest shape that both `src` and `to` are merges of (runs of adjacent dims):
    a reshape src -> to that regroups (XLA's [b*s, j*d] -> [b, s*j, d]) is the reshape
    to it, splitting each dim at the other side's boundaries (prefix products), then
    the merge to `to`, row-major order kept (a chain of row-major reshapes is one).
    Size-1 dims stand alone. None when a boundary falls inside a dim it does not divide
    (no such common shape: [6] -> [4, ...])."""
    out: list[int] = []
    i = j = 0
    a, b = (src[0] if src else 1), (to[0] if to else 1)
    while i < len(src) and j < len(to):
        if a == 1 or b == 1:        # a size-1 dim stands alone
            out.append(1)
            if a == 1:
                i += 1
                a = src[i] if i < len(src) else 1
            else:
                j += 1
                b = to[j] if j < len(to) else 1
            continue
        n = min(a, b)
        if max(a, b) % n:
            return None
        out.append(n)
        a, b = a // n, b // n
        if a == 1:
            i += 1
            a = src[i] if i < len(src) else 1
        if b == 1:
            j += 1
            b = to[j] if j < len(to) else 1
    if i < len(src) or j < len(to) or math.prod(out) != math.prod(src):
        return None
    return tuple(out)


def merged_forms(s: "_Simplifier", op: Op) -> bool:
    """Whether one of this module's rules replaced `op` (in `s`'s pass)."""
    return dynamic_slice_of_reshape(s, op) or unit_dims_out_of_contraction(s, op)


def _new_constant(s: "_Simplifier", value: np.ndarray, dtype: str, like: Op) -> int:
    t = s.builder.constant(value.astype(dtype), value.shape, dtype, like.loc, like.name)
    s.producer[t] = s.out[-1]
    return t


def _exact_ratio(values: np.ndarray, num: int, den: int, dtype: str) -> np.ndarray | None:
    """values * num / den when every element is a whole number that fits `dtype`, else None."""
    scaled = values.astype(np.int64) * num
    if np.any(scaled % den):
        return None
    out = scaled // den
    info = np.iinfo(np.dtype(dtype))
    return out if np.all((out >= info.min) & (out <= info.max)) else None


def _scaled_start(s: "_Simplifier", t: int, num: int, den: int, like: Op) -> int | None:
    """A new scalar tensor holding t * num / den, when t is provably a value whose
    product by num is a multiple of den: a literal, or `reshape(dynamic_slice(T, i))`
    reading one element of a literal 1-D table T (any element, for any i: the
    index is clamped into T). None otherwise."""
    dtype = s.g.tensors[t].dtype
    if num == den:
        return t
    if not np.issubdtype(np.dtype(dtype), np.integer):
        return None
    value = literal_value(s.producer, t)
    if value is not None:
        scaled = _exact_ratio(value, num, den, dtype)
        return None if scaled is None else _new_constant(s, scaled, dtype, like)
    r = s.producer.get(t)
    pick = None if r is None or r.kind != "reshape" else s.producer.get(r.inputs[0])
    if pick is None or pick.kind != "dynamic_slice" or s.shape(pick.output) != (1,):
        return None
    table = literal_value(s.producer, pick.inputs[0])
    if table is None or table.ndim != 1:
        return None
    scaled = _exact_ratio(table, num, den, s.g.tensors[pick.inputs[0]].dtype)
    if scaled is None:
        return None
    new_table = _new_constant(s, scaled, s.g.tensors[pick.inputs[0]].dtype, pick)
    one = s.new_op("dynamic_slice", [new_table, *pick.inputs[1:]], (1,),
                   s.g.tensors[pick.output].dtype, pick.params, pick)
    return s.new_op("reshape", [one], (), dtype, {}, r)


def dynamic_slice_of_reshape(s: "_Simplifier", op: Op) -> bool:
    """dynamic_slice(reshape(y), starts) as reshape(dynamic_slice(y, starts')): a
    group of dims the reshape keeps as they are takes its starts; a regrouped run
    sliced whole starts at 0; a regrouped run cut on its leading sized dim only,
    at whole rows of y's run (the start's rows proven by `_scaled_start`), starts
    there at the rows of y's leading sized dim of the run."""
    found = s._reshaped(op.inputs[0]) if op.kind == "dynamic_slice" else None
    if found is None:
        return False
    r, y, src, mid, groups = found
    starts, sizes = op.inputs[1:], op.params["slice_sizes"]
    new_starts: list[int | None] = [None] * len(src)
    new_sizes = list(src)
    for gs, gt in groups:
        if [src[d] for d in gs] == [mid[d] for d in gt]:
            for i, j in zip(gs, gt):
                new_starts[i], new_sizes[i] = starts[j], sizes[j]
            continue
        cuts = [j for j in gt if sizes[j] != mid[j]]
        if not cuts:
            continue                                  # the run whole: starts 0
        lead_t = next((j for j in gt if mid[j] != 1), None)
        lead_s = next((d for d in gs if src[d] != 1), None)
        if lead_t is None or lead_s is None or cuts != [lead_t]:
            return False
        row_mid = math.prod(mid[j] for j in gt if j > lead_t)   # elements per row of mid's run
        row_src = math.prod(src[d] for d in gs if d > lead_s)
        if sizes[lead_t] * row_mid % row_src:
            return False
        start = _scaled_start(s, starts[lead_t], row_mid, row_src, op)
        if start is None:
            return False
        new_starts[lead_s], new_sizes[lead_s] = start, sizes[lead_t] * row_mid // row_src
    dtype = s.g.tensors[starts[0]].dtype if starts else "int32"
    zero = None
    for i, t in enumerate(new_starts):
        if t is None:
            zero = zero if zero is not None else _new_constant(s, np.zeros((), dtype), dtype, op)
            new_starts[i] = zero
    out_dtype = s.g.tensors[op.output].dtype
    block = s.new_op("dynamic_slice", [y, *new_starts], tuple(new_sizes), out_dtype,
                     {"slice_sizes": tuple(new_sizes)}, op)
    s.new_op("reshape", [block], s.shape(op.output), out_dtype, {}, r, output=op.output)
    return True


def unit_dims_out_of_contraction(s: "_Simplifier", op: Op) -> bool:
    """A dot operand reshape(y) whose contracted dim merges y's run with size-1
    dims among sized ones reads y reshaped with those size-1 dims apart, each
    a free dim of the dot (before the merged sized dims); the result is
    reshaped to the dot's shape. Not a reshape that only deletes size-1 dims
    (simplify_forms.py: unit_dims_into_dot)."""
    if op.kind != "dot_general" or len(op.inputs) != 2:
        return False
    p = op.params
    for side, key, r in s.reshaped_operands(op):
        src, mid = s.shape(r.inputs[0]), s.shape(r.output)
        runs = _merge_groups(src, mid)
        if runs is None or _unit_deletion(src, mid) is not None:
            continue
        split = {j for j in p[f"{key}_contract"]
                 if any(src[d] == 1 for d in runs[j]) and any(src[d] != 1 for d in runs[j])}
        if not split:
            continue
        shape: list[int] = []
        at: dict[int, int] = {}                   # a dim of the operand -> its new dim
        for j, run in enumerate(runs):
            if j in split:
                shape.extend(1 for d in run if src[d] == 1)
            at[j] = len(shape)
            shape.append(mid[j])
        dtype = s.g.tensors[r.output].dtype
        x = s.new_op("reshape", [r.inputs[0]], tuple(shape), dtype, {}, r)
        roles = {f"{key}_{role}": tuple(at[d] for d in p[f"{key}_{role}"])
                 for role in ("batch", "contract")}
        ins = [x if i == side else t for i, t in enumerate(op.inputs)]
        return s._dot_then_unit_reshape(op, ins, {**p, **roles})
    return False


__all__ = ["merged_forms", "refinement"]
