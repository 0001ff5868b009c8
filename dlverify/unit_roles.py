"""A dot's size-1 dims given the roles the sequential program's dot gives them, that dot
found by the roles of the operand's sized dims (distributed graph, after the normal form).

With one query head per rank XLA deletes every size-1 dim of the attention's backward
dots; the normal form puts them back (dlverify/unit_layouts.py), choosing among equal
forms by the sequential dots' sizes. That cannot tell the key gradient dS^T q (free s_k,
contracted s_q and the query slot j) from the query gradient dS k (free s_q and j,
contracted s_k) when s_q = s_k: both read the masked scores' gradient [b, g, j, s_q, s_k]
through a transpose, and a rank's j has one index. The rank's key gradient then keeps j
free where the program contracts it, and its transpose puts j where no sequential
transpose does; nothing relates either.

What tells them apart is which dims of the operand's source are contracted. An operand
x = f(transpose(r, P)) (f: negations and elementwise ops whose other operand is a
broadcast scalar, the backward 1/sqrt(d) scaling) has root r; each dim of r is batched, contracted or free
in the dot. A sequential dot whose operand on either side has a root of the same op kind
and rank, each distributed size dividing the sequential one, and the same role for each
dim of r that has more than one element there, is the dot this one computes a block of,
whatever its size-1 dims do. When exactly one such form exists (its permutation, its
params) and the dot as it is has no sequential dot whose roles agree on every dim
(size-1 ones too), `unit_roles_as_sequential` rewrites the dot into that form:

* the operand becomes f(transpose(r, P_s)) with the sequential permutation (the same
  elementwise ops at the new layout: f commutes with any transpose);
* the other operand y is reshaped (and transposed when its sized dims come in another
  order) to the sequential other operand's rank: each of its sized dims where the
  sequential dot pairs the dim it was paired with (batch, contracted) or in order among
  the free dims (sizes dividing), size-1 dims elsewhere;
* the dot takes the sequential dot's params; its result is reshaped to its sized dims,
  transposed to the old order of them and reshaped to the old result's shape.

Each sized dim keeps its role and its partner, so the new dot adds the same products;
size-1 dims batched, contracted or free change where the one index sits, never a value.
An identity of the distributed graph; the sequential program only chooses among equal
forms, so a wrong choice costs a relation, never soundness. tests/test_unit_roles.py
checks it numerically through the shared evaluator and where it must not fire.
"""
from __future__ import annotations

from typing import NamedTuple

from dlverify.ir import Graph, IdAllocator, Op
from dlverify.ops.table import BINARY, KINDS, Family
from dlverify.rewrites import _Rewriter

CHAIN_OPS = 4   # elementwise ops followed up from a dot operand to its transpose


class Rooted(NamedTuple):
    """A dot operand x = chain(transpose(u(root), perm)), u a reshape that only inserts
    or deletes size-1 dims (or none); `holds[k]`: the root dim x's dim k holds (None: a
    size-1 dim u made); `chain`: the elementwise ops from the transpose (or its operand)
    down to x, first to last; `plain`: no u."""

    root: int
    perm: tuple[int, ...]
    holds: tuple[int | None, ...]
    chain: tuple[Op, ...]
    plain: bool


def _scalar(producer: dict[int, Op], shape_of, t: int) -> bool:
    """Whether t is a broadcast of a rank-0 value (the same at every index)."""
    op = producer.get(t)
    return op is not None and op.kind == "broadcast_in_dim" and shape_of(op.inputs[0]) == ()


def _sized(shape: tuple[int, ...]) -> list[int]:
    return [d for d, n in enumerate(shape) if n > 1]


def rooted(producer: dict[int, Op], shape_of, t: int) -> Rooted | None:
    """t read as Rooted, or None when its producer chain is no such form (a graph input
    or a root with no producer is kept out: its kind says nothing)."""
    chain: list[Op] = []
    for _ in range(CHAIN_OPS + 1):
        op = producer.get(t)
        if op is None:
            return None
        kind = KINDS.get(op.kind)
        if kind is None or kind.family is not Family.ELEMENTWISE:
            break
        if op.kind == "neg" and len(op.inputs) == 1:
            nxt = op.inputs[0]
        elif kind.arity == BINARY and len(op.inputs) == 2 and \
                sum(_scalar(producer, shape_of, x) for x in op.inputs) == 1:
            nxt = next(x for x in op.inputs if not _scalar(producer, shape_of, x))
        else:
            break
        chain.append(op)
        t = nxt
    else:
        return None
    op = producer.get(t)
    if op is not None and op.kind == "transpose":
        mid, perm = op.inputs[0], tuple(op.params["permutation"])
    else:
        mid, perm = t, tuple(range(len(shape_of(t))))
    op = producer.get(mid)
    ms = shape_of(mid)
    if op is not None and op.kind == "reshape" and \
            [n for n in ms if n > 1] == [n for n in shape_of(op.inputs[0]) if n > 1]:
        root = op.inputs[0]
        of_mid: dict[int, int | None] = dict.fromkeys(range(len(ms)))
        of_mid.update(zip(_sized(ms), _sized(shape_of(root))))
        plain = False
    else:
        root, of_mid, plain = mid, {d: d for d in range(len(ms))}, True
    if producer.get(root) is None:
        return None
    return Rooted(root, perm, tuple(of_mid[d] for d in perm), tuple(reversed(chain)), plain)


def _role(p: dict, key: str, d: int) -> str:
    return "batch" if d in p[f"{key}_batch"] else "contract" if d in p[f"{key}_contract"] else "free"


def root_roles(p: dict, key: str, holds: tuple[int | None, ...], rank: int) -> tuple[str, ...]:
    """The role of each root dim: operand dim k holds root dim holds[k] ("" for a root
    dim no operand dim holds, a size-1 dim a reshape deleted)."""
    out = [""] * rank
    for k, i in enumerate(holds):
        if i is not None:
            out[i] = _role(p, key, k)
    return tuple(out)


class SeqForm(NamedTuple):
    """A sequential dot read from one side: the root's op kind and shape, the operand's
    permutation, the root dims' roles, the dot's params and operand shapes, the side."""

    kind: str
    root_shape: tuple[int, ...]
    perm: tuple[int, ...]
    roles: tuple[str, ...]
    params: tuple
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    side: int


def _frozen(p: dict) -> tuple:
    return tuple((k, tuple(p[k])) for k in ("lhs_batch", "lhs_contract", "rhs_batch", "rhs_contract"))


def seq_forms(g: Graph) -> list[SeqForm]:
    producer, shape_of = g.producer(), (lambda t: g.tensors[t].shape)
    out = []
    for op in g.ops:
        if op.kind != "dot_general" or len(op.inputs) != 2:
            continue
        for side, key in ((0, "lhs"), (1, "rhs")):
            r = rooted(producer, shape_of, op.inputs[side])
            if r is not None:
                if not r.plain:              # (the form the dist operand is rewritten into)
                    continue
                out.append(SeqForm(producer[r.root].kind, shape_of(r.root), r.perm,
                                   root_roles(op.params, key, r.holds, len(r.perm)),
                                   _frozen(op.params),
                                   (shape_of(op.inputs[0]), shape_of(op.inputs[1])), side))
    return out


class _UnitRoles(_Rewriter):
    def __init__(self, graph: Graph, ids: IdAllocator, forms: list[SeqForm]) -> None:
        super().__init__(graph, ids)
        self.forms = forms

    def apply(self, op: Op) -> bool:
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        for side in (0, 1):
            if self._as_form(op, side):
                return True
        return False

    def _candidates(self, op: Op, side: int, r: Rooted) -> tuple[list[SeqForm], bool]:
        """The sequential forms whose sized roles agree with op's, and whether one agrees
        on every dim."""
        kind, rs = self.producer_kind(r.root), self.shape(r.root)
        mine = root_roles(op.params, ("lhs", "rhs")[side], r.holds, len(rs))
        fits, exact = [], False
        for f in self.forms:
            if f.kind != kind or len(f.root_shape) != len(rs) or \
                    any(n % m for m, n in zip(rs, f.root_shape)):
                continue
            if all(a == b for a, b, m in zip(mine, f.roles, rs) if m > 1):
                exact = exact or r.plain and f.roles == mine and f.perm == r.perm
                fits.append(f)
        return fits, exact

    def producer_kind(self, t: int) -> str:
        op = self.producer.get(t)
        return op.kind if op is not None else ""

    def _as_form(self, op: Op, side: int) -> bool:
        r = rooted(self.producer, self.shape, op.inputs[side])
        if r is None or 1 not in self.shape(r.root):
            return False
        fits, exact = self._candidates(op, side, r)
        forms = {(f.perm, f.params, f.shapes, f.side) for f in fits}
        if exact or len(forms) != 1:
            return False
        f = fits[0]
        return self._rewrite(op, side, r, f)

    def _rewrite(self, op: Op, side: int, r: Rooted, f: SeqForm) -> bool:
        p = op.params
        q = {**p, **dict(f.params)}
        key, okey = ("lhs", "rhs")[side], ("lhs", "rhs")[1 - side]
        skey, sokey = ("lhs", "rhs")[f.side], ("lhs", "rhs")[1 - f.side]
        y = op.inputs[1 - side]
        ys = self.shape(y)
        rs = self.shape(r.root)
        inv_s = {i: k for k, i in enumerate(f.perm)}     # root dim -> new operand dim
        # the other operand's dims: which of y's sized dims each new dim holds (None: size 1)
        other_rank = len(f.shapes[1 - f.side])
        holds: list[int | None] = [None] * other_rank
        for role in ("batch", "contract"):
            for k, m in zip(p[f"{key}_{role}"], p[f"{okey}_{role}"]):
                if ys[m] == 1:
                    continue
                kn = inv_s[r.holds[k]]
                mine = list(q[f"{skey}_{role}"])
                if kn not in mine:
                    return False
                holds[q[f"{sokey}_{role}"][mine.index(kn)]] = m
        y_free = [m for m in range(len(ys)) if ys[m] > 1 and m not in p[f"{okey}_batch"]
                  and m not in p[f"{okey}_contract"]]
        s_free = [m for m in range(other_rank) if m not in q[f"{sokey}_batch"]
                  and m not in q[f"{sokey}_contract"]]
        theirs = f.shapes[1 - f.side]
        for m in y_free:                     # in order, sizes dividing
            while s_free and theirs[s_free[0]] % ys[m]:
                s_free.pop(0)
            if not s_free:
                return False
            holds[s_free.pop(0)] = m
        sized_y = [m for m in range(len(ys)) if ys[m] > 1]
        if sorted(m for m in holds if m is not None) != sized_y:
            return False
        # the result's dims named by what they hold: ("x", root dim) or ("y", y's dim)
        new_shape = tuple(rs[i] for i in f.perm)
        other_shape = tuple(1 if m is None else ys[m] for m in holds)
        shapes = [new_shape, other_shape][:: 1 if f.side == 0 else -1]
        out_shape = _dot_shape(q, *shapes)
        new_names = _out_names(q, [len(t) for t in shapes], f.side, f.perm, holds)
        old_names = _out_names(p, [len(self.shape(t)) for t in op.inputs], side, r.holds,
                               list(range(len(ys))))
        old_shape = self.shape(op.output)
        new_sized = [n for n, s in zip(new_names, out_shape) if s > 1]
        old_sized = [n for n, s in zip(old_names, old_shape) if s > 1]
        if sorted(new_sized, key=repr) != sorted(old_sized, key=repr):
            return False                     # (not reached when the roles agree: a guard)
        dtype = self.g.tensors[op.output].dtype
        # the operand in the sequential layout, the elementwise chain rebuilt on it
        x = r.root if f.perm == tuple(range(len(rs))) else \
            self.new_op("transpose", [r.root], new_shape, self.g.tensors[r.root].dtype,
                        {"permutation": f.perm}, op)
        for c in r.chain:
            ins = [x if not self._is_scalar(t) else self._scalar_at(t, new_shape, c)
                   for t in c.inputs]
            x = self.new_op(c.kind, ins, new_shape, self.g.tensors[c.output].dtype,
                            dict(c.params), c)
        # the other operand: its sized dims in the order the new dims hold them
        order = [m for m in holds if m is not None]
        yt = y
        if any(n == 1 for n in ys):
            yt = self.new_op("reshape", [yt], tuple(ys[m] for m in sized_y),
                             self.g.tensors[y].dtype, {}, op)
        if order != sized_y:
            at = {m: i for i, m in enumerate(sized_y)}
            yt = self.new_op("transpose", [yt], tuple(ys[m] for m in order),
                             self.g.tensors[y].dtype, {"permutation": tuple(at[m] for m in order)}, op)
        if other_shape != self.shape(yt):
            yt = self.new_op("reshape", [yt], other_shape, self.g.tensors[y].dtype, {}, op)
        z = self.new_op("dot_general", [x, yt] if f.side == 0 else [yt, x], out_shape, dtype, q, op)
        sizes = dict(zip(new_names, out_shape))
        if new_sized != old_sized:           # (a reshape to the sized dims, moved, reshaped)
            if 1 in out_shape:
                z = self.new_op("reshape", [z], tuple(sizes[n] for n in new_sized), dtype, {}, op)
                at = {n: i for i, n in enumerate(new_sized)}
                z = self.new_op("transpose", [z], tuple(sizes[n] for n in old_sized), dtype,
                                {"permutation": tuple(at[n] for n in old_sized)}, op)
        self.new_op("reshape", [z], old_shape, dtype, {}, op, output=op.output)
        return True

    def _is_scalar(self, t: int) -> bool:
        return _scalar(self.producer, self.shape, t)

    def _scalar_at(self, t: int, shape: tuple[int, ...], like: Op) -> int:
        b = self.producer[t]
        return self.new_op("broadcast_in_dim", [b.inputs[0]], shape, self.g.tensors[t].dtype,
                           {"broadcast_dimensions": ()}, like)


def _dot_shape(q: dict, ls: tuple[int, ...], rs: tuple[int, ...]) -> tuple[int, ...]:
    free = [[n for d, n in enumerate(s) if d not in q[f"{k}_batch"] and d not in q[f"{k}_contract"]]
            for s, k in ((ls, "lhs"), (rs, "rhs"))]
    return tuple(ls[d] for d in q["lhs_batch"]) + tuple(free[0]) + tuple(free[1])


def _out_names(q: dict, ranks: list[int], x_side: int, xperm: tuple[int | None, ...],
               ytable: list) -> list[tuple]:
    """Each result dim named by what it holds: ("x", root dim) for a dim of the rooted
    operand (a batch pair by that operand's dim), ("y", y's dim) for the other operand's,
    whose dim d holds y's dim ytable[d] (None: a size-1 dim the rewrite made, named by
    its position, which names no sized dim)."""
    keys = ("lhs", "rhs")
    def name(side: int, d: int) -> tuple:
        if side == x_side:
            return ("x", xperm[d]) if xperm[d] is not None else ("unit", side, d)
        return ("y", ytable[d]) if ytable[d] is not None else ("unit", side, d)
    xkey = keys[x_side]
    out = [name(x_side, d) for d in q[f"{xkey}_batch"]]
    for side, key in enumerate(keys):
        out += [name(side, d) for d in range(ranks[side])
                if d not in q[f"{key}_batch"] and d not in q[f"{key}_contract"]]
    return out


def unit_roles_as_sequential(seq: Graph, dist: Graph, ids: IdAllocator) -> bool:
    """Rewrite `dist` in place (see the module docstring); whether anything changed."""
    forms = seq_forms(seq)
    return bool(forms) and _UnitRoles(dist, ids, forms).run()


__all__ = ["rooted", "root_roles", "seq_forms", "unit_roles_as_sequential"]
