"""The online softmax's merges in canonical form: an exact rewrite (over the reals).

Ring attention and flash decoding never hold a whole row of scores. Each step j
sees one block s_j of it, takes a running max m_j = max(m_{j-1}, max s_j) and
rescales what it has accumulated so far by the factor exp(m_{j-1} - m_j):

    l_j = l_{j-1} * exp(m_{j-1} - m_j) + sum exp(s_j - m_j)
    o_j = o_{j-1} * exp(m_{j-1} - m_j) + exp(s_j - m_j) @ v_j.

No op-by-op rule relates `exp(s_j - m_j)` to the sequential `exp(S - M)`: m_j is
the max of the blocks seen so far, a value the sequential program never
computes. But the factors telescope. For per-row values k_i (any reals),

    exp(x + sum_i c_i k_i) * exp(sum_i g_i k_i) = exp(x + sum_i (c_i + g_i) k_i),   (1)

and multiplying by a per-row factor E commutes with every linear op that keeps
the row: (a + b) E = a E + b E, (A E) @ B = (A @ B) E when E varies only along
free dims of A, sum_a(A E) = sum_a(A) E when a is not a row dim, and with
broadcasts and reshapes that carry the rows along. So o_N equals, exactly,

    o_N = sum_j exp(s_j - m_N) @ v_j,    l_N = sum_j sum exp(s_j - m_N),

terms that are blocks of the sequential exp(S - M) @ V and sum exp(S - M) once
m_N (the max over all blocks) is related to M: the partial-sum and cyclic-range
rules (datalog/partials.dl, datalog/ring_ranges.dl) do the rest. This pass
rewrites such values into that form. Every step is (1) or a linearity above, so
each rewritten tensor keeps its value: any consumer (a backward pass included)
sees the same number.

Which values are per-row statistics is decided structurally, never by names: a
statistic is what an exponential's argument subtracts (or adds) through
broadcasts that do not vary along some dim of the exponential (the shift of a
softmax, dlverify/softmax_form.py). A factor is an exponential whose argument
is a signed sum of statistics only. The rewrite starts at the values a factor
multiplication flows into (the "exits": consumed by an op the algebra does not
pass) and pushes each factor down to the exponentials below it, where the
coefficients of (1) are added and the ones that cancel are dropped. Where a
factor cannot be pushed (a statistic placed on a contracted or reduced dim, a
value that is not an exponential), that exit is left as it was.

Also identities, each keeping the value: a product a * b (elementwise, or
contracted over the rows the shift sits on) is (a exp(n)) (b exp(-n)), so the
shift n a backward pass carries on a cotangent moves onto the exponential it
cancels against; 0 * x = 0 (an accumulator starting at zeros, rescaled by
exp(-inf - m)); and an add of two values shifted by different running maxima
(a merge whose rescale is missing or wrong) is written a exp(t - n) * exp(n - t)
+ b with t the shift of b: the explicit factor exp(n - t) relates to nothing
sequential and carries the add's source line, so the report points at the
merge. Which shift each value carries (dlverify/shift_algebra.py) only routes
the rewrite; the values never depend on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op
from dlverify.shift_algebra import Shift, ShiftAnalysis, big_dims, negated
from dlverify.softmax_form import Source


@dataclass
class _Emitted:
    """New ops of one exit, in order."""

    ops: list[Op] = field(default_factory=list)


class _Merges(ShiftAnalysis):
    def __init__(self, g: Graph, ids: IdAllocator) -> None:
        super().__init__(g)
        self.ids = ids

    def new(self, kind: str, ins: list[int], shape: tuple[int, ...], like: Op, em: _Emitted,
            params: dict | None = None) -> int:
        builder = GraphBuilder(Graph(self.g.name, tensors=self.g.tensors, ops=em.ops), self.ids)
        return builder.op(kind, ins, shape, self.g.tensors[like.output].dtype, params, like.loc,
                          like.name)

    def place(self, stat: int, shape: tuple[int, ...], dims: tuple[int, ...], before: int,
              em: _Emitted, like: Op) -> int:
        """Statistic `stat` broadcast to `shape` with its big dims at `dims`: an
        existing such tensor computed before position `before`, else new ops."""
        for op in self.consumers.get(stat, []) + [o for t in self._chain_users(stat)
                                                   for o in self.consumers.get(t, [])]:
            t = op.output
            if self.shape(t) == shape and self.position.get(t, before) < before and \
                    self.source(t) == Source(stat, dims):
                return t
        if [self.shape(stat)[i] for i in big_dims(self.shape(stat))] != [shape[d] for d in dims]:
            raise _Refused     # the statistic's dims do not fit where the shift places them
        if self.shape(stat) == shape and self.source(stat) == Source(stat, dims):
            return stat
        x = stat
        if len(big_dims(self.shape(stat))) != len(self.shape(stat)):
            x = self.new("reshape", [stat], tuple(self.shape(stat)[i] for i in big_dims(self.shape(stat))),
                         like, em)
        if list(dims) != sorted(dims):
            raise _Refused
        if self.shape(x) == shape:
            return x
        return self.new("broadcast_in_dim", [x], shape, like, em, {"broadcast_dimensions": tuple(dims)})

    def _chain_users(self, stat: int) -> list[int]:
        """Tensors that repeat `stat` through broadcasts and size-1 reshapes."""
        out, todo = [], [stat]
        while todo:
            t = todo.pop()
            for c in self.consumers.get(t, []):
                if c.kind in ("broadcast_in_dim", "reshape") and self.source(c.output).src == stat:
                    out.append(c.output)
                    todo.append(c.output)
        return out

    def push(self, t: int, g: Shift, before: int, em: _Emitted, memo: dict) -> int:
        """A tensor equal to t * exp(g) (g placed at g.dims of t): t itself when g is
        zero and no factor flows into t, else new ops. Raises _Refused."""
        key = (t, g)
        if key in memo:
            return memo[key]
        res = self._push(t, g, before, em, memo)
        memo[key] = res
        return res

    def _push(self, t: int, g: Shift, before: int, em: _Emitted, memo: dict) -> int:
        op = self.producer.get(t)
        form = self.forms.get(t)
        if form is not None and form.base is not None:          # (1) at an exponential
            if not g.zero and g.dims != form.shift.dims:
                raise _Refused
            total = form.shift.plus(g)
            if total == form.shift:
                return t
            x = form.base
            for stat, coef in total.coefs:
                placed = self.place(stat, self.shape(x), total.dims, before, em, op)
                for _ in range(abs(coef)):
                    x = self.new("add" if coef > 0 else "sub", [x, placed], self.shape(x),
                                 self.producer.get(op.inputs[0], op), em)
            return self.new("exp", [x], self.shape(t), op, em)
        if g.zero and not self.has_factor(t):
            return t
        if op is None:
            raise _Refused
        k = op.kind
        if k in ("add", "sub"):
            if any(self.shape(i) != self.shape(t) for i in op.inputs):
                raise _Refused
            target = self.mismatch(op)
            if target is not None:
                ins = [self._aligned(i, target, g, before, em, memo, op) for i in op.inputs]
                return self.new(k, ins, self.shape(t), op, em)
            ins = [self.push(i, g, before, em, memo) for i in op.inputs]
            return t if ins == op.inputs else self.new(k, ins, self.shape(t), op, em)
        if k in self.LINEAR_UNARY or (k == "div" and not self.has_factor(op.inputs[1])):
            ins = [self.push(op.inputs[0], g, before, em, memo)] + op.inputs[1:]
            if k == "div" and self.shape(op.inputs[1]) != self.shape(t):
                raise _Refused
            return t if ins == op.inputs else self.new(k, ins, self.shape(t), op, em, dict(op.params))
        if k == "mul":
            for z in op.inputs:     # 0 * x = 0 (x finite): an accumulator's zero start
                if self._zero(z) and self.shape(z) == self.shape(t):
                    return z
            for i in (0, 1):
                f = self.factor_at(op.inputs[i])
                if f is not None and self.shape(op.inputs[1 - i]) == self.shape(t) == \
                        self.shape(op.inputs[i]):
                    if not g.zero and g.dims != f.dims:
                        raise _Refused
                    return self.push(op.inputs[1 - i], f.plus(g) if not g.zero else f, before, em, memo)
            if any(self.shape(i) != self.shape(t) for i in op.inputs):
                raise _Refused
            # a product of two values: g goes to the one an exponential can absorb, and
            # so does the other's own shift, a * b = (a exp(n)) (b exp(-n))
            s = 0 if self._absorbs(op.inputs[0]) else 1
            gs = [Shift((), ()), Shift((), ())]
            gs[s] = g
            other = self.known(op.inputs[1 - s])
            if other is not None and not other.zero and self._absorbs(op.inputs[s]):
                if not g.zero and g.dims != other.dims:
                    raise _Refused
                gs[s] = other if g.zero else g.plus(other)
                gs[1 - s] = negated(other)
            ins = [self.push(i, gs[j], before, em, memo) for j, i in enumerate(op.inputs)]
            return t if ins == op.inputs else self.new(k, ins, self.shape(t), op, em)
        if k == "broadcast_in_dim":
            bd = op.params["broadcast_dimensions"]
            a = op.inputs[0]
            dims = []
            for d in g.dims:
                if d not in bd or self.shape(a)[bd.index(d)] != self.shape(t)[d]:
                    raise _Refused
                dims.append(bd.index(d))
            x = self.push(a, Shift(g.coefs, tuple(dims)), before, em, memo)
            return t if x == a else self.new(k, [x], self.shape(t), op, em, dict(op.params))
        if k == "transpose":
            a = op.inputs[0]
            x = self.push(a, Shift(g.coefs, tuple(op.params["permutation"][d] for d in g.dims)),
                          before, em, memo)
            return t if x == a else self.new(k, [x], self.shape(t), op, em, dict(op.params))
        if k == "reshape":
            a = op.inputs[0]
            if [n for n in self.shape(a) if n != 1] != [n for n in self.shape(t) if n != 1]:
                raise _Refused
            pos = {d: j for j, d in enumerate(big_dims(self.shape(t)))}
            if any(d not in pos for d in g.dims):
                raise _Refused
            dims = tuple(big_dims(self.shape(a))[pos[d]] for d in g.dims)
            x = self.push(a, Shift(g.coefs, dims), before, em, memo)
            return t if x == a else self.new(k, [x], self.shape(t), op, em, dict(op.params))
        if k == "reduce_sum":
            a = op.inputs[0]
            kept = [i for i in range(len(self.shape(a))) if i not in op.params["axes"]]
            x = self.push(a, Shift(g.coefs, tuple(kept[d] for d in g.dims)), before, em, memo)
            return t if x == a else self.new(k, [x], self.shape(t), op, em, dict(op.params))
        if k == "dot_general":
            return self._push_dot(t, op, g, before, em, memo)
        raise _Refused

    def _zero(self, t: int) -> bool:
        """t repeats a constant 0 (through broadcasts)."""
        src = self.producer.get(self.source(t).src)
        return src is not None and src.kind == "constant" and \
            bool(np.all(np.asarray(src.params.get("value")) == 0))

    def _aligned(self, x: int, target: Shift, g: Shift, before: int, em: _Emitted, memo: dict,
                 at: Op) -> int:
        """x * exp(g) as (x * exp(g + target - net(x))) * exp(net(x) - target): the
        first part shifted like the other operand of the add `at`, the second an
        explicit factor written at `at` (it relates to nothing sequential when the
        program forgot a rescale, and that is where the report points)."""
        n = self.raw(x)
        if n == target:
            return self.push(x, g, before, em, memo)
        minus = Shift.of({k: -c for k, c in target.coefs}, n.dims)   # -target
        if not g.zero and g.dims != n.dims:
            raise _Refused
        y = self.push(x, Shift.of(dict(g.coefs), n.dims).plus(target.at(n.dims)).plus(
            Shift.of({k: -c for k, c in n.coefs}, n.dims)), before, em, memo)
        rows = tuple(self.shape(x)[d] for d in n.dims)
        rest = n.plus(minus)
        e = None
        for stat, coef in rest.coefs:
            placed = self.place(stat, rows, tuple(range(len(rows))), before, em, at)
            for _ in range(abs(coef)):
                if e is None:
                    e = placed if coef > 0 else self.new("neg", [placed], rows, at, em)
                else:
                    e = self.new("add" if coef > 0 else "sub", [e, placed], rows, at, em)
        factor = self.new("exp", [e], rows, at, em)
        if list(n.dims) != sorted(n.dims):
            raise _Refused
        wide = self.new("broadcast_in_dim", [factor], self.shape(x), at, em,
                        {"broadcast_dimensions": tuple(n.dims)})
        return self.new("mul", [y, wide], self.shape(x), at, em)


    def _push_dot(self, t: int, op: Op, g: Shift, before: int, em: _Emitted, memo: dict) -> int:
        p = op.params
        a, b = op.inputs
        ra, rb = len(self.shape(a)), len(self.shape(b))
        nb = len(p["lhs_batch"])
        free_a = [i for i in range(ra) if i not in p["lhs_contract"] and i not in p["lhs_batch"]]
        free_b = [i for i in range(rb) if i not in p["rhs_contract"] and i not in p["rhs_batch"]]
        # output dim -> (operand, its dim): batch dims belong to both, free dims to one
        where: dict[int, list[tuple[int, int]]] = {}
        for j, (la, lb) in enumerate(zip(p["lhs_batch"], p["rhs_batch"])):
            where[j] = [(0, la), (1, lb)]
        for j, d in enumerate(free_a):
            where[nb + j] = [(0, d)]
        for j, d in enumerate(free_b):
            where[nb + len(free_a) + j] = [(1, d)]
        ga, gb = Shift((), ()), Shift((), ())
        if not g.zero:
            sides = [s for s in (0, 1) if all(any(o == s for o, _ in where[d]) for d in g.dims)]
            sides.sort(key=lambda s: not self._absorbs(op.inputs[s]))
            if not sides:
                raise _Refused
            s = sides[0]
            dims = tuple(next(dd for o, dd in where[d] if o == s) for d in g.dims)
            if s == 0:
                ga = Shift(g.coefs, dims)
            else:
                gb = Shift(g.coefs, dims)
        # an operand's own shift on contracted (or batch) dims moves to the other operand
        # when an exponential there can absorb it: (a exp(n)) @ (b exp(-n)) = a @ b
        shared = [(list(p["lhs_contract"]) + list(p["lhs_batch"])),
                  (list(p["rhs_contract"]) + list(p["rhs_batch"]))]
        gs = [ga, gb]
        for side in (0, 1):
            n = self.known(op.inputs[side])
            if n is None or n.zero or not self._absorbs(op.inputs[1 - side]) or \
                    self._absorbs(op.inputs[side]) or any(d not in shared[side] for d in n.dims):
                continue
            moved = Shift(n.coefs, tuple(shared[1 - side][shared[side].index(d)] for d in n.dims))
            for j, add in ((side, negated(n)), (1 - side, moved)):
                if not gs[j].zero and gs[j].dims != add.dims:
                    raise _Refused
                gs[j] = add if gs[j].zero else gs[j].plus(add)
        ga, gb = gs
        x, y = self.push(a, ga, before, em, memo), self.push(b, gb, before, em, memo)
        return t if [x, y] == op.inputs else self.new("dot_general", [x, y], self.shape(t), op, em,
                                                      dict(p))

    def rewrite(self) -> bool:
        """Rewrite every exit; an exit whose factors cannot all be pushed stays. The
        analysis reads the graph as given (every rewrite keeps each value, so it stays
        true); each exit's new ops go right before its producer, which they replace."""
        memo: dict = {}   # shared: an exponential two exits push the same shift into is made once
        replaced: dict[int, list[Op]] = {}
        for t in self.exits():
            em = _Emitted()
            kept = dict(memo)
            try:
                new = self.push(t, Shift((), ()), self.position[t], em, memo)
            except _Refused:
                new = t
            if new == t or not em.ops or em.ops[-1].output != new:
                for o in em.ops:
                    del self.g.tensors[o.output]
                memo = kept
                continue
            em.ops[-1].output = t          # the last new op computes t itself
            del self.g.tensors[new]
            memo = {key: (t if v == new else v) for key, v in memo.items()}
            replaced[self.producer[t].id] = em.ops
        if replaced:
            self.g.ops = [o for op in self.g.ops for o in replaced.get(op.id, [op])]
        return bool(replaced)



class _Refused(Exception):
    """A factor meets an op it cannot be pushed through: the exit stays as it is."""


def shift_free_merges(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite the online-softmax merges of g (module doc). Returns whether anything
    changed; ops left without consumers are for the caller's dead-op pass."""
    return _Merges(g, ids).rewrite()
