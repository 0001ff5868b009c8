"""Problem -> fact tables (one list of rows per input relation of the schema).

Everything a rule needs about an op is precomputed here as flat integer rows:
which class it belongs to, a signature that says when a sequential and a
distributed op compute the same function, and per-dim maps for layout ops.
The per-kind rows come from each kind's exporter in the op-kind table
(dlverify/ops/table.py, exporters in dlverify/ops/export.py); the names
re-exported from there stay importable from here.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from dlverify import layout_algebra
from dlverify import partial_tags, sum_trees
from dlverify import schema as S
from dlverify.errors import InputError
from dlverify.ir import Graph, Op
from dlverify.ops import KINDS, Family, data_operands, evaluate
from dlverify.ops.dtypes import exact_dtype
from dlverify.ops.export import (  # noqa: F401
    REDUCER_CODE,
    Site,
    LiteralReading,
    prime_exponents,
    read_literal,
    reshape_groups,
    reshape_map,
    reshape_signature,
)
from dlverify.passes import Folded
from dlverify.problem import Problem

FactTables = dict[S.Relation, list[tuple]]

_INT32 = 2 ** 31
_IDENTITY_OF = {v: name for name, v in S.REDUCER_IDENTITY.items()}


@dataclass
class ValueTable:
    """Interns exact scalar values; equal values get equal ids."""

    ids: dict[float, int] = field(default_factory=dict)

    def __call__(self, v: Any) -> int | None:
        f = float(v)
        if np.isnan(f):
            return None  # NaN equals nothing, not even itself
        if f not in self.ids:
            self.ids[f] = len(self.ids) + 1
        return self.ids[f]


class Exporter:
    def __init__(self, problem: Problem, seq_fold: Folded, dist_fold: Folded) -> None:
        self.p = problem
        self.folds = {id(problem.seq): seq_fold, id(problem.dist): dist_fold}
        # rows by relation name: a str caches its hash, a Relation hashes all its columns
        # (0.3 s of the 1.2 s export of the 126-layer 405B forward)
        self.t: dict[str, list[tuple]] = defaultdict(list)
        self.values = ValueTable()
        self.sigs: dict[tuple, int] = {}
        self.iota_along: dict[int, set[int]] = {}
        self.zero_checked: set[int] = set()

    def add(self, rel: S.Relation, *row: Any) -> None:
        assert len(row) == rel.arity, (rel.name, row)
        self.t[rel.name].append(row)

    def sig(self, key: tuple) -> int:
        if key not in self.sigs:
            self.sigs[key] = len(self.sigs) + 1
        return self.sigs[key]

    # ------------------------------------------------------------------ graphs
    def graph(self, g: Graph, dist: bool) -> None:
        tensor_rel = S.DIST_TENSOR if dist else S.SEQ_TENSOR
        for t in g.tensors.values():
            self.add(tensor_rel, t.id)
            self.add(S.TENSOR_RANK, t.id, t.rank)
            for i, size in enumerate(t.shape):
                if size >= _INT32:
                    raise InputError(f"tensor {t.name or t.id} has a dim of {size} elements; "
                                     "sizes must be below 2^31 (clingo integers are 32-bit)")
                self.add(S.TENSOR_DIM, t.id, i, size)
        fold = self.folds[id(g)]
        for op in g.ops:
            self.op(g, op, fold, dist)
        if not dist:
            for t, dims in self.iota_along.items():
                for k in dims:
                    self.add(S.IOTA_ALONG, t, k)
        for t, vals in fold.splat.items():
            ids = [self.values(v) for v in vals]
            if any(i is None for i in ids):
                continue
            if dist:
                for r, v in enumerate(ids):
                    self.add(S.DIST_SPLAT, t, r, v)
            else:
                self.add(S.SEQ_SPLAT, t, ids[0])
        if dist:
            self.index_arithmetic(g, fold)
            for t, prefixes in fold.prefix.items():
                size = g.tensors[t].shape
                for r, m in enumerate(prefixes):
                    if m is None:
                        continue
                    self.add(S.MASK_PREFIX, t, r, m.dim, m.length, int(m.value))
                    if m.length in (0, size[m.dim]):   # constant along the dim: both forms
                        self.add(S.MASK_PREFIX, t, r, m.dim, size[m.dim] - m.length, int(not m.value))

    def index_arithmetic(self, g: Graph, fold: Folded) -> None:
        """Integer and bool distributed values known before run time on every rank
        (computed from constants, iotas and the rank: a mask's positions) count as
        known constants, so a failure is never reported at them."""
        for op in g.ops:
            t = g.tensors[op.output]
            if op.inputs and op.output in fold.small and op.output not in fold.splat \
                    and exact_dtype(t.dtype) is not None:
                self.add(S.KNOWN_CONST, op.id)

    def op(self, g: Graph, op: Op, fold: Folded, dist: bool) -> None:
        """The op's operand/output rows, the rows of its kind's exporter (the
        op-kind table, dlverify/ops), and its signature."""
        for pos, t in enumerate(op.inputs):
            self.add(S.OP_INPUT, op.id, pos, t)
        self.add(S.OP_OUTPUT, op.id, op.output)
        site = Site(g, op, fold, dist, [g.tensors[i].shape for i in op.inputs],
                    g.tensors[op.output].shape)
        sig = self.sig(KINDS[op.kind].export(self, site))
        self.add(S.OP_SIG, op.id, sig)
        if sig not in self.zero_checked and KINDS[op.kind].family is Family.ELEMENTWISE:
            self.zero_checked.add(sig)
            if maps_zero_to_zero(g, op):
                self.add(S.SIG_ZERO, sig)
        moved = data_operands(op.kind, len(op.inputs))
        if moved:
            self.add(S.MOVES_DATA, op.id, moved)

    # ------------------------------------------------------------------ boundary
    def boundary(self) -> None:
        p = self.p
        self.add(S.RANK_COUNT, p.mesh.size)
        seed = 0
        for s, d, rel in zip(p.seq.inputs, p.dist.inputs, p.inputs):
            for r, offs in enumerate(rel.offsets):
                seed += 1
                self.add(S.SEED, *S.seed_row(seed, s, d, r, None, S.UNIT_SCALE))
                for i, o in enumerate(offs):
                    self.add(S.SEED_OFF, seed, i, o)
        seed = self.equal_constants(seed)
        for idx, (s, d, rel) in enumerate(zip(p.seq.outputs, p.dist.outputs, p.outputs)):
            self.add(S.OUTPUT_PAIR, s, d, idx)
            if rel is None:
                continue
            for r, offs in enumerate(rel.offsets):
                for i, o in enumerate(offs):
                    self.add(S.OUTPUT_OFF, s, d, r, i, o)

    def equal_constants(self, seed: int) -> int:
        """A distributed array constant equal, element for element, to a sequential
        one (same shape, dtype and bytes: a rotary table, a closed-over array)
        is that constant on every rank. Splats are matched by value (Seq_Splat,
        Dist_Splat) instead."""
        def key(g: Graph, op: Op) -> tuple | None:
            v = op.params.get("value") if op.kind == "constant" else None
            if v is None:
                return None
            v = np.asarray(v)
            if v.size < 2 or np.all(v == v.flat[0]):
                return None
            return (g.tensors[op.output].shape, g.tensors[op.output].dtype, v.tobytes())
        seq_consts: dict[tuple, int] = {}
        for op in self.p.seq.ops:
            k = key(self.p.seq, op)
            if k is not None:
                seq_consts.setdefault(k, op.output)
        for op in self.p.dist.ops:
            k = key(self.p.dist, op)
            s = seq_consts.get(k) if k is not None else None
            if s is None:
                continue
            for r in range(self.p.mesh.size):
                seed += 1
                self.add(S.SEED, *S.seed_row(seed, s, op.output, r, None, S.UNIT_SCALE))
                for i in range(self.p.dist.tensors[op.output].rank):
                    self.add(S.SEED_OFF, seed, i, 0)
        return seed

    def value_facts(self, seq_fold: Folded, dist_fold: Folded) -> None:
        # Value_Exp serves scalings by a splat (elementwise.dl): a literal is read as
        # the rational it rounds only there, so unrelated literals (an epsilon) add
        # no assumption.
        scaling = {v for g, fold in ((self.p.seq, seq_fold), (self.p.dist, dist_fold))
                   for op in g.ops if op.kind in ("mul", "div")
                   for t in op.inputs for v in fold.splat.get(t, ())}
        for f, vid in list(self.values.ids.items()):
            if f in _IDENTITY_OF:   # a padding value the reductions ignore (datalog/padded.dl)
                self.add(S.VALUE_IDENTITY, vid, REDUCER_CODE[_IDENTITY_OF[f]])
            if not np.isfinite(f):
                continue
            if float(f).is_integer() and abs(f) < _INT32:
                self.add(S.VALUE_INT, vid, int(f))
            reading = read_literal(f) if f > 0 else None
            if reading is not None and reading.rounded and f not in scaling:
                reading = None
            if reading is not None and all(abs(x) < 64 for x in reading.exponents):
                self.add(S.VALUE_EXP, vid, *reading.exponents)
                self.note_rounded(f, reading)
        seq_vals = {v for vals in seq_fold.splat.values() for v in vals}
        dist_vals = {v for vals in dist_fold.splat.values() for v in vals}
        readings = {v: read_literal(abs(v)) for v in seq_vals | dist_vals if np.isfinite(v)}
        for a in dist_vals:
            for b in seq_vals:
                if a == b or not b or not np.isfinite(a) or not np.isfinite(b):
                    continue
                ra, rb = readings[a], readings[b]
                if ra is None or rb is None or (a < 0) != (b < 0):
                    continue
                e = prime_exponents(ra.value / rb.value)
                if e is not None and all(abs(x) < 64 for x in e):
                    self.add(S.VALUE_RATIO, self.values(a), self.values(b), *e)
                    self.note_rounded(a, ra)
                    self.note_rounded(b, rb)

    def note_rounded(self, f: float, reading: LiteralReading) -> None:
        """List a literal read as the rational it rounds (ops/export.read_literal)."""
        if reading.rounded:
            shown = np.format_float_positional(np.float32(f) if float(np.float32(f)) == f else f)
            text = f"the literal {shown} is read as {reading.value}, the rational it rounds"
            if text not in self.p.assumptions:
                self.p.assumptions.append(text)


def export(problem: Problem, seq_fold: Folded, dist_fold: Folded) -> tuple[FactTables, ValueTable]:
    ex = Exporter(problem, seq_fold, dist_fold)
    ex.graph(problem.seq, dist=False)
    ex.graph(problem.dist, dist=True)
    ex.boundary()
    ex.value_facts(seq_fold, dist_fold)
    layout_algebra.export_all(ex, problem.seq, problem.dist, seq_fold, dist_fold)
    sum_trees.export_all(ex.add, problem.seq)
    for t, p in partial_tags.prod_roots(problem.seq).items():
        ex.add(S.PROD_ROOT, t, p)
    tables = {rel: sorted(set(ex.t.get(rel.name, []))) for rel in S.INPUTS}
    return tables, ex.values


def maps_zero_to_zero(g: Graph, op: Op) -> bool:
    """Whether the elementwise op gives exactly zero (or false) when every operand is
    zero: its value at zero by the shared evaluator, so the padded-view rules
    (datalog/padded.dl) keep zero padding only where the evaluator does."""
    ins = []
    for i in op.inputs:
        name = str(g.tensors[i].dtype)
        dtype = np.dtype(np.float64) if name.startswith(("float", "bfloat")) else exact_dtype(name)
        if dtype is None:
            return False
        ins.append(np.zeros((), dtype=dtype))
    try:
        with np.errstate(all="ignore"):
            out = evaluate(op.kind, op.params, ins, (), g.tensors[op.output].dtype)
    except Exception:   # noqa: BLE001 - any op the evaluator cannot run at zero: not known
        return False
    out = np.asarray(out)
    return out.size == 1 and bool(out.reshape(-1)[0] == 0)
