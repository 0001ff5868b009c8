"""Net shifts of the online softmax's values: the analysis dlverify/online_softmax.py
rewrites by (its module doc states the algebra and the theorem).

A statistic is what an exponential's argument subtracts (or adds) through
broadcasts that do not vary along some dim of the exponential (the shift of a
softmax); a factor is an exponential of statistics only. The net shift of a
value says by which exp(sum c_k k) it is scaled. It only decides where the
rewrite routes each shift: every rewrite keeps every value whatever it says.
"""
from __future__ import annotations

from dataclasses import dataclass

from dlverify.ir import Graph, Op
from dlverify.softmax_form import Source, source_of


@dataclass(frozen=True)
class Shift:
    """sum_i coef_i * k_i over per-row statistics k_i (tensor ids of their
    sources), placed at `dims` of the tensor it belongs to (the dims indexing the
    statistics' dims of size > 1, in order). Zero coefficients are dropped."""

    coefs: tuple[tuple[int, int], ...]   # (statistic, coefficient), sorted by statistic
    dims: tuple[int, ...]

    @staticmethod
    def of(coefs: dict[int, int], dims: tuple[int, ...]) -> Shift:
        return Shift(tuple(sorted((k, c) for k, c in coefs.items() if c != 0)), dims)

    def plus(self, other: Shift) -> Shift:
        total = dict(self.coefs)
        for k, c in other.coefs:
            total[k] = total.get(k, 0) + c
        return Shift.of(total, self.dims)

    def at(self, dims: tuple[int, ...]) -> Shift:
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


def big_dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(i for i, n in enumerate(shape) if n != 1)


UNKNOWN = Shift((), (-1,))   # net(): statistics reach the value through an op not modelled


def negated(n: Shift) -> Shift:
    return Shift(tuple((k, -c) for k, c in n.coefs), n.dims)


class ShiftAnalysis:
    """Statistics, factors, exponentials and net shifts of one graph (module doc)."""

    LINEAR_UNARY = ("neg", "convert_element_type", "copy")

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.producer = {op.output: op for op in g.ops}
        self.position = {op.output: i for i, op in enumerate(g.ops)}
        self.consumers: dict[int, list[Op]] = g.consumers()
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
            big = set(big_dims(self.shape(op.output)))
            for leaf, _ in leaves:
                src = self.source(leaf)
                if set(src.dims) < big and src.dims:
                    stats.add(src.src)
        for e, leaves in split.items():
            big = big_dims(self.shape(e))
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
            elif op.kind == "reshape":
                # only one that keeps the dims of size > 1 carries a factor (the rewrite
                # follows no other): one splitting the rows, as XLA's un-permute of a
                # zigzag sequence reads the output in chunks, is read outside the algebra,
                # so its operand is where the factors are pushed
                a = op.inputs[0]
                res = [n for n in self.shape(a) if n != 1] == [n for n in self.shape(t) if n != 1] \
                    and self.has_factor(a)
            elif op.kind in ("add", "sub", "mul", "dot_general", "reduce_sum", "broadcast_in_dim",
                             "transpose") + self.LINEAR_UNARY:
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
            a, out = big_dims(self.shape(ins[0])), big_dims(self.shape(t))
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
        a = op.inputs[0]
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
        (or are outputs): each is rewritten as a whole. None without a factor (no
        online softmax: the common case costs one pass over the exponentials)."""
        if not self.rescaled:
            return []
        outs = set(self.g.outputs)
        return [op.output for op in self.g.ops if self.has_factor(op.output) and (
            op.output in outs or any(not self.has_factor(c.output)
                                     for c in self.consumers.get(op.output, [])))]


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
