"""Random tiny sequential/distributed program pairs for fuzzing rules.

A pair starts from inputs related by random partition specs on a small mesh and grows
by random steps over the pairs of tensors built so far: the same op on both sides
(elementwise, dot_general, reductions, transpose, slice, broadcast, reshape, concatenate;
sometimes with other parameters on one side), a collective on the distributed side only
(all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute, over all ranks
or pairs, sometimes in another order), a scaling by an exact constant on one side. Nothing says the pair is equivalent: the rules decide what holds, and every view
they derive is checked numerically (dlverify/rules/fuzz.py). Programs are built with
the IR builder like tests/rulekit.py, so the real pipeline (passes, fact export) runs.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.problem import Problem
from dlverify.relations import BlockRelation, spec_relation

# Elementwise kinds with no domain restriction on standard-normal data (no NaN to compare).
UNARY = ("neg", "exp", "tanh", "abs", "square", "sin", "logistic")
BINARY = ("add", "sub", "mul", "max", "min")
DIMS = (2, 4)
F32 = "float32"


@dataclass(frozen=True)
class Pair:
    """A sequential tensor and a distributed tensor built side by side."""

    seq: int
    dist: int


@dataclass
class TinyPair:
    """A program pair under construction."""

    mesh: Mesh
    ids: IdAllocator = field(default_factory=IdAllocator)
    seq: Graph = field(default_factory=lambda: Graph("sequential"))
    dist: Graph = field(default_factory=lambda: Graph("distributed"))
    in_rels: list[BlockRelation] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.S = GraphBuilder(self.seq, self.ids)
        self.D = GraphBuilder(self.dist, self.ids)

    def sshape(self, p: Pair) -> tuple[int, ...]:
        return self.seq.tensors[p.seq].shape

    def dshape(self, p: Pair) -> tuple[int, ...]:
        return self.dist.tensors[p.dist].shape

    def input(self, shape: tuple[int, ...], spec: tuple) -> Pair:
        rel = spec_relation(shape, spec, self.mesh, "fuzz input")
        s = self.S.tensor(shape, F32, f"in{len(self.in_rels)}")
        d = self.D.tensor(rel.dist_shape, F32, f"in{len(self.in_rels)}")
        self.seq.inputs.append(s)
        self.dist.inputs.append(d)
        self.in_rels.append(rel)
        return self.add(Pair(s, d))

    def add(self, p: Pair) -> Pair:
        self.pairs.append(p)
        return p

    def both(self, kind: str, ins: list[Pair], sshape: tuple[int, ...], dshape: tuple[int, ...],
             sparams: dict, dparams: dict | None = None) -> Pair:
        s = self.S.op(kind, [p.seq for p in ins], sshape, F32, sparams)
        d = self.D.op(kind, [p.dist for p in ins], dshape, F32, sparams if dparams is None else dparams)
        return self.add(Pair(s, d))

    def problem(self, name: str) -> Problem:
        last = self.pairs[-1]
        self.seq.outputs.append(last.seq)
        self.dist.outputs.append(last.dist)
        self.seq.output_names = self.dist.output_names = ["out0"]
        return Problem(self.seq, self.dist, self.mesh, list(self.in_rels), [None], self.ids, name=name)


def _shape(rng: random.Random, rank: int, n: int) -> tuple[int, ...]:
    return tuple(rng.choice(DIMS) * n for _ in range(rank))


class Generator:
    """Random steps over a TinyPair (each returns False when it does not apply)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, t: TinyPair, ok: Callable[[Pair], bool] = lambda p: True) -> Pair | None:
        cands = [p for p in t.pairs if ok(p)]
        if not cands:
            return None
        # the newest pair half of the time: chains of ops compose the rules
        return cands[-1] if self.rng.random() < 0.5 else self.rng.choice(cands)

    def fresh_input(self, t: TinyPair, shape: tuple[int, ...], dshape: tuple[int, ...] | None = None
                    ) -> Pair:
        """A new input of global `shape` under a random spec (one whose block has `dshape`,
        often, when there is one)."""
        n = t.mesh.size
        ok = [tuple(spec) for spec in ([None] * len(shape),) + tuple(
            tuple("x" if i == j else None for i in range(len(shape))) for j in range(len(shape)))
            if all(size % (n if e else 1) == 0 for size, e in zip(shape, spec))]
        fits = [spec for spec in ok if dshape is not None and
                tuple(x // n if e else x for x, e in zip(shape, spec)) == dshape]
        return t.input(shape, self.rng.choice(fits if fits and self.rng.random() < 0.8 else ok))

    def unary(self, t: TinyPair) -> bool:
        p = self.pick(t)
        if p is None:
            return False
        t.both(self.rng.choice(UNARY), [p], t.sshape(p), t.dshape(p), {})
        return True

    def binary(self, t: TinyPair) -> bool:
        a = self.pick(t)
        if a is None:
            return False
        b = self.pick(t, lambda q: t.sshape(q) == t.sshape(a) and t.dshape(q) == t.dshape(a))
        if b is None or self.rng.random() < 0.3:
            b = self.fresh_input(t, t.sshape(a), t.dshape(a))
            if t.dshape(b) != t.dshape(a):
                return False
        ins = [a, b] if self.rng.random() < 0.5 else [b, a]
        if self.rng.random() < 0.2:  # a quotient, by a positive denominator: exp(b)
            den = t.both("exp", [ins[1]], t.sshape(a), t.dshape(a), {})
            t.both("div", [ins[0], den], t.sshape(a), t.dshape(a), {})
            return True
        t.both(self.rng.choice(BINARY), ins, t.sshape(a), t.dshape(a), {})
        return True

    def clamp(self, t: TinyPair) -> bool:
        """clamp(lo, x, hi) with bounds of the same shapes (three operands)."""
        x = self.pick(t)
        if x is None:
            return False
        lo, hi = (self.fresh_input(t, t.sshape(x), t.dshape(x)) for _ in range(2))
        if not t.dshape(lo) == t.dshape(hi) == t.dshape(x):
            return False
        t.both("clamp", [lo, x, hi], t.sshape(x), t.dshape(x), {})
        return True

    def scale(self, t: TinyPair) -> bool:
        """Multiply (or divide) one side by an exact constant."""
        p = self.pick(t)
        if p is None:
            return False
        k = self.rng.choice((2.0, 3.0, 0.5))
        kind = self.rng.choice(("mul", "div"))
        side = t.S if self.rng.random() < 0.5 else t.D
        x = p.seq if side is t.S else p.dist
        shape = t.sshape(p) if side is t.S else t.dshape(p)
        c = side.constant(np.full((), k, dtype=np.float32), (), F32)
        y = side.op(kind, [x, c], shape, F32, {})
        t.add(Pair(y, p.dist) if side is t.S else Pair(p.seq, y))
        return True

    def dot(self, t: TinyPair) -> bool:
        a = self.pick(t, lambda q: len(t.sshape(q)) == 2)
        if a is None or self.rng.random() < 0.3:  # a fresh lhs, often split along k: partial terms
            n = t.mesh.size
            a = t.input((self.rng.choice(DIMS) * n, self.rng.choice(DIMS) * n),
                        self.rng.choice(((None, "x"), (None, "x"), ("x", None), (None, None))))
        k, dk = t.sshape(a)[1], t.dshape(a)[1]
        n = self.rng.choice(DIMS) * t.mesh.size
        if dk == k:
            spec: tuple = (None, "x" if self.rng.random() < 0.5 else None)
        elif dk * t.mesh.size == k:
            spec = ("x", None)
        else:
            return False
        w = t.input((k, n), spec)
        dot = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
        t.both("dot_general", [a, w], (t.sshape(a)[0], n), (t.dshape(a)[0], t.dshape(w)[1]), dot)
        return True

    def reduce(self, t: TinyPair) -> bool:
        p = self.pick(t, lambda q: len(t.sshape(q)) == 2)
        if p is None:
            return False
        ax = self.rng.randrange(2)
        kind = self.rng.choice(("reduce_sum", "reduce_sum", "reduce_max"))
        drop = lambda sh: tuple(x for i, x in enumerate(sh) if i != ax)
        t.both(kind, [p], drop(t.sshape(p)), drop(t.dshape(p)), {"axes": (ax,)})
        return True

    def transpose(self, t: TinyPair) -> bool:
        p = self.pick(t, lambda q: len(t.sshape(q)) == 2)
        if p is None:
            return False
        perm = (1, 0)
        dperm = perm if self.rng.random() < 0.8 else (0, 1)
        flip = lambda sh, pm: tuple(sh[i] for i in pm)
        t.both("transpose", [p], flip(t.sshape(p), perm), flip(t.dshape(p), dperm),
               {"permutation": perm}, {"permutation": dperm})
        return True

    def slice(self, t: TinyPair) -> bool:
        """The same slice of the distributed block as of the global tensor (often not
        the same elements: the rules must tell)."""
        p = self.pick(t, lambda q: len(t.sshape(q)) == 2 and min(t.dshape(q)) >= 2)
        if p is None:
            return False
        dsh, ssh = t.dshape(p), t.sshape(p)
        size = tuple(self.rng.randint(1, min(x, y)) for x, y in zip(dsh, ssh))
        start = tuple(self.rng.randint(0, x - n) for x, n in zip(dsh, size))
        dp = dict(start_indices=start, limit_indices=tuple(a + n for a, n in zip(start, size)),
                  strides=None)
        sstart = tuple(min(a, x - n) for a, x, n in zip(start, ssh, size))
        sp = dict(start_indices=sstart, limit_indices=tuple(a + n for a, n in zip(sstart, size)),
                  strides=None)
        t.both("slice", [p], size, size, sp, dp)
        return True

    def all_reduce(self, t: TinyPair) -> bool:
        p = self.pick(t)
        if p is None:
            return False
        kind = self.rng.choice(("sum", "sum", "max"))
        d = t.D.op("all_reduce", [p.dist], t.dshape(p), F32,
                   {"reducer": kind, "groups": self._groups(t)})
        t.add(Pair(p.seq, d))
        return True

    def all_gather(self, t: TinyPair) -> bool:
        p = self.pick(t, lambda q: len(t.dshape(q)) >= 1)
        if p is None:
            return False
        dim = self.rng.randrange(len(t.dshape(p)))
        groups = self._groups(t)
        shape = tuple(x * len(groups[0]) if i == dim else x for i, x in enumerate(t.dshape(p)))
        d = t.D.op("all_gather", [p.dist], shape, F32, {"dimension": dim, "groups": groups})
        t.add(Pair(p.seq, d))
        return True

    def reduce_scatter(self, t: TinyPair) -> bool:
        groups = self._groups(t)
        m = len(groups[0])
        p = self.pick(t, lambda q: len(t.dshape(q)) >= 1 and any(x % m == 0 for x in t.dshape(q)))
        if p is None:
            return False
        dims = [i for i, x in enumerate(t.dshape(p)) if x % m == 0]
        dim = self.rng.choice(dims)
        shape = tuple(x // m if i == dim else x for i, x in enumerate(t.dshape(p)))
        d = t.D.op("reduce_scatter", [p.dist], shape, F32,
                   {"dimension": dim, "reducer": "sum", "groups": groups})
        t.add(Pair(p.seq, d))
        return True

    def permute(self, t: TinyPair) -> bool:
        p = self.pick(t)
        if p is None:
            return False
        n = t.mesh.size
        shift = self.rng.choice((1, n - 1, 0))
        d = t.D.op("collective_permute", [p.dist], t.dshape(p), F32,
                   {"pairs": [(r, (r + shift) % n) for r in range(n)]})
        t.add(Pair(p.seq, d))
        return True

    def broadcast(self, t: TinyPair) -> bool:
        """A new dim of the same size on both sides, before or after the operand's one dim."""
        p = self.pick(t, lambda q: len(t.sshape(q)) == 1)
        if p is None:
            return False
        m = self.rng.choice(DIMS)
        at = self.rng.randrange(2)
        dims = {"broadcast_dimensions": (1 - at,)}
        grow = lambda sh: (m, *sh) if at == 0 else (*sh, m)  # noqa: E731
        t.both("broadcast_in_dim", [p], grow(t.sshape(p)), grow(t.dshape(p)), dims)
        return True

    def reshape(self, t: TinyPair) -> bool:
        """Flatten a matrix on both sides (a block of rows stays contiguous; of columns not)."""
        p = self.pick(t, lambda q: len(t.sshape(q)) == 2)
        if p is None:
            return False
        flat = lambda sh: (sh[0] * sh[1],)  # noqa: E731
        t.both("reshape", [p], flat(t.sshape(p)), flat(t.dshape(p)), {})
        return True

    def concatenate(self, t: TinyPair) -> bool:
        """Two pairs of the same shapes joined along a dim on both sides."""
        a = self.pick(t, lambda q: len(t.sshape(q)) >= 1)
        if a is None:
            return False
        b = self.pick(t, lambda q: t.sshape(q) == t.sshape(a) and t.dshape(q) == t.dshape(a))
        if b is None:
            return False
        dim = self.rng.randrange(len(t.sshape(a)))
        cat = lambda sh: tuple(2 * x if i == dim else x for i, x in enumerate(sh))  # noqa: E731
        t.both("concatenate", [a, b], cat(t.sshape(a)), cat(t.dshape(a)), {"dimension": dim})
        return True

    def all_to_all(self, t: TinyPair) -> bool:
        groups = self._groups(t)
        m = len(groups[0])
        p = self.pick(t, lambda q: len(t.dshape(q)) == 2 and any(x % m == 0 for x in t.dshape(q)))
        if p is None:
            return False
        split = self.rng.choice([i for i, x in enumerate(t.dshape(p)) if x % m == 0])
        concat = self.rng.randrange(2)
        shape = list(t.dshape(p))
        shape[split] //= m
        shape[concat] *= m
        d = t.D.op("all_to_all", [p.dist], tuple(shape), F32,
                   {"split_dimension": split, "concat_dimension": concat, "groups": groups})
        t.add(Pair(p.seq, d))
        return True

    def _groups(self, t: TinyPair) -> list[list[int]]:
        n = t.mesh.size
        ranks = list(range(n))
        if self.rng.random() < 0.2:
            self.rng.shuffle(ranks)
        if n == 4 and self.rng.random() < 0.3:
            return [ranks[:2], ranks[2:]]
        return [ranks]

    STEPS = ("unary", "unary", "unary", "binary", "binary", "scale", "dot", "dot", "reduce",
             "clamp", "transpose", "slice", "broadcast", "reshape", "concatenate", "all_reduce", "all_reduce",
             "all_gather", "reduce_scatter", "all_to_all", "permute")

    def program(self, index: int, max_steps: int = 6) -> Problem:
        rng = self.rng
        t = TinyPair(Mesh(("x",), (rng.choice((2, 2, 4)),)))
        rank = rng.choice((1, 2, 2, 2))
        shape = _shape(rng, rank, t.mesh.size)
        self.fresh_input(t, shape)
        for _ in range(rng.randint(1, max_steps)):
            for _attempt in range(4):
                if getattr(self, rng.choice(self.STEPS))(t):
                    break
        return t.problem(f"fuzz{index}")
