"""Shape checks of a parsed HLO module: every instruction's declared result
shape must follow from its operands' declared shapes and its attributes, as
XLA's shape inference (xla/service/shape_inference.cc) computes it.

Without this, a file whose declared shapes disagree with its operands (a
multiply of f32[32] by f32[16], a dot over contracting dims of different
sizes) would be lowered as if it were well formed, and could be called
"verified". A mismatch is an InputError naming the instruction's line.

Checked: elementwise ops (unary, binary, compare, select, clamp, convert),
broadcast, reshape, bitcast, transpose, slice, dynamic-slice,
dynamic-update-slice, concatenate, pad, reverse, iota, dot, reduce, gather,
scatter, the collectives (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-permute), tuple, get-tuple-element, and the operands and results
of call, fusion, while and conditional against their computations. Opcodes
not listed (custom-call, async wrappers, sort, ...) are opaque here; their
translation checks what it relies on.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from dlverify.frontends.hlo.attributes import ints, parse_replica_groups
from dlverify.frontends.hlo.model import (
    HloComputation,
    HloInstruction,
    HloModule,
    HloShape,
)
from dlverify.frontends.hlo.ops.elementwise import BINARY, UNARY

from dlverify.errors import InputError


class _Bad(Exception):
    """A shape rule failed: the message, without the instruction's name."""


def same_shape(a: HloShape, b: HloShape) -> bool:
    """Equal element types and dims, ignoring layouts (tuples element-wise)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x.is_tuple != y.is_tuple:
            return False
        if x.is_tuple:
            if len(x.elements) != len(y.elements):
                return False
            stack.extend(zip(x.elements, y.elements))
        elif x.dtype != y.dtype or x.dims != y.dims:
            return False
    return True


def _array(s: HloShape, what: str) -> tuple[int, ...]:
    if s.is_tuple:
        raise _Bad(f"{what} is a tuple {s}, expected an array")
    return s.dims


def _count(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _arity(ops: list[HloShape], n: int, opcode: str) -> None:
    if len(ops) != n:
        raise _Bad(f"{opcode} takes {n} operand{'s' if n != 1 else ''}, got {len(ops)}")


def _one_operand(ops: list[HloShape], opcode: str) -> tuple[int, ...]:
    """The dims of the one array operand that `opcode` takes."""
    _arity(ops, 1, opcode)
    return _array(ops[0], "the operand")


def _braced(dims: Sequence[int]) -> str:
    """Dims written as an HLO attribute writes them, e.g. {0,2}: error messages quote the input."""
    return "{" + ",".join(map(str, dims)) + "}"


def _dims_in_range(dims: tuple[int, ...], rank: int, what: str) -> None:
    if len(set(dims)) != len(dims) or any(not 0 <= d < rank for d in dims):
        raise _Bad(f"{what} {_braced(dims)} are not distinct dims of a rank-{rank} "
                   f"array")


def _one_dim(ins: HloInstruction, key: str) -> int:
    d = ints(ins.attrs.get(key))
    if len(d) != 1:
        raise _Bad(f"{ins.opcode} needs {key}={{d}} (one dim)")
    return d[0]


Rule = Callable[[HloInstruction, list[HloShape], HloShape], None]
_RULES: dict[str, Rule] = {}


def _rule(*opcodes: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for op in opcodes:
            _RULES[op] = fn
        return fn
    return deco


# -- elementwise ---------------------------------------------------------------

@_rule(*UNARY, "convert", "round-nearest-afz", "round-nearest-even", "reduce-precision",
       "copy")
def _unary(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    _arity(ops, 1, ins.opcode)
    if ops[0].is_tuple and ins.opcode == "copy":
        if not same_shape(ops[0], out):
            raise _Bad(f"copy of {ops[0]} declares the result {out}")
        return
    x = _array(ops[0], "the operand")
    if _array(out, "the result") != x:
        raise _Bad(f"{ins.opcode} of {ops[0]} declares the result {out}")


@_rule(*BINARY, "compare")
def _binary(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    _arity(ops, 2, ins.opcode)
    a, b = _array(ops[0], "operand 0"), _array(ops[1], "operand 1")
    if a != b:
        raise _Bad(f"{ins.opcode} of {ops[0]} and {ops[1]}: the operand shapes differ")
    if ins.opcode != "complex" and ops[0].dtype != ops[1].dtype:
        raise _Bad(f"{ins.opcode} of {ops[0]} and {ops[1]}: the element types differ")
    if _array(out, "the result") != a:
        raise _Bad(f"{ins.opcode} of {ops[0]} and {ops[1]} declares the result {out}")
    if ins.opcode == "compare" and out.dtype != "bool":
        raise _Bad(f"compare declares the result {out}, expected pred[...]")


@_rule("select")
def _select(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    _arity(ops, 3, "select")
    if ops[1].is_tuple or ops[2].is_tuple or out.is_tuple:
        return  # the old tuple select: its translation refuses it
    pred, t, f = (_array(s, w) for s, w in zip(ops, ("the predicate", "on_true", "on_false")))
    if ops[0].dtype != "bool":
        raise _Bad(f"select predicate is {ops[0]}, expected pred[...]")
    if t != f or ops[1].dtype != ops[2].dtype:
        raise _Bad(f"select between {ops[1]} and {ops[2]}: the branch shapes differ")
    if pred not in ((), t):
        raise _Bad(f"select predicate {ops[0]} does not match the branches {ops[1]}")
    if not same_shape(out, ops[1]):
        raise _Bad(f"select of {ops[1]} declares the result {out}")


@_rule("clamp")
def _clamp(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    _arity(ops, 3, "clamp")
    lo, x, hi = (_array(s, w) for s, w in zip(ops, ("min", "the operand", "max")))
    for bound, s in ((lo, ops[0]), (hi, ops[2])):
        if bound not in ((), x):
            raise _Bad(f"clamp bound {s} matches neither a scalar nor the operand {ops[1]}")
    if _array(out, "the result") != x:
        raise _Bad(f"clamp of {ops[1]} declares the result {out}")


# -- data movement -------------------------------------------------------------

@_rule("broadcast")
def _broadcast(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    x, y = _one_operand(ops, "broadcast"), _array(out, "the result")
    dims = ints(ins.attrs.get("dimensions"))
    if len(dims) != len(x):
        raise _Bad(f"broadcast dimensions {_braced(dims)} do not match the operand "
                   f"rank {len(x)}")
    _dims_in_range(dims, len(y), "broadcast dimensions")
    for i, d in enumerate(dims):
        if x[i] not in (1, y[d]):
            raise _Bad(f"broadcast of {ops[0]} to {out}: operand dim {i} ({x[i]}) does not "
                       f"match result dim {d} ({y[d]})")


@_rule("reshape")
def _reshape(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if _count(_one_operand(ops, "reshape")) != _count(_array(out, "the result")):
        raise _Bad(f"reshape {ops[0]} -> {out} changes the element count")


@_rule("bitcast")
def _bitcast(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    x, y = _one_operand(ops, "bitcast"), _array(out, "the result")
    if ops[0].dtype == out.dtype and _count(x) != _count(y):
        raise _Bad(f"bitcast {ops[0]} -> {out} changes the element count")


@_rule("transpose")
def _transpose(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    x, y = _one_operand(ops, "transpose"), _array(out, "the result")
    perm = ints(ins.attrs.get("dimensions"))
    if sorted(perm) != list(range(len(x))):
        raise _Bad(f"transpose dimensions {_braced(perm)} are not a permutation "
                   f"of the operand's {len(x)} dims")
    if tuple(x[p] for p in perm) != y:
        raise _Bad(f"transpose of {ops[0]} by {_braced(perm)} declares the "
                   f"result {out}")


@_rule("reverse")
def _reverse(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    x = _one_operand(ops, "reverse")
    _dims_in_range(ints(ins.attrs.get("dimensions")), len(x), "reverse dimensions")
    if _array(out, "the result") != x:
        raise _Bad(f"reverse of {ops[0]} declares the result {out}")


@_rule("slice")
def _slice(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    x, y = _one_operand(ops, "slice"), _array(out, "the result")
    spec = ins.attrs.get("slice") or ""
    ranges = re.findall(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+))?\s*\]", spec)
    if len(ranges) != len(x):
        raise _Bad(f"slice={spec} does not give one range per dim of {ops[0]}")
    want = []
    for d, (a, b, s) in enumerate(ranges):
        lo, hi, st = int(a), int(b), int(s) if s else 1
        if not 0 <= lo <= hi <= x[d] or st < 1:
            raise _Bad(f"slice range [{a}:{b}{':' + s if s else ''}] is outside dim {d} of "
                       f"{ops[0]} (size {x[d]})")
        want.append((hi - lo + st - 1) // st)
    if tuple(want) != y:
        raise _Bad(f"slice={spec} of {ops[0]} gives [{','.join(map(str, want))}], but the result "
                   f"is declared {out}")


def _start_indices(idx: list[HloShape], rank: int, opcode: str) -> None:
    if len(idx) == 1 and not idx[0].is_tuple and idx[0].dims == (rank,):
        return  # the old form: one index vector
    if len(idx) != rank or any(s.is_tuple or s.dims != () for s in idx):
        raise _Bad(f"{opcode} needs {rank} scalar start indices, got "
                   f"{', '.join(map(str, idx)) or 'none'}")
    for s in idx:
        if s.dtype.startswith(("float", "bfloat", "complex")) or s.dtype == "bool":
            raise _Bad(f"{opcode} start index {s} is not an integer")


@_rule("dynamic-slice")
def _dynamic_slice(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if not ops:
        raise _Bad("dynamic-slice needs an operand")
    x, y = _array(ops[0], "the operand"), _array(out, "the result")
    _start_indices(ops[1:], len(x), "dynamic-slice")
    sizes = ints(ins.attrs.get("dynamic_slice_sizes")) or y
    if len(sizes) != len(x) or any(not 0 <= s <= d for s, d in zip(sizes, x)):
        raise _Bad(f"dynamic_slice_sizes {_braced(sizes)} do not fit in {ops[0]}")
    if tuple(sizes) != y:
        raise _Bad(f"dynamic-slice of sizes {_braced(sizes)} declares the result "
                   f"{out}")


@_rule("dynamic-update-slice")
def _dynamic_update_slice(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if len(ops) < 2:
        raise _Bad("dynamic-update-slice needs an operand and an update")
    x, u = _array(ops[0], "the operand"), _array(ops[1], "the update")
    _start_indices(ops[2:], len(x), "dynamic-update-slice")
    if len(u) != len(x) or any(a > b for a, b in zip(u, x)):
        raise _Bad(f"dynamic-update-slice update {ops[1]} does not fit in {ops[0]}")
    if ops[0].dtype != ops[1].dtype:
        raise _Bad(f"dynamic-update-slice of {ops[0]} with an update {ops[1]}: element types "
                   f"differ")
    if not same_shape(out, ops[0]):
        raise _Bad(f"dynamic-update-slice of {ops[0]} declares the result {out}")


@_rule("concatenate")
def _concatenate(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if not ops:
        raise _Bad("concatenate needs operands")
    d = _one_dim(ins, "dimensions")
    shapes = [_array(s, f"operand {i}") for i, s in enumerate(ops)]
    rank = len(shapes[0])
    if not 0 <= d < rank:
        raise _Bad(f"concatenate dimension {d} is outside the operands' rank {rank}")
    for s, sh in zip(ops, shapes):
        if len(sh) != rank or any(a != b for i, (a, b) in enumerate(zip(sh, shapes[0])) if i != d):
            raise _Bad(f"concatenate along dim {d} of {ops[0]} and {s}: the other dims differ")
    want = shapes[0][:d] + (sum(sh[d] for sh in shapes),) + shapes[0][d + 1:]
    if _array(out, "the result") != want:
        raise _Bad(f"concatenate along dim {d} gives [{','.join(map(str, want))}], but the "
                   f"result is declared {out}")


@_rule("pad")
def _pad(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    _arity(ops, 2, "pad")
    x = _array(ops[0], "the operand")
    if _array(ops[1], "the padding value") != ():
        raise _Bad(f"pad value {ops[1]} is not a scalar")
    parts = (ins.attrs.get("padding") or "").split("x")
    if len(x) == 0 and parts == [""]:
        parts = []
    if len(parts) != len(x):
        raise _Bad(f"padding={ins.attrs.get('padding')} does not give one entry per dim of "
                   f"{ops[0]}")
    want = []
    for d, part in enumerate(parts):
        nums = [int(v) for v in part.split("_")]
        if len(nums) == 2:
            nums.append(0)  # low_high without interior padding
        if len(nums) != 3 or nums[2] < 0:
            raise _Bad(f"bad padding entry {part!r} for dim {d}")
        lo, hi, interior = nums
        size = lo + hi + x[d] + max(x[d] - 1, 0) * interior
        if size < 0:
            raise _Bad(f"padding {part!r} removes more than dim {d} of {ops[0]} holds")
        want.append(size)
    if _array(out, "the result") != tuple(want):
        raise _Bad(f"pad of {ops[0]} gives [{','.join(map(str, want))}], but the result is "
                   f"declared {out}")


@_rule("iota")
def _iota(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    y = _array(out, "the result")
    d = _one_dim(ins, "iota_dimension")
    if not 0 <= d < len(y):
        raise _Bad(f"iota_dimension={d} is outside the result {out}")


@_rule("gather")
def _gather(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    _arity(ops, 2, "gather")
    x, idx, y = _array(ops[0], "the operand"), _array(ops[1], "the indices"), _array(out, "the result")
    a = ins.attrs
    offset_dims, collapsed = ints(a.get("offset_dims")), ints(a.get("collapsed_slice_dims"))
    start_map, sizes = ints(a.get("start_index_map")), ints(a.get("slice_sizes"))
    obatch = ints(a.get("operand_batching_dims"))
    ivd = ints(a.get("index_vector_dim"))
    iv = ivd[0] if ivd else len(idx)
    if not 0 <= iv <= len(idx):
        raise _Bad(f"index_vector_dim={iv} is outside the indices {ops[1]}")
    if len(sizes) != len(x) or any(not 0 <= s <= d for s, d in zip(sizes, x)):
        raise _Bad(f"slice_sizes {_braced(sizes)} do not fit in {ops[0]}")
    _dims_in_range(collapsed + obatch, len(x), "collapsed_slice_dims and operand_batching_dims")
    if any(sizes[d] > 1 for d in collapsed + obatch):
        raise _Bad("a collapsed or batching dim of a gather has a slice size above 1")
    n_index = idx[iv] if iv < len(idx) else 1
    if len(start_map) != n_index:
        raise _Bad(f"start_index_map has {len(start_map)} entries but the index vector has "
                   f"{n_index}")
    _dims_in_range(start_map, len(x), "start_index_map")
    batch = [d for i, d in enumerate(idx) if i != iv]
    window = [s for i, s in enumerate(sizes) if i not in collapsed and i not in obatch]
    if len(offset_dims) != len(window) or len(y) != len(batch) + len(window):
        raise _Bad(f"gather result {out} does not have one dim per offset dim "
                   f"({len(window)}) and per batch dim of the indices ({len(batch)})")
    _dims_in_range(offset_dims, len(y), "offset_dims")
    wi, bi = iter(window), iter(batch)
    want = tuple(next(wi) if d in offset_dims else next(bi) for d in range(len(y)))
    if want != y:
        raise _Bad(f"gather gives [{','.join(map(str, want))}], but the result is declared {out}")


@_rule("scatter")
def _scatter(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if len(ops) < 3 or len(ops) % 2 == 0:
        raise _Bad(f"scatter takes operands, indices and as many updates, got {len(ops)} operands")
    k = (len(ops) - 1) // 2
    operands = ops[:k]
    want = operands[0] if k == 1 else HloShape("tuple", elements=tuple(operands))
    if not same_shape(out, want):
        raise _Bad(f"scatter into {want} declares the result {out}")
    window = ints(ins.attrs.get("update_window_dims"))
    idx = _array(ops[k], "the indices")
    ivd = ints(ins.attrs.get("index_vector_dim"))
    iv = ivd[0] if ivd else len(idx)
    n_scatter = len(idx) - (1 if iv < len(idx) else 0)
    for u in ops[k + 1:]:
        if len(_array(u, "an update")) != len(window) + n_scatter:
            raise _Bad(f"scatter update {u} does not have {len(window)} window dims and "
                       f"{n_scatter} scatter dims")


# -- contractions and reductions ------------------------------------------------

@_rule("dot")
def _dot(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if "sparsity" in ins.attrs:
        return  # sparse dot: its translation refuses it
    _arity(ops, 2, "dot")
    lhs, rhs = _array(ops[0], "the lhs"), _array(ops[1], "the rhs")
    a = ins.attrs
    lc, rc = ints(a.get("lhs_contracting_dims")), ints(a.get("rhs_contracting_dims"))
    lb, rb = ints(a.get("lhs_batch_dims")), ints(a.get("rhs_batch_dims"))
    _dims_in_range(lb + lc, len(lhs), "lhs batch and contracting dims")
    _dims_in_range(rb + rc, len(rhs), "rhs batch and contracting dims")
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise _Bad("dot has different numbers of lhs and rhs contracting (or batch) dims")
    for kind, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        for i, j in zip(ld, rd):
            if lhs[i] != rhs[j]:
                raise _Bad(f"dot {kind} dims differ: lhs dim {i} of {ops[0]} is {lhs[i]}, rhs "
                           f"dim {j} of {ops[1]} is {rhs[j]}")
    want = (tuple(lhs[i] for i in lb)
            + tuple(d for i, d in enumerate(lhs) if i not in lb and i not in lc)
            + tuple(d for i, d in enumerate(rhs) if i not in rb and i not in rc))
    if _array(out, "the result") != want:
        raise _Bad(f"dot of {ops[0]} and {ops[1]} gives [{','.join(map(str, want))}], but the "
                   f"result is declared {out}")


@_rule("reduce")
def _reduce(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if not ops or len(ops) % 2:
        raise _Bad(f"reduce takes inputs and as many init values, got {len(ops)} operands")
    k = len(ops) // 2
    inputs = [_array(s, f"input {i}") for i, s in enumerate(ops[:k])]
    for i, s in enumerate(ops[k:]):
        if _array(s, f"init value {i}") != ():
            raise _Bad(f"reduce init value {s} is not a scalar")
    if any(x != inputs[0] for x in inputs):
        raise _Bad("reduce inputs have different shapes")
    axes = ints(ins.attrs.get("dimensions"))
    _dims_in_range(axes, len(inputs[0]), "reduce dimensions")
    kept = tuple(d for i, d in enumerate(inputs[0]) if i not in axes)
    results = out.elements if k > 1 else (out,)
    if k > 1 and not out.is_tuple or len(results) != k:
        raise _Bad(f"reduce of {k} inputs declares the result {out}")
    for r in results:
        if _array(r, "a result") != kept:
            raise _Bad(f"reduce of {ops[0]} over {_braced(axes)} gives "
                       f"[{','.join(map(str, kept))}], but the result is declared {out}")


# -- collectives ----------------------------------------------------------------

def _group_size(ins: HloInstruction) -> int | None:
    """The size of the replica groups, None for `{}` (all ranks)."""
    try:
        groups = parse_replica_groups(ins.attrs.get("replica_groups"))
    except ValueError as e:
        raise _Bad(f"replica_groups: {e}") from None
    if groups is None:
        return None
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise _Bad("replica groups of different sizes")
    return sizes.pop()


def _per_operand(ops: list[HloShape], out: HloShape, opcode: str) -> list[tuple[HloShape, HloShape]]:
    if len(ops) == 1 and not out.is_tuple:
        return [(ops[0], out)]
    if not out.is_tuple or len(out.elements) != len(ops):
        raise _Bad(f"{opcode} of {len(ops)} operands declares the result {out}")
    return list(zip(ops, out.elements))


@_rule("all-reduce", "cross-replica-sum", "collective-permute", "all-to-all")
def _shape_preserving_collective(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if not ops:
        raise _Bad(f"{ins.opcode} needs an operand")
    if ins.opcode == "collective-permute" and len(ops) != 1:
        return  # the in-place form (buffers and offsets): its translation refuses it
    for x, y in _per_operand(ops, out, ins.opcode):
        if not same_shape(x, y):
            raise _Bad(f"{ins.opcode} of {x} declares the result {y}")
    if ins.opcode == "all-to-all" and "dimensions" in ins.attrs:
        d = _one_dim(ins, "dimensions")
        x = _array(ops[0], "the operand")
        size = _group_size(ins)
        if not 0 <= d < len(x) or (size is not None and x[d] % size):
            raise _Bad(f"all-to-all dimension {d} of {ops[0]} does not split over groups of "
                       f"{size}")


@_rule("all-gather", "reduce-scatter")
def _gather_scatter_collective(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if not ops:
        raise _Bad(f"{ins.opcode} needs an operand")
    d = _one_dim(ins, "dimensions")
    size = _group_size(ins)
    for x, y in _per_operand(ops, out, ins.opcode):
        xs, ys = _array(x, "the operand"), _array(y, "the result")
        if len(xs) != len(ys) or not 0 <= d < len(xs) or x.dtype != y.dtype \
                or any(a != b for i, (a, b) in enumerate(zip(xs, ys)) if i != d):
            raise _Bad(f"{ins.opcode} along dim {d} of {x} declares the result {y}")
        small, big = (xs[d], ys[d]) if ins.opcode == "all-gather" else (ys[d], xs[d])
        if (size is not None and small * size != big) or (size is None and (
                small == 0 and big != 0 or small and big % small)):
            raise _Bad(f"{ins.opcode} along dim {d} over groups of {size or 'all ranks'}: "
                       f"{x} does not give {y}")


# -- structure and calls ----------------------------------------------------------

@_rule("tuple")
def _tuple(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    if not same_shape(out, HloShape("tuple", elements=tuple(ops))):
        raise _Bad(f"tuple of ({', '.join(map(str, ops))}) declares the result {out}")


@_rule("get-tuple-element")
def _gte(ins: HloInstruction, ops: list[HloShape], out: HloShape) -> None:
    _arity(ops, 1, "get-tuple-element")
    idx = ints(ins.attrs.get("index"))
    if not ops[0].is_tuple or len(idx) != 1 or not 0 <= idx[0] < len(ops[0].elements):
        raise _Bad(f"get-tuple-element index={ins.attrs.get('index')} of {ops[0]}")
    if not same_shape(out, ops[0].elements[idx[0]]):
        raise _Bad(f"element {idx[0]} of {ops[0]} is {ops[0].elements[idx[0]]}, but the result "
                   f"is declared {out}")


def _check_call(callee: HloComputation, args: list[HloShape], what: str) -> HloShape:
    params = callee.parameters()
    if sorted(params) != list(range(len(args))):
        if len(params) == len(args):   # as many, but not numbered 0..n-1
            raise _Bad(f"{what} %{callee.name} numbers its parameters {sorted(params)}, not "
                       f"0..{len(args) - 1} for its {len(args)} operands")
        raise _Bad(f"{what} %{callee.name} takes {len(params)} parameters but gets {len(args)} "
                   f"operands")
    for k, a in enumerate(args):
        if not same_shape(params[k].shape, a):
            raise _Bad(f"operand {k} is {a} but parameter {k} of %{callee.name} is "
                       f"{params[k].shape}")
    return callee.root.shape


def _callee(module: HloModule, ins: HloInstruction, key: str) -> HloComputation:
    return module.computations[(ins.attrs.get(key) or "").strip().lstrip("%")]


def _check_calls(module: HloModule, ins: HloInstruction, ops: list[HloShape]) -> None:
    out = ins.shape
    if ins.opcode in ("call", "fusion"):
        key = "to_apply" if ins.opcode == "call" else "calls"
        if key not in ins.attrs:
            raise _Bad(f"{ins.opcode} without {key}=")
        root = _check_call(_callee(module, ins, key), ops, ins.opcode)
        if not same_shape(root, out):
            raise _Bad(f"{ins.opcode} returns {root} but declares the result {out}")
    elif ins.opcode == "while":
        _arity(ops, 1, "while")
        for key in ("condition", "body"):
            if key not in ins.attrs:
                raise _Bad(f"while without {key}=")
        cond_root = _check_call(_callee(module, ins, "condition"), ops, "while condition")
        if cond_root.is_tuple or cond_root.dims != () or cond_root.dtype != "bool":
            raise _Bad(f"while condition returns {cond_root}, expected pred[]")
        body_root = _check_call(_callee(module, ins, "body"), ops, "while body")
        if not same_shape(body_root, ops[0]) or not same_shape(out, ops[0]):
            raise _Bad(f"while loop state {ops[0]}: the body returns {body_root} and the result "
                       f"is declared {out}")
    elif ins.opcode == "conditional" and ops:
        if "branch_computations" in ins.attrs:
            names = [x.strip().lstrip("%") for x in
                     ins.attrs["branch_computations"].strip().strip("{}").split(",") if x.strip()]
        else:
            names = [(ins.attrs.get(k) or "").strip().lstrip("%")
                     for k in ("true_computation", "false_computation")]
        if len(ops) != 1 + len(names):
            raise _Bad(f"conditional with {len(names)} branches takes {1 + len(names)} operands, "
                       f"got {len(ops)}")
        for i, name in enumerate(names):
            root = _check_call(module.computations[name], [ops[1 + i]], f"branch {i}")
            if not same_shape(root, out):
                raise _Bad(f"branch {i} (%{name}) returns {root} but the result is declared {out}")


def validate_module(module: HloModule) -> None:
    """Raise InputError (file, line of the instruction) at the first instruction
    whose result shape does not follow from its operands."""
    for comp in module.computations.values():
        for ins in comp.instructions:
            rule = _RULES.get(ins.opcode)
            calls = ins.opcode in ("call", "fusion", "while", "conditional")
            if rule is None and not calls:
                continue
            ops = [comp.by_name[o].shape for o in ins.operands]
            try:
                if rule is not None:
                    rule(ins, ops, ins.shape)
                else:
                    _check_calls(module, ins, ops)
            except _Bad as e:
                raise InputError(f"instruction {ins.name}: {e}", module.file, ins.line) from None
            except (ValueError, KeyError, IndexError) as e:
                raise InputError(f"instruction {ins.name}: malformed {ins.opcode} "
                                 f"({type(e).__name__}: {e})", module.file, ins.line) from None


__all__ = ["same_shape", "validate_module"]
