"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier` runs
`transpose_forms` in its pass): one place for the transposes a layout choice puts
around elementwise ops, pads, broadcasts and reductions.

XLA computes a convolution in its preferred layout (NHWC on CPU): it transposes the
program's NCHW operand once, runs every elementwise op, pad, batch statistic and the
next convolution in NHWC, and transposes the result back at the end. The program (and
the sequential module) computes the same values in NCHW, each convolution's expansion
(dlverify/conv_lowering.py) transposing into and out of its dots. So a value one side
holds as x the other holds as transpose(x), and no rule relates the ops that read them.
Transposes move toward the values' producers (as simplify_layouts.py moves them into
slices, concatenations and elementwise ops of one tensor), and a reduction reads its
operand in the producers' layout:

* transpose(pad(x, v)) by P is pad(transpose(x) by P, v), the padding of dim k the
  padding of x's dim P[k];
* transpose(f(x_1, .., x_n)) for an elementwise f of several tensors (broadcasts
  among them) is f(transpose(x_1), .., transpose(x_n)), splats taken at the new shape
  (one tensor and splats: simplify_layouts.transpose_into_elementwise), when the
  transpose, moved on through f's elementwise ops and pads, either composes with a
  transpose somewhere and comes to rest nowhere else but on broadcasts and dots, or
  is taken by a broadcast (a batch statistic's) and otherwise comes to rest on dots
  that do not compute that order whole (an NHWC convolution's taps read as NCHW);
  and, where it rests on such dots, no dot reads the transposed value (the dot takes
  its layout into its own operand order: attention's probabilities transposed for
  p @ v stay as they are). Into a dot that takes it, or onto a parameter, a
  collective or index arithmetic, it would change which transposes the dots and
  their readers see on one side only (a rank-2 MLP's gradients then swap dot after
  dot, pass after pass; a MoE gate's one-hot masks, whose transposes come to rest on
  broadcasts alone). f's operands may be masks computed from values (a relu's
  y > 0, read by its gradient's select, compares floats): the transpose goes into
  the comparison as into any elementwise op; never into a mask of indices (eq of
  iotas and ids). So the program's relu gradient, transposed from its NCHW layout
  to the NHWC one its kernel gradient's dots read, is XLA's NHWC one;
* transpose(broadcast_in_dim(x, dims)) by P is broadcast_in_dim(x', dims'), x' the
  transpose of x that keeps its dims in the order P puts them (none when it is
  already), dims' their new places;
* a reduction of an elementwise tree whose leaves are transposes by one P (each on a
  reduction, or on dots that do not take it: where no rule moves it from), splats
  and broadcasts is the reduction of the tree rebuilt without the transposes (each
  broadcast placing its dims where P takes them from), over the axes P maps the
  reduced ones to, transposed when P also reorders the dims that are kept:
  red(f(transpose(a)), A) = transpose(red(f(a), P[A])) by the kept dims' order.
  So XLA's NHWC batch statistic and the program's NCHW one meet as the sum of the
  taps' dots over the same dims;
* transpose(cp_1(.. cp_n(z))) by P, z a slice, a dynamic slice or an all-reduce of w,
  is cp_1(.. cp_n(z')), z' that op of transpose(w) by P: a permute passes whole
  values between ranks (zeros where a rank receives nothing), so it commutes with
  any re-indexing of each rank's elements. The transpose enters z in the same
  rewrite, so none is left right under a permute (simplify_moves moves those out),
  and it goes on toward w's producer as on the side that has no permute: the FSDP
  Llama step receives v's query slots by a permute (a dynamic slice of an
  all-reduced dot) and transposes them for p @ v, where the program's transpose
  reached the dot.

A transpose that moves size-1 dims only is a reshape, left to the size-1 dims rules
(dlverify/unit_layouts.py). No rule moves a transpose out of an elementwise op, a pad
or a broadcast, or into a reduction, so none undoes another (dlverify/rewrites.py's pad, which moves pads
toward the program's own layout for the halo rules, runs before the normal form,
not in it). Each is an identity of data movement for every input;
tests/test_conv_compiled.py checks each numerically and where it must not fire,
and the compiled convolutions of examples/conv_parallel.py it lets verify.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.ir import Op
from dlverify.ops.dtypes import is_float_dtype
from dlverify.ops.table import KINDS, Family
from dlverify.reorders import inverse

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier

# reductions over a set of axes (params: the axes alone)
_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
               "reduce_or", "reduce_xor")
_TREE_OPS = 256     # ops of one tree followed at most (a reduction's; a transpose's way up)


def transpose_forms(s: "_Simplifier", op: Op) -> bool:
    """Whether one of this module's rules replaced `op` (in `s`'s pass). They join the
    late rules of simplify_layouts.py (`s.late`): moving transposes while the size-1
    dims rules still restructure the dots would meet those dots unsettled."""
    if not s.late:
        return False
    if op.kind == "transpose" and len(op.inputs) == 1:
        if not _reorders(s.shape(op.inputs[0]), _perm(op)):
            return False
        return (transpose_into_pad(s, op) or transpose_into_elementwise_of_many(s, op)
                or transpose_into_broadcast(s, op) or transpose_into_permute(s, op))
    if op.kind in _REDUCTIONS and len(op.inputs) == 1 and set(op.params) == {"axes"}:
        return reduction_of_transposed_tree(s, op)
    return False


def _perm(op: Op) -> list[int]:
    return [int(p) for p in op.params["permutation"]]


def _reorders(shape: tuple[int, ...], perm: list[int]) -> bool:
    """Whether perm reorders dims of more than one element (a transpose that moves
    size-1 dims only is a reshape, the size-1 dims rules' to place: unit_layouts.py)."""
    sized = [d for d in perm if shape[d] != 1]
    return sized != sorted(sized)


def transpose_into_pad(s: "_Simplifier", op: Op) -> bool:
    """transpose(pad(x, v)) by P is pad(transpose(x) by P, v), dim k padded as x's P[k]."""
    p = s.producer.get(op.inputs[0])
    if p is None or p.kind != "pad" or len(p.inputs) != 2:
        return False
    perm = _perm(op)
    cfg = tuple(tuple(p.params["padding_config"][j]) for j in perm)
    x = s._transposed(p.inputs[0], perm, op)
    s.new_op("pad", [x, p.inputs[1]], s.shape(op.output), s.g.tensors[op.output].dtype,
             {"padding_config": cfg}, p, output=op.output)
    return True


def transpose_into_permute(s: "_Simplifier", op: Op) -> bool:
    """transpose(cp_1(.. cp_n(z))) by P, z a slice, a dynamic slice or an all-reduce of
    w, is cp_1(.. cp_n(z')), z' that op of transpose(w) by P (a slice's bounds and
    strides, a dynamic slice's starts and sizes permuted alike): each permute passes its
    pairs' whole values on unchanged, and a rank that receives nothing holds zeros, which
    a transpose keeps zeros. The transpose enters the op under the permutes in the same
    rewrite, so none is left right under a permute (simplify_moves.layout_out_of_permute
    moves those out), and it then goes on toward its producer as on a side that has no
    permute."""
    permutes: list[Op] = []
    z = s.producer.get(op.inputs[0])
    while z is not None and z.kind == "collective_permute" and len(z.inputs) == 1:
        permutes.append(z)
        z = s.producer.get(z.inputs[0])
    if not permutes or z is None:
        return False
    perm, shape, dtype = _perm(op), s.shape(op.output), s.g.tensors[op.output].dtype
    if z.kind == "slice" and len(z.inputs) == 1:
        q = {k: (None if z.params.get(k) is None else tuple(z.params[k][j] for j in perm))
             for k in ("start_indices", "limit_indices", "strides")}
        ins = [s._transposed(z.inputs[0], perm, op)]
    elif z.kind == "dynamic_slice" and len(z.inputs) == 1 + len(perm):
        q = dict(z.params)
        q["slice_sizes"] = tuple(z.params["slice_sizes"][j] for j in perm)
        ins = [s._transposed(z.inputs[0], perm, op), *(z.inputs[1 + j] for j in perm)]
    elif z.kind == "all_reduce" and len(z.inputs) == 1:
        q, ins = z.params, [s._transposed(z.inputs[0], perm, op)]
    else:
        return False
    value = s.new_op(z.kind, ins, shape, dtype, q, z)
    for k, cp in enumerate(reversed(permutes)):
        value = s.new_op("collective_permute", [value], shape, dtype, cp.params, cp,
                         output=op.output if k == len(permutes) - 1 else None)
    return True


def _elementwise(s: "_Simplifier", e: Op | None) -> bool:
    """Whether `e` is an elementwise op every operand of which has its result's shape."""
    return e is not None and KINDS[e.kind].family is Family.ELEMENTWISE and bool(e.inputs) \
        and all(s.shape(t) == s.shape(e.output) for t in e.inputs)


def transpose_into_elementwise_of_many(s: "_Simplifier", op: Op) -> bool:
    """transpose(f(x_1, .., x_n)) by P, f elementwise of two or more tensors that are
    not splats, is f of each transposed by P (splats: broadcast at the new shape)."""
    e = s.producer.get(op.inputs[0])
    if not _elementwise(s, e):
        return False
    scalars = [s.scalar_of_splat(t) for t in e.inputs]
    if sum(1 for v in scalars if v is None) < 2:
        return False        # (one tensor: simplify_layouts.transpose_into_elementwise)
    perm, shape = _perm(op), s.shape(op.output)
    way = _way(s, op.inputs[0], perm, {})
    if not _enters(way) or ("dot" in way and _read_by_dot(s, op.output)):
        return False        # (it stays where it is: on f's result, or for the dot that reads it)
    ins = [_moved(s, t, perm, op) if v is None else
           s.new_op("broadcast_in_dim", [v], shape, s.g.tensors[t].dtype,
                    {"broadcast_dimensions": ()}, s.producer[t])
           for t, v in zip(e.inputs, scalars)]
    s.new_op(e.kind, ins, shape, s.g.tensors[op.output].dtype, e.params, e, output=op.output)
    return True


def _moved(s: "_Simplifier", t: int, perm: list[int], like: Op) -> int:
    """Operand t of the elementwise op a transpose by perm moves into, transposed by
    perm (a value or a mask of values alike: each position keeps its partners)."""
    return s._transposed(t, perm, like)


def _read_by_dot(s: "_Simplifier", t: int) -> bool:
    """Whether a dot reads t, directly or through reshapes and transposes: the dot takes
    t's layout into its operand order (simplify.dot_layout, simplify_layouts), as
    attention's probabilities transposed for p @ v; moved away from it, the transpose
    would leave the dot on one side only."""
    todo, seen = [t], set()
    while todo:
        for r in s.readers(todo.pop()):
            if r.kind == "dot_general":
                return True
            if r.kind in ("reshape", "transpose") and r.output not in seen:
                seen.add(r.output)
                todo.append(r.output)
    return False


def _dot_takes(s: "_Simplifier", d: Op, perm: list[int]) -> bool:
    """Whether a transpose by perm of dot d's result might be taken into the dot
    (simplify_layouts.transposed_dot): its sized free dims, read in the order perm
    puts them, are one operand's, then the other's (batch dims anywhere; size-1
    dims go with any group)."""
    p = d.params
    nb = len(p["lhs_batch"])
    nl = len(s.shape(d.inputs[0])) - nb - len(p["lhs_contract"])
    out = s.shape(d.output)
    sides = [0 if j < nb + nl else 1 for j in perm if j >= nb and out[j] != 1]
    changes = sum(1 for a, b in zip(sides, sides[1:]) if a != b)
    return changes <= 1


def _way(s: "_Simplifier", t: int, perm: list[int], seen: dict) -> frozenset | None:
    """Where a transpose by perm of t comes to rest, moved on by this module's rules and
    simplify_layouts' (module docstring): the kinds of places, "composed" (a transpose
    it composes with), "broadcast" (a broadcast takes it), "dot" (it stays on a dot
    that does not compute that order whole, or on an elementwise op of such dots or
    broadcasts, which it does not enter), "other" (it
    stays on anything else: a parameter, a collective, index arithmetic); None when it
    would reach a dot that takes it (simplify_layouts.transposed_dot, whose readers it
    would change on one side only). A splat is no place."""
    if t in seen:
        return seen[t]
    if len(seen) >= _TREE_OPS:
        return None
    seen[t] = None
    e = s.producer.get(t)
    way: frozenset | None = frozenset({"other"})
    if s.scalar_of_splat(t) is not None:
        way = frozenset()
    elif e is None:
        pass
    elif e.kind == "transpose":
        way = frozenset({"composed"})
    elif e.kind == "broadcast_in_dim":
        way = frozenset({"broadcast"})
    elif e.kind == "pad" and len(e.inputs) == 2:
        way = _way(s, e.inputs[0], perm, seen)
    elif e.kind == "dot_general" and len(e.inputs) == 2:
        way = None if _dot_takes(s, e, perm) else frozenset({"dot"})
    elif _elementwise(s, e) and all(_value(s, x, {}) for x in (*e.inputs, t)):
        ways = [_way(s, x, perm, seen) for x in e.inputs]
        tensors = [w for w, x in zip(ways, e.inputs) if s.scalar_of_splat(x) is None]
        if any(w is None for w in ways):
            way = None
        elif len(tensors) == 1:     # (simplify_layouts moves it into one tensor's op)
            way = tensors[0]
        else:
            union = frozenset().union(*tensors)
            way = union if _enters(union) else \
                frozenset({"other"}) if "other" in union else frozenset({"dot"})
    seen[t] = way
    return way


_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
_LOGICAL = ("and", "or", "xor", "not")


def _value(s: "_Simplifier", t: int, seen: dict[int, bool]) -> bool:
    """Whether t holds floating-point values, or a mask computed from such values alone
    (a comparison of floats, logical ops of such masks: a relu's x > 0, which its
    gradient's select reads), not an index or a mask of indices (the one-hot and
    position arithmetic of a MoE dispatch, whose transposes XLA moves its own way)."""
    if is_float_dtype(s.g.tensors[t].dtype):
        return True
    if t in seen or len(seen) >= _TREE_OPS:
        return seen.get(t, False)
    seen[t] = False
    e = s.producer.get(t)
    if e is None or s.g.tensors[t].dtype != "bool":
        return False
    if e.kind in _COMPARISONS:
        ok = all(is_float_dtype(s.g.tensors[x].dtype) for x in e.inputs)
    elif e.kind in _LOGICAL:
        ok = all(_value(s, x, seen) for x in e.inputs)
    else:
        ok = False
    seen[t] = ok
    return ok


def _enters(way: frozenset | None) -> bool:
    """Whether a transpose moves into an elementwise op of several tensors: where it
    composes with a transpose below it, or is taken by a broadcast below it and
    otherwise stays on dots (the taps of a convolution in another layout); never onto
    other values (index arithmetic, a parameter), whose transposes the other side may
    write elsewhere, nor onto broadcasts alone (a MoE gate's one-hot dispatch weights,
    whose transposes XLA moves its own way)."""
    return way is not None and "other" not in way and \
        ("composed" in way or ("dot" in way and "broadcast" in way))


def _broadcast_placed(s: "_Simplifier", b: Op, where: list[int], shape: tuple[int, ...],
                      like: Op) -> int:
    """broadcast_in_dim(x, dims) (op `b`) written at `shape`, its result's dim d now at
    place where[d]: x's dims, in the order they land, broadcast to their new places
    (x transposed first when that order is not x's own)."""
    x, dims = b.inputs[0], [int(d) for d in b.params["broadcast_dimensions"]]
    new = [where[d] for d in dims]
    order = sorted(range(len(new)), key=lambda i: new[i])
    x = s._transposed(x, order, like)
    return s.new_op("broadcast_in_dim", [x], shape, s.g.tensors[b.output].dtype,
                    {"broadcast_dimensions": tuple(sorted(new))}, b)


def transpose_into_broadcast(s: "_Simplifier", op: Op) -> bool:
    """transpose(broadcast_in_dim(x, dims)) by P is broadcast_in_dim(x', dims'): the
    broadcast's dim P[k] is the result's dim k."""
    b = s.producer.get(op.inputs[0])
    if b is None or b.kind != "broadcast_in_dim" or len(b.inputs) != 1:
        return False
    value = _broadcast_placed(s, b, inverse(_perm(op)), s.shape(op.output), op)
    return s.fold(op, value)


def _tree_perm(s: "_Simplifier", t: int, seen: dict[int, bool], perms: set[tuple[int, ...]]) -> bool:
    """Whether t is an elementwise tree (at most _TREE_OPS ops) whose leaves are
    transposes, splats and broadcasts; the transposes' permutations go to `perms`."""
    if t in seen:
        return seen[t]
    e = s.producer.get(t)
    ok = False
    if e is not None and e.kind == "transpose" and len(e.inputs) == 1:
        perms.add(tuple(_perm(e)))
        d = s.producer.get(e.inputs[0])      # (where no rule moves it from)
        ok = d is not None and (d.kind in _REDUCTIONS or
                                _way(s, e.inputs[0], _perm(e), {}) == frozenset({"dot"}))
    elif e is not None and e.kind == "broadcast_in_dim" and len(e.inputs) == 1:
        ok = True
    elif _elementwise(s, e) and len(seen) < _TREE_OPS:
        seen[t] = False        # (a node is visited once; its result is set below)
        ok = all(_tree_perm(s, x, seen, perms) for x in e.inputs)
    seen[t] = ok
    return ok


def _rebuilt(s: "_Simplifier", t: int, perm: list[int], where: list[int], done: dict[int, int],
             like: Op) -> int:
    """The tree of t (checked by `_tree_perm`) in its leaves' untransposed layout: the
    value u with t = transpose(u) by perm."""
    if t in done:
        return done[t]
    e = s.producer[t]
    shape = tuple(s.shape(t)[where[d]] for d in range(len(perm)))
    if e.kind == "transpose":
        u = e.inputs[0]
    elif e.kind == "broadcast_in_dim":
        u = _broadcast_placed(s, e, perm, shape, like)
    else:
        ins = [_rebuilt(s, x, perm, where, done, like) for x in e.inputs]
        u = s.new_op(e.kind, ins, shape, s.g.tensors[t].dtype, e.params, e)
    done[t] = u
    return u


def reduction_of_transposed_tree(s: "_Simplifier", op: Op) -> bool:
    """red(tree, A), the tree's leaves transposes by one P (splats, broadcasts), is
    red(tree without them, P[A]), transposed by the order the kept dims had."""
    t, perms = op.inputs[0], set()
    if not _tree_perm(s, t, {}, perms) or len(perms) != 1:
        return False
    perm = list(next(iter(perms)))
    rank = len(perm)
    where = inverse(perm)      # u's dim perm[k] is t's dim k: u's dim d is t's where[d]
    if len(s.shape(t)) != rank or not _reorders(tuple(s.shape(t)[w] for w in where), perm):
        return False
    u = _rebuilt(s, t, perm, where, {}, op)
    axes = sorted(perm[a] for a in op.params["axes"])
    kept_t = [k for k in range(rank) if k not in op.params["axes"]]
    kept_u = [d for d in range(rank) if d not in axes]
    dtype = s.g.tensors[op.output].dtype
    reduced_shape = tuple(s.shape(u)[d] for d in kept_u)
    order = [kept_u.index(perm[k]) for k in kept_t]     # result dim j: reduced dim order[j]
    if order == list(range(len(order))):
        s.new_op(op.kind, [u], s.shape(op.output), dtype, {"axes": tuple(axes)}, op,
                 output=op.output)
        return True
    r = s.new_op(op.kind, [u], reduced_shape, dtype, {"axes": tuple(axes)}, op)
    s.new_op("transpose", [r], s.shape(op.output), dtype, {"permutation": tuple(order)}, op,
             output=op.output)
    return True


__all__ = ["transpose_forms"]
