"""What the `axis` column of a partial tag [reducer, op, axis, lo, hi] names.

A partial term is the sum over the index range [lo, hi) of a fixed family of
terms F(0), ..., F(full-1) whose total is the sequential value; `op` and `axis`
name the family, and members of a collective whose ranges tile [0, full)
complete it. The families (datalog/partials.dl, datalog/update.dl):

- axis < FLAT_BASE: reduced axis `axis` (the idx-th contracted or reduced dim)
  of the reduction or dot_general `op`;
- FLAT_BASE + 32*i + j: dot_general `op` with two partially held contracted
  pairs, flattened row-major with pair i outer and pair j inner;
- ADD_BASE + 32*a + b: add/sub `op` of two partial results, of n1 terms (its
  operand 0's producer, axis a) and n2 terms (operand 1's, axis b); each family is
  cut into m = gcd(n1, n2) blocks and F(k) is the sum (or difference) of their
  blocks k (of the terms themselves when n1 = n2);
- MASK_BASE + k: F(i) is `op`'s output masked to its index i along dim k
  (the terms a dynamic_update_slice into zeros writes);
- MASK2_BASE + PAIR * k_out + k_in: F(i * n + j), n the output's size along k_in, is
  `op`'s output masked to its index i along k_out and j along k_in (the terms a
  dynamic_update_slice into zeros writes when its update has one element along
  k_out and part of k_in);
- WINDOW_BASE + k: `op` is a sequential dynamic_update_slice into zeros writing
  at `start` along k; F(i), i below the update's size, is its output masked to
  index start + i along k;
- ACC_BASE + a: a tree of sequential adds (mirrored on the distributed side) whose
  leaves are reductions along their axis a with equally many terms, `op` its first
  leaf; F(k) is the sum over the leaves of their terms k;
- CAT_BASE + a: `op` is a sequential concatenate whose operands are reductions along
  their axis a with equally many terms; F(k) is the concatenation of their terms k;
- CAT_MIXED_BASE + sum_j a_j * R^j (R = CAT_MIXED_RADIX): `op` is a sequential concatenate
  whose operand j is a reduction along its own axis a_j, all with equally many terms;
  F(k) is the concatenation of their terms k;
- HELD_BASE + 32*i + a: add `op` whose operand i is the result of the reduction
  along its axis a and whose other operand v is added by the rank holding term 0
  (zeros elsewhere: a bias on rank 0 before the all-reduce); F(0) = R(0) + v,
  F(k) = R(k) for k > 0, R the reduction's terms;
- PROD_BASE + ((n*8 + i)*3 + t)*8 + a: dot_general `op` holding one aligned block of n
  indices of its partially held contracted pair i, of an operand t < 2 that is partial
  over the family (p, a), p the one reduction nearest upstream of t's sequential operand
  (prod_root): F(b * K + k), K the size of (p, a), is `op` restricted to block b of pair
  i, of term k of operand t; or (t = 2) times its own pair a of K indices: F(b * K + k)
  is `op` restricted to block b of pair i and index k of pair a;
- GROUP_BASE + (g0 * RADIX + t) * RADIX + m: `op` is a distributed collective and
  its groups g0, g0 + t, ..., g0 + (m-1) t a class whose members' operands, visited
  as slots (member q of the j-th group is slot q * m + j), tile the range of one
  family; F(j) is the reduction over the j-th group (collectives.dl);
- TRANS_BASE + (u * TRANS_RADIX + bb) * PAIR + ax: the family (op, ax) cut into
  blocks of u terms, re-indexed by the transpose of its blocks as an a x bb grid
  (block i * bb + j becomes block j * a + i; partials.dl).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dlverify import schema as S
from dlverify.ir import CHAIN_DEPTH, Graph, Op
from dlverify.ops import KINDS
from dlverify.ops.export import reduction

# Declared once in schema.py, generated into datalog/schema.dl (Tag_FlatBase, ...).
FLAT_BASE = S.TAG_FLAT_BASE
ADD_BASE = S.TAG_ADD_BASE
MASK_BASE = S.TAG_MASK_BASE
WINDOW_BASE = S.TAG_WINDOW_BASE
ACC_BASE = S.TAG_ACC_BASE
CAT_BASE = S.TAG_CAT_BASE
CAT_MIXED_BASE, CAT_MIXED_RADIX = S.TAG_CAT_MIXED_BASE, S.TAG_CAT_MIXED_RADIX
HELD_BASE = S.TAG_HELD_BASE
MASK2_BASE = S.TAG_MASK2_BASE
PROD_BASE, PROD_AXES = S.TAG_PROD_BASE, S.TAG_PROD_AXES
GROUP_BASE = S.TAG_GROUP_BASE
GROUP_RADIX = S.TAG_GROUP_RADIX
TRANS_BASE = S.TAG_TRANS_BASE
TRANS_RADIX = S.TAG_TRANS_RADIX
PAIR = S.TAG_PAIR   # axes encoded in pairs are below this


def _op(graph: Graph, op_id: int) -> Op | None:
    return next((o for o in graph.ops if o.id == op_id), None)


def _producer(graph: Graph, tensor: int) -> Op | None:
    return next((o for o in graph.ops if o.output == tensor), None)


def _dim(graph: Graph, tensor: int, k: int) -> int | None:
    """The size of dim k of a tensor of the graph (None: no such tensor or dim)."""
    t = graph.tensors.get(tensor)
    return t.shape[k] if t is not None and 0 <= k < len(t.shape) else None


def _input_dim(graph: Graph, op: Op | None, i: int, k: int) -> int | None:
    return _dim(graph, op.inputs[i], k) if op is not None and 0 <= i < len(op.inputs) else None


def _operand_family(seq: Graph, op: Op | None, i: int, axis: int) -> int | None:
    """The size of the family (producer of op's operand i, axis)."""
    if op is None or not 0 <= i < len(op.inputs):
        return None
    p = _producer(seq, op.inputs[i])
    return None if p is None else full_size(seq, p.id, axis)


def _reduction_through_reshapes(seq: Graph, tensor: int) -> Op | None:
    """The reduction whose result `tensor` is, or is a reshape of through ops that move
    no element or broadcast (concat_terms.dl's Cat_Red_Source, over Reshape_Chain)."""
    for _ in range(CHAIN_DEPTH + 1):
        p = _producer(seq, tensor)
        if p is None or _is_reduction(p):
            return p
        if not (seq.moves_no_element(p) or p.kind == "broadcast_in_dim"):
            return None
        tensor = p.inputs[0]
    return None


def _is_reduction(op: Op) -> bool:
    """The op has a reduced axis (a Contract_Size fact): a dot_general that contracts, or a
    reduction over some axes."""
    if op.kind == "dot_general":
        return bool(op.params.get("lhs_contract"))
    return KINDS[op.kind].export is reduction and bool(op.params.get("axes"))


_MANY = -1   # (prod_roots: more than one reduction upstream)


def prod_roots(seq: Graph) -> dict[int, int]:
    """Tensor -> the one reduction nearest upstream of it (the op with a reduced axis
    reached through ops without one), for the tensors that have exactly one: datalog's
    Prod_Root facts. One pass in op order, each tensor keeping one root or none or
    "many", so it is linear in the graph (a residual stream reaches every layer's
    reductions through its adds: they are many, not listed)."""
    root: dict[int, int] = {}
    for op in seq.ops:
        if _is_reduction(op):
            root[op.output] = op.id
            continue
        found = {root[i] for i in op.inputs if i in root}
        if len(found) == 1:
            root[op.output] = found.pop()
        elif found:
            root[op.output] = _MANY
    return {t: p for t, p in root.items() if p != _MANY}


def prod_root(seq: Graph, tensor: int) -> Op | None:
    """The one reduction nearest upstream of `tensor` (see prod_roots), or None."""
    p = prod_roots(seq).get(tensor)
    return None if p is None else _op(seq, p)


def full_size(seq: Graph, op_id: int, axis: int) -> int | None:
    """The number of terms of the family (op, axis): of the sequential graph, or
    (GROUP_BASE) of a class of a collective's groups, whose count the axis holds.
    None when the axis names no family of that graph (an op, operand or dim it
    does not have): never an exception, as diagnosis reads tags of any view."""
    if axis < 0:
        return None
    if axis >= TRANS_BASE:
        return full_size(seq, op_id, reindexing(axis).axis)
    if is_group_axis(axis):
        return group_class(axis).count
    op = _op(seq, op_id)
    if op is None:
        return None
    if PROD_BASE <= axis < GROUP_BASE:   # blocks of a contracted pair times terms
        p = prod_family(axis)
        if p.operand == 2:   # the dot's own pair
            k = full_size(seq, op_id, p.axis)
        else:
            root = prod_root(seq, op.inputs[p.operand]) if p.operand < len(op.inputs) else None
            k = None if root is None else full_size(seq, root.id, p.axis)
        m = full_size(seq, op_id, p.pair)
        return None if m is None or k is None or m % p.block else m // p.block * k
    if MASK2_BASE <= axis < GROUP_BASE:   # two masked dims, flattened
        k_out, k_in = divmod(axis - MASK2_BASE, PAIR)
        n_out, n_in = _dim(seq, op.output, k_out), _dim(seq, op.output, k_in)
        return None if n_out is None or n_in is None else n_out * n_in
    if HELD_BASE <= axis < GROUP_BASE:   # a reduction plus a held value: the reduction's size
        return _operand_family(seq, op, *divmod(axis - HELD_BASE, PAIR))
    if axis >= CAT_MIXED_BASE:   # operand 0 along the code's lowest digit: its size
        first = _reduction_through_reshapes(seq, op.inputs[0]) if op.inputs else None
        return None if first is None else full_size(
            seq, first.id, (axis - CAT_MIXED_BASE) % CAT_MIXED_RADIX)
    if axis >= CAT_BASE:   # a concatenation of reductions: its first operand's size
        first = _reduction_through_reshapes(seq, op.inputs[0]) if op.inputs else None
        return None if first is None else full_size(seq, first.id, axis - CAT_BASE)
    if axis >= ACC_BASE:   # an add tree named by its first leaf: the leaf's size
        return full_size(seq, op_id, axis - ACC_BASE)
    if axis >= WINDOW_BASE:
        return _input_dim(seq, op, 1, axis - WINDOW_BASE)
    if axis >= MASK_BASE:
        return _dim(seq, op.output, axis - MASK_BASE)
    if axis >= ADD_BASE:   # blocks of two reductions' terms: gcd of their sizes
        n1 = _operand_family(seq, op, 0, (axis - ADD_BASE) // PAIR)
        n2 = _operand_family(seq, op, 1, (axis - ADD_BASE) % PAIR)
        return None if n1 is None or n2 is None else math.gcd(n1, n2)
    if axis >= FLAT_BASE:
        i, j = divmod(axis - FLAT_BASE, PAIR)
        m, n = full_size(seq, op_id, i), full_size(seq, op_id, j)
        return None if m is None or n is None else m * n
    dims = op.params.get("lhs_contract" if op.kind == "dot_general" else "axes")
    if dims is None or axis >= len(dims):
        return None
    return _input_dim(seq, op, 0, dims[axis])


@dataclass(frozen=True)
class GroupClass:
    """The class of groups a GROUP_BASE tag axis names: `count` groups from `first`, `stride` apart."""

    first: int
    stride: int
    count: int


def group_axis(first: int, stride: int, count: int) -> int:
    """The tag axis of the family of sums over the class (first, stride, count)."""
    return GROUP_BASE + (first * GROUP_RADIX + stride) * GROUP_RADIX + count


def group_class(axis: int) -> GroupClass:
    """The class of groups a GROUP_BASE tag axis names."""
    rest, count = divmod(axis - GROUP_BASE, GROUP_RADIX)
    first, stride = divmod(rest, GROUP_RADIX)
    return GroupClass(first, stride, count)


def is_group_axis(axis: int) -> bool:
    """The tag axis names a class of groups of a collective (the tag's op is distributed)."""
    return GROUP_BASE < axis < TRANS_BASE


@dataclass(frozen=True)
class Reindexing:
    """A reduced axis re-indexed by a transpose of its blocks of `block` terms, `stride`
    blocks per row of the grid."""

    axis: int
    block: int
    stride: int


def trans_axis(axis: int, block: int, stride: int) -> int:
    """The tag axis of reduced axis `axis` re-indexed in blocks of `block`, `stride` per row."""
    return TRANS_BASE + (block * TRANS_RADIX + stride) * PAIR + axis


def reindexing(axis: int) -> Reindexing:
    """The re-indexing a TRANS_BASE tag axis names."""
    rest, ax = divmod(axis - TRANS_BASE, PAIR)
    block, stride = divmod(rest, TRANS_RADIX)
    return Reindexing(ax, block, stride)


@dataclass(frozen=True)
class ProdFamily:
    """A PROD_BASE tag axis: blocks of `block` indices of contracted pair `pair`, times
    the terms of operand `operand`'s reduction along its axis `axis` (operand 2: the
    contraction's own pair `axis`)."""

    block: int
    pair: int
    operand: int
    axis: int


def prod_axis(block: int, pair: int, operand: int, axis: int) -> int:
    """The tag axis of a product family (see ProdFamily)."""
    return PROD_BASE + ((block * PROD_AXES + pair) * 3 + operand) * PROD_AXES + axis


def prod_family(axis: int) -> ProdFamily:
    """The product family a PROD_BASE tag axis names."""
    rest, ax = divmod(axis - PROD_BASE, PROD_AXES)
    rest, operand = divmod(rest, 3)
    block, pair = divmod(rest, PROD_AXES)
    return ProdFamily(block, pair, operand, ax)
