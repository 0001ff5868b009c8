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
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dlverify.ir import Graph, IdAllocator, Op, Tensor
from dlverify.softmax_form import Source, source_of


@dataclass(frozen=True)
class Shift:
    """sum_i coef_i * k_i over per-row statistics k_i (tensor ids of their
    sources), placed at `dims` of the tensor it belongs to (the dims indexing the
    statistics' dims of size > 1, in order). Zero coefficients are dropped."""

    coefs: tuple[tuple[int, int], ...]   # (statistic, coefficient), sorted by statistic
    dims: tuple[int, ...]

    @staticmethod
    def of(coefs: dict[int, int], dims: tuple[int, ...]) -> "Shift":
        return Shift(tuple(sorted((k, c) for k, c in coefs.items() if c != 0)), dims)

    def plus(self, other: "Shift") -> "Shift":
        total = dict(self.coefs)
        for k, c in other.coefs:
            total[k] = total.get(k, 0) + c
        return Shift.of(total, self.dims)

    def at(self, dims: tuple[int, ...]) -> "Shift":
        return Shift(self.coefs, dims)

    @property
    def zero(self) -> bool:
        return not self.coefs


@dataclass(frozen=True)
class ExpForm:
    """e = exp(base + shift): `base` the one summand that is not a statistic
    (None for a factor, an exponential of statistics only)."""

    base: int | None
    shift: Shift


@dataclass
class _Emitted:
    """New ops of one exit, in order."""

    ops: list[Op] = field(default_factory=list)


def _big(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(i for i, n in enumerate(shape) if n != 1)


UNKNOWN = Shift((), (-1,))   # net(): statistics reach the value through an op not modelled


class _Merges:
    LINEAR_UNARY = ("neg", "convert_element_type", "copy")

    def __init__(self, g: Graph, ids: IdAllocator) -> None:
        self.g = g
        self.ids = ids
        self.producer = {op.output: op for op in g.ops}
        self.position = {op.output: i for i, op in enumerate(g.ops)}
        self.consumers: dict[int, list[Op]] = {}
        for op in g.ops:
            for t in op.inputs:
                self.consumers.setdefault(t, []).append(op)
        self.forms: dict[int, ExpForm] = {}
        self._classify()
        # statistics some factor rescales by: the running maxima of an online softmax;
        # transient ones are rescaled away later (a factor adds them back), the last is final
        factors = [f for f in self.forms.values() if f.base is None]
        self.rescaled = {k for f in factors for k, _ in f.shift.coefs}
        self.transient = {k for f in factors for k, c in f.shift.coefs if c > 0}
        self._factor_memo: dict[int, bool] = {}
        self._net_memo: dict[int, Shift | None] = {}
        self._raw_memo: dict[int, Shift | None] = {}

    def shape(self, t: int) -> tuple[int, ...]:
        return self.g.tensors[t].shape

    def source(self, t: int) -> Source:
        return source_of(self.g, self.producer, t)

    # ---------------------------------------------------------------- exponentials
    def _summands(self, x: int, sign: int, out: list[tuple[int, int]], depth: int = 0) -> None:
        """x as a signed sum of leaves through add, sub and neg (all of x's shape); a
        chain deeper than 16 ends in a leaf."""
        op = self.producer.get(x)
        if depth < 16 and op is not None and op.kind in ("add", "sub") and \
                all(self.shape(i) == self.shape(x) for i in op.inputs):
            self._summands(op.inputs[0], sign, out, depth + 1)
            self._summands(op.inputs[1], sign if op.kind == "add" else -sign, out, depth + 1)
        elif depth < 16 and op is not None and op.kind == "neg":
            self._summands(op.inputs[0], -sign, out, depth + 1)
        else:
            out.append((x, sign))

    def _classify(self) -> None:
        """Statistics first (shifts of exponentials: constant along some big dim of
        the exponential), then every exponential that is base + statistics."""
        split: dict[int, list[tuple[int, int]]] = {}
        stats: set[int] = set()
        for op in self.g.ops:
            if op.kind != "exp":
                continue
            leaves: list[tuple[int, int]] = []
            self._summands(op.inputs[0], 1, leaves)
            split[op.output] = leaves
            big = set(_big(self.shape(op.output)))
            for leaf, _ in leaves:
                src = self.source(leaf)
                if set(src.dims) < big and src.dims:
                    stats.add(src.src)
        for e, leaves in split.items():
            big = _big(self.shape(e))
            bases, coefs, dims = [], {}, None
            for leaf, sign in leaves:
                src = self.source(leaf)
                if src.src in stats:
                    if dims is not None and dims != src.dims:
                        dims = ()
                        break
                    dims = src.dims
                    coefs[src.src] = coefs.get(src.src, 0) + sign
                else:
                    bases.append((leaf, sign))
            if dims is None or dims == () or len(bases) > 1 or (bases and bases[0][1] != 1):
                continue
            if not bases and tuple(dims) != big:
                continue   # a factor must be row-shaped: its big dims are the statistics'
            shift = Shift.of(coefs, dims)
            self.forms[e] = ExpForm(bases[0][0] if bases else None, shift)

    def factor_at(self, t: int) -> Shift | None:
        """The shift of t when t repeats a factor (through broadcasts), placed in t."""
        src = self.source(t)
        form = self.forms.get(src.src)
        if form is None or form.base is not None:
            return None
        # the factor's big dims are the statistics' dims, in order: src.dims places them in t
        return form.shift.at(src.dims)

    # ---------------------------------------------------------------- where factors flow
    def has_factor(self, t: int) -> bool:
        """Does t multiply by a factor through ops the rewrite passes?"""
        if t in self._factor_memo:
            return self._factor_memo[t]
        self._factor_memo[t] = False     # cycles cannot occur; guards deep recursion
        op = self.producer.get(t)
        res = False
        if op is not None:
            if op.kind == "mul" and any(self.factor_at(i) is not None for i in op.inputs) or \
                    self.mismatch(op) is not None:
                res = True
            elif op.kind in ("add", "sub", "mul", "dot_general", "reduce_sum", "broadcast_in_dim",
                             "reshape", "transpose") + self.LINEAR_UNARY:
                res = any(self.has_factor(i) for i in op.inputs)
            elif op.kind == "div":
                res = self.has_factor(op.inputs[0]) and not self.has_factor(op.inputs[1])
        self._factor_memo[t] = res
        return res

    # ---------------------------------------------------------------- net shifts
    def net(self, t: int) -> Shift | None:
        """The shift n with t = exp(n) * (a value no transient statistic shifts), placed
        in t: None for a plain value (no exponential of the algebra below it, or
        one shifted by final statistics only, as the sequential program's are), UNKNOWN
        when statistics reach t through ops the algebra does not model. Only routes
        shifts: every rewrite keeps values whatever it says."""
        if t not in self._net_memo:
            self._net_memo[t] = UNKNOWN     # guards deep recursion; graphs are acyclic
            n = self._net(t, self.net)
            if n is not None and n is not UNKNOWN and all(k not in self.transient for k, _ in n.coefs):
                n = None    # shifted by final statistics only, as the sequential program is
            self._net_memo[t] = n
        return self._net_memo[t]

    def _raw_net(self, t: int) -> Shift | None:
        """net() without setting final statistics aside."""
        if t not in self._raw_memo:
            self._raw_memo[t] = UNKNOWN
            self._raw_memo[t] = self._net(t, self._raw_net)
        return self._raw_memo[t]

    def known(self, t: int) -> Shift | None:
        """net(t) when it is a shift, else None."""
        n = self.net(t)
        return None if n is None or n is UNKNOWN else n

    def raw(self, t: int) -> Shift | None:
        """t's whole shift (final statistics included) when it is one, else None."""
        n = self._raw_net(t)
        return None if n is None or n is UNKNOWN else n

    def _net(self, t: int, net) -> Shift | None:
        if t in self.forms:
            return self.forms[t].shift
        op = self.producer.get(t)
        if op is None:
            return None
        k, ins = op.kind, op.inputs
        nets = [net(i) for i in ins]
        if all(n is None for n in nets):
            return None
        if any(n is UNKNOWN for n in nets):
            return UNKNOWN
        if k == "mul":     # a product adds the shifts (a plain operand has none)
            shifts = [n for n in nets if n is not None]
            if len(shifts) == 2 and shifts[0].dims != shifts[1].dims:
                return UNKNOWN
            return shifts[0] if len(shifts) == 1 else shifts[0].plus(shifts[1])
        if k in ("add", "sub"):
            na, nb = nets
            if na is None or nb is None or na.dims != nb.dims:
                return UNKNOWN
            return na if na == nb else self._newer(na, nb)
        if k == "dot_general":
            return self._net_dot(op, nets)
        n = nets[0]
        if n is None or any(m is not None for m in nets[1:]) and k != "div" or \
                k == "div" and nets[1] is not None:
            return UNKNOWN
        if k in self.LINEAR_UNARY or k == "div":
            return n
        if k == "broadcast_in_dim":
            return Shift(n.coefs, tuple(op.params["broadcast_dimensions"][d] for d in n.dims))
        if k == "transpose":       # output dim j is operand dim perm[j]
            return Shift(n.coefs, tuple(list(op.params["permutation"]).index(d) for d in n.dims))
        if k == "reshape":
            a, out = _big(self.shape(ins[0])), _big(self.shape(t))
            if len(a) != len(out) or any(d not in a for d in n.dims):
                return UNKNOWN
            return Shift(n.coefs, tuple(out[a.index(d)] for d in n.dims))
        if k == "reduce_sum":
            axes = op.params["axes"]
            if any(d in axes for d in n.dims):
                return UNKNOWN
            kept = [i for i in range(len(self.shape(ins[0]))) if i not in axes]
            return Shift(n.coefs, tuple(kept.index(d) for d in n.dims))
        return UNKNOWN

    def _net_dot(self, op: Op, nets: list) -> Shift | None:
        """The product's shift: the shifted operand's, on its free or batch dims."""
        p = op.params
        a, b = op.inputs
        na, nb = nets
        if na is not None and nb is not None:
            return UNKNOWN
        side, n = (0, na) if na is not None else (1, nb)
        contract, batch = (p["lhs_contract"], p["lhs_batch"]) if side == 0 else \
            (p["rhs_contract"], p["rhs_batch"])
        rank = len(self.shape(op.inputs[side]))
        free = [i for i in range(rank) if i not in contract and i not in batch]
        first = len(batch) + (0 if side == 0 else len(
            [i for i in range(len(self.shape(a))) if i not in p["lhs_contract"] and i not in p["lhs_batch"]]))
        out = []
        for d in n.dims:
            if d in batch:
                out.append(list(batch).index(d))
            elif d in free:
                out.append(first + free.index(d))
            else:
                return UNKNOWN    # on a contracted dim: the sum mixes rows of several shifts
        return Shift(n.coefs, tuple(out))

    def _newer(self, a: Shift, b: Shift) -> Shift:
        """Of two shifts an add meets, the one the program merges into: a plain softmax
        shift (one statistic subtracted once, as in exp(s - m)) over anything a rescale
        produced, else the one with the statistic computed last (the other is stale)."""
        plain = [x for x in (a, b) if len(x.coefs) == 1 and x.coefs[0][1] == -1]
        if len(plain) == 1:
            return plain[0]
        last = max(self.position.get(k, -1) for k, _ in a.coefs + b.coefs)
        return a if any(self.position.get(k, -1) == last for k, _ in a.coefs) else b

    def mismatch(self, op: Op) -> Shift | None:
        """The shift an add or sub of two values shifted by different running statistics
        (each one a factor rescales by) aligns to: the merge the rescale should have
        aligned. None when the operands agree (or are no such values)."""
        if op.kind not in ("add", "sub"):
            return None
        na, nb = self.raw(op.inputs[0]), self.raw(op.inputs[1])
        if na is None or nb is None or na == nb or na.dims != nb.dims or \
                any(k not in self.rescaled for k, _ in na.coefs + nb.coefs):
            return None
        return self._newer(na, nb)

    def exits(self) -> list[int]:
        """Tensors a factor flows into that are read by an op outside the algebra
        (or are outputs): each is rewritten as a whole."""
        outs = set(self.g.outputs)
        return [op.output for op in self.g.ops if self.has_factor(op.output) and (
            op.output in outs or any(not self.has_factor(c.output)
                                     for c in self.consumers.get(op.output, [])))]

    # ---------------------------------------------------------------- the rewrite
    def new(self, kind: str, ins: list[int], shape: tuple[int, ...], like: Op, em: _Emitted,
            params: dict | None = None) -> int:
        t = self.ids()
        self.g.tensors[t] = Tensor(t, shape, self.g.tensors[like.output].dtype)
        em.ops.append(Op(self.ids(), kind, ins, t, params or {}, like.loc, like.name))
        return t

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
        if [self.shape(stat)[i] for i in _big(self.shape(stat))] != [shape[d] for d in dims]:
            raise _Refused     # the statistic's dims do not fit where the shift places them
        if self.shape(stat) == shape and self.source(stat) == Source(stat, dims):
            return stat
        x = stat
        if len(_big(self.shape(stat))) != len(self.shape(stat)):
            x = self.new("reshape", [stat], tuple(self.shape(stat)[i] for i in _big(self.shape(stat))),
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
            for i in (0, 1):
                f = self.factor_at(op.inputs[i])
                if f is not None and self.shape(op.inputs[1 - i]) == self.shape(t):
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
                gs[1 - s] = _negated(other)
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
            pos = {d: j for j, d in enumerate(_big(self.shape(t)))}
            if any(d not in pos for d in g.dims):
                raise _Refused
            dims = tuple(_big(self.shape(a))[pos[d]] for d in g.dims)
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

    def _absorbs(self, t: int) -> bool:
        """Can an exponential below t take a shift (t is linear in one)?"""
        if t in self.forms and self.forms[t].base is not None:
            return True
        op = self.producer.get(t)
        if op is None:
            return False
        if op.kind in ("add", "sub"):
            return all(self._absorbs(i) for i in op.inputs)
        if op.kind in ("broadcast_in_dim", "reshape", "transpose", "reduce_sum", "div") + \
                self.LINEAR_UNARY:
            return self._absorbs(op.inputs[0])
        if op.kind in ("mul", "dot_general"):
            return any(self._absorbs(i) for i in op.inputs)
        return False

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
            for j, add in ((side, _negated(n)), (1 - side, moved)):
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


def _negated(n: Shift) -> Shift:
    return Shift(tuple((k, -c) for k, c in n.coefs), n.dims)


class _Refused(Exception):
    """A factor meets an op it cannot be pushed through: the exit stays as it is."""


def shift_free_merges(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite the online-softmax merges of g (module doc). Returns whether anything
    changed; ops left without consumers are for the caller's dead-op pass."""
    return _Merges(g, ids).rewrite()
