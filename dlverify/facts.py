"""Problem -> fact tables (one list of rows per input relation of the schema).

Everything a rule needs about an op is precomputed here as flat integer rows:
which class it belongs to, a signature that says when a sequential and a
distributed op compute the same function, and per-dim maps for layout ops.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from dlverify import ir
from dlverify import layout_algebra
from dlverify import schema as S
from dlverify.errors import InputError
from dlverify.ir import Graph, Op
from dlverify.passes import Folded
from dlverify.problem import Problem

FactTables = dict[S.Relation, list[tuple]]

REDUCER_CODE = {"sum": S.REDUCER_SUM, "max": S.REDUCER_MAX, "min": S.REDUCER_MIN}
_REDUCE_KIND = {"reduce_sum": S.REDUCER_SUM, "reduce_max": S.REDUCER_MAX, "reduce_min": S.REDUCER_MIN}
_INT32 = 2 ** 31


def prime_exponents(x: Fraction) -> tuple[int, int, int, int] | None:
    """x as 2^a 3^b 5^c 7^d, or None when x is not positive or has other factors."""
    if x <= 0:
        return None
    exps = []
    num, den = x.numerator, x.denominator
    for p in S.SCALE_PRIMES:
        e = 0
        while num % p == 0:
            num //= p
            e += 1
        while den % p == 0:
            den //= p
            e -= 1
        exps.append(e)
    if num != 1 or den != 1:
        return None
    return tuple(exps)  # type: ignore[return-value]


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


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Split a reshape into groups of operand dims and output dims with equal
    products, size-1 dims standing alone. None when sizes do not factor."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and not (j < len(dst) and dst[j] == 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and not (i < len(src) and src[i] == 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        i += 1
        j += 1
        while pi != pj:
            if pi < pj:
                if i >= len(src):
                    return None
                pi *= src[i]
                gi.append(i)
                i += 1
            else:
                if j >= len(dst):
                    return None
                pj *= dst[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    return groups


def reshape_signature(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple | None:
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    sig = []
    for gi, gj in groups:
        inner = 1
        if len(gi) == 1 and len(gj) > 1:
            inner = int(np.prod([dst[j] for j in gj[1:]]))
        elif len(gi) > 1 and len(gj) == 1:
            inner = int(np.prod([src[i] for i in gi[1:]]))
        elif len(gi) > 1 and len(gj) > 1:
            inner = -1  # not a plain split or merge: no rule
        sig.append((len(gi), len(gj), inner))
    return tuple(sig)


def reshape_map(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """Rows (out_dim, mode, in_dim, k) of Reshape_Map (see schema)."""
    rows = []
    for gi, gj in reshape_groups(src, dst) or []:
        if len(gi) == 1 and len(gj) == 1:
            rows.append((gj[0], 0, gi[0], 1))
        elif len(gi) == 1 and len(gj) > 1:
            inner = int(np.prod([dst[j] for j in gj[1:]]))
            rows.append((gj[0], 0, gi[0], inner))
            rows += [(j, 2, -1, 0) for j in gj[1:]]
        elif len(gi) > 1 and len(gj) == 1:
            inner = int(np.prod([src[i] for i in gi[1:]]))
            rows.append((gj[0], 1, gi[0], inner))
        elif not gi:
            rows += [(j, 2, -1, 0) for j in gj]
    return rows


class Exporter:
    def __init__(self, problem: Problem, seq_fold: Folded, dist_fold: Folded) -> None:
        self.p = problem
        self.folds = {id(problem.seq): seq_fold, id(problem.dist): dist_fold}
        self.t: FactTables = defaultdict(list)
        self.values = ValueTable()
        self.sigs: dict[tuple, int] = {}
        self.iota_along: dict[int, set[int]] = {}

    def add(self, rel: S.Relation, *row: Any) -> None:
        assert len(row) == rel.arity, (rel.name, row)
        self.t[rel].append(row)

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

    def op(self, g: Graph, op: Op, fold: Folded, dist: bool) -> None:
        k = op.kind
        shapes = [g.tensors[i].shape for i in op.inputs]
        out_shape = g.tensors[op.output].shape
        for pos, t in enumerate(op.inputs):
            self.add(S.OP_INPUT, op.id, pos, t)
        self.add(S.OP_OUTPUT, op.id, op.output)
        sig_key: tuple = (k,)
        if k in ir.ELEMENTWISE_NONLINEAR_UNARY:
            self.add(S.ELEM_UNARY, op.id)
            sig_key = (k, tuple(sorted(op.params.items())))
        elif k in ir.ELEMENTWISE_LINEAR_UNARY:
            self.add(S.ELEM_UNARY_LINEAR, op.id)
        elif k in ir.ELEMENTWISE_ADDSUB:
            self.add(S.ELEM_ADDSUB, op.id, 1 if k == "add" else -1)
        elif k == "mul":
            self.add(S.ELEM_MUL, op.id)
        elif k == "div" and ir.is_float_dtype(g.tensors[op.output].dtype):
            self.add(S.ELEM_DIV, op.id)
        elif k == "div" or k in ir.ELEMENTWISE_NONLINEAR_BINARY or k in ir.ELEMENTWISE_NARY:
            # Integer division truncates: not linear, so it only matches itself.
            self.add(S.ELEM_NARY, op.id, len(op.inputs))
        elif k == "broadcast_in_dim":
            bd = op.params["broadcast_dimensions"]
            expanded = tuple(shapes[0][i] != out_shape[j] for i, j in enumerate(bd))
            if not dist and op.inputs[0] in self.iota_along:
                # A broadcast of an iota along i counts along the dim i maps to.
                self.iota_along[op.output] = {bd[i] for i in self.iota_along[op.inputs[0]]
                                              if not expanded[i]}
            self.add(S.BROADCAST, op.id)
            mapped = {}
            for i, j in enumerate(bd):
                if not expanded[i]:
                    mapped[j] = i
            for j in range(len(out_shape)):
                self.add(S.BROADCAST_DIM, op.id, mapped.get(j, -1), j)
            sig_key = (k, tuple(bd), expanded)
        elif k == "transpose":
            self.add(S.TRANSPOSE, op.id)
            for j, i in enumerate(op.params["permutation"]):
                self.add(S.TRANSPOSE_PERM, op.id, j, i)
            sig_key = (k, tuple(op.params["permutation"]))
        elif k == "reshape":
            self.add(S.RESHAPE, op.id)
            rsig = reshape_signature(shapes[0], out_shape)
            sig_key = (k, rsig, len(shapes[0]), len(out_shape)) if rsig is not None else (k, op.id)
            for row in reshape_map(shapes[0], out_shape):
                self.add(S.RESHAPE_MAP, op.id, *row)
        elif k == "slice":
            strides = op.params.get("strides")
            if not strides or all(s == 1 for s in strides):
                for i, a in enumerate(op.params["start_indices"]):
                    self.add(S.SLICE_START, op.id, i, a)
        elif k == "dynamic_slice":
            self.dynamic_slice(g, op, fold, dist, shapes[0], out_shape)
        elif k == "concatenate":
            dim = op.params["dimension"]
            self.add(S.CONCAT_DIM, op.id, dim)
            off = 0
            for pos, sh in enumerate(shapes):
                self.add(S.CONCAT_OFFSET, op.id, pos, off, len(shapes))
                off += sh[dim]
        elif k == "iota":
            self.add(S.IOTA_DIM, op.id, op.params["dimension"])
            if not dist:
                self.iota_along[op.output] = {op.params["dimension"]}
        elif k == "dot_general":
            self.dot(op, shapes, dist)
            sig_key = (k, op.params["lhs_contract"], op.params["rhs_contract"],
                       op.params["lhs_batch"], op.params["rhs_batch"])
        elif k in _REDUCE_KIND:
            axes = tuple(op.params["axes"])
            red = _REDUCE_KIND[k]
            for idx, ax in enumerate(axes):
                self.add(S.REDUCE_AXIS, op.id, idx, ax, len(axes), red)
                if not dist:
                    self.add(S.CONTRACT_SIZE, op.id, idx, shapes[0][ax])
            kept = [i for i in range(len(shapes[0])) if i not in axes]
            for j, i in enumerate(kept):
                self.add(S.REDUCE_OUT, op.id, j, i)
            sig_key = (k, axes)
        elif k == "gather":
            sig_key = self.gather(op, shapes, out_shape)
        elif k in ir.COLLECTIVES:
            self.collective(op)
        self.add(S.OP_SIG, op.id, self.sig(sig_key))

    def dot(self, op: Op, shapes: list[tuple[int, ...]], dist: bool) -> None:
        lc, rc = op.params["lhs_contract"], op.params["rhs_contract"]
        lb, rb = op.params["lhs_batch"], op.params["rhs_batch"]
        self.add(S.DOT, op.id, len(lc))
        for idx, (l, r) in enumerate(zip(lc, rc)):
            self.add(S.DOT_CONTRACT, op.id, idx, l, r)
            if not dist:
                self.add(S.CONTRACT_SIZE, op.id, idx, shapes[0][l])
        j = 0
        for l, r in zip(lb, rb):
            self.add(S.DOT_OUT, op.id, j, 0, l, r)
            j += 1
        for i in range(len(shapes[0])):
            if i not in lc and i not in lb:
                self.add(S.DOT_OUT, op.id, j, 0, i, -1)
                j += 1
        for i in range(len(shapes[1])):
            if i not in rc and i not in rb:
                self.add(S.DOT_OUT, op.id, j, 1, i, -1)
                j += 1

    def gather(self, op: Op, shapes: list[tuple[int, ...]], out_shape: tuple[int, ...]) -> tuple:
        """Gather facts when the gather has the form the rules handle (see schema):
        no batching dims, every operand dim outside start_index_map sliced whole."""
        p = op.params
        sig = ("gather", tuple(p["offset_dims"]), tuple(p["collapsed_slice_dims"]),
               tuple(p["start_index_map"]), p["index_vector_dim"],
               tuple(p.get("operand_batching_dims") or ()),
               tuple(p.get("start_indices_batching_dims") or ()))
        operand, indices = shapes[0], shapes[1]
        smap, collapsed = tuple(p["start_index_map"]), tuple(p["collapsed_slice_dims"])
        sizes, ivd = tuple(p["slice_sizes"]), p["index_vector_dim"]
        if p.get("operand_batching_dims") or p.get("start_indices_batching_dims"):
            return sig
        if len(sizes) != len(operand) or len(set(smap)) != len(smap):
            return sig
        if any(sizes[i] != operand[i] for i in range(len(operand)) if i not in smap):
            return sig
        if any(i not in smap or sizes[i] != 1 for i in collapsed):
            return sig
        ivd = len(indices) if ivd is None else ivd
        vec = ivd if ivd < len(indices) else -1
        if vec >= 0 and indices[vec] != len(smap):
            return sig
        if vec < 0 and len(smap) != 1:
            return sig
        kept = [i for i in range(len(operand)) if i not in collapsed]
        offset_dims = tuple(p["offset_dims"])
        if len(offset_dims) != len(kept):
            return sig
        batch_out = [j for j in range(len(out_shape)) if j not in offset_dims]
        batch_in = [k for k in range(len(indices)) if k != vec]
        if len(batch_out) != len(batch_in):
            return sig
        self.add(S.GATHER, op.id, len(smap), vec)
        for idx, i in enumerate(smap):
            self.add(S.GATHER_INDEXED, op.id, idx, i)
        for j, i in zip(offset_dims, kept):
            self.add(S.GATHER_OFFSET, op.id, j, i, 1 if i in smap else 0)
        for j, kk in zip(batch_out, batch_in):
            self.add(S.GATHER_BATCH, op.id, j, kk)
        return sig

    def dynamic_slice(self, g: Graph, op: Op, fold: Folded, dist: bool,
                      in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        starts = op.inputs[1:]
        if not all(s in fold.small for s in starts):
            return  # start not known before run time: no rule applies
        for r in range(fold.ranks):
            for i, s in enumerate(starts):
                raw = int(np.asarray(fold.small[s][r]).reshape(-1)[0])
                # XLA clamps the start so that the slice stays in bounds.
                start = min(max(raw, 0), in_shape[i] - out_shape[i])
                if dist:
                    self.add(S.DYNSLICE_START, op.id, r, i, start)
                elif r == 0:
                    self.add(S.SLICE_START, op.id, i, start)

    def collective(self, op: Op) -> None:
        k = op.kind
        if k == "collective_permute":
            for src, dst in op.params["pairs"]:
                self.add(S.PERMUTE_PAIR, op.id, src, dst)
            return
        groups = op.params["groups"]
        for g, grp in enumerate(groups):
            for idx, r in enumerate(grp):
                self.add(S.COLL_MEMBER, op.id, g, idx, r, len(grp))
        sizes = {len(grp) for grp in groups}
        if len(sizes) == 1:
            e = prime_exponents(Fraction(sizes.pop()))
            if e is not None:
                self.add(S.GROUP_SCALE, op.id, *e)
        if k == "all_reduce":
            self.add(S.ALL_REDUCE, op.id, REDUCER_CODE[op.params["reducer"]])
        elif k == "all_gather":
            self.add(S.ALL_GATHER, op.id, op.params["dimension"])
        elif k == "reduce_scatter":
            if op.params.get("reducer", "sum") == "sum":
                self.add(S.REDUCE_SCATTER, op.id, op.params["dimension"])
        elif k == "all_to_all":
            self.add(S.ALL_TO_ALL, op.id, op.params["split_dimension"], op.params["concat_dimension"])

    # ------------------------------------------------------------------ boundary
    def boundary(self) -> None:
        p = self.p
        self.add(S.RANK_COUNT, p.mesh.size)
        seed = 0
        for s, d, rel in zip(p.seq.inputs, p.dist.inputs, p.inputs):
            for r, offs in enumerate(rel.offsets):
                seed += 1
                self.add(S.SEED, seed, s, d, r, -1, 0, 0, 0, 0, 0, 0, 0, 0)
                for i, o in enumerate(offs):
                    self.add(S.SEED_OFF, seed, i, o)
        for idx, (s, d, rel) in enumerate(zip(p.seq.outputs, p.dist.outputs, p.outputs)):
            self.add(S.OUTPUT_PAIR, s, d, idx)
            if rel is None:
                continue
            for r, offs in enumerate(rel.offsets):
                for i, o in enumerate(offs):
                    self.add(S.OUTPUT_OFF, s, d, r, i, o)

    def value_facts(self, seq_fold: Folded, dist_fold: Folded) -> None:
        for f, vid in list(self.values.ids.items()):
            if not np.isfinite(f):
                continue
            if float(f).is_integer() and abs(f) < _INT32:
                self.add(S.VALUE_INT, vid, int(f))
            if f > 0:
                e = prime_exponents(Fraction(float(f)))
                if e is not None and all(abs(x) < 64 for x in e):
                    self.add(S.VALUE_EXP, vid, *e)
        seq_vals = {v for vals in seq_fold.splat.values() for v in vals}
        dist_vals = {v for vals in dist_fold.splat.values() for v in vals}
        for a in dist_vals:
            for b in seq_vals:
                if a == b or not b or not np.isfinite(a) or not np.isfinite(b):
                    continue
                e = prime_exponents(Fraction(float(a)) / Fraction(float(b)))
                if e is not None and all(abs(x) < 64 for x in e):
                    self.add(S.VALUE_RATIO, self.values(a), self.values(b), *e)


def export(problem: Problem, seq_fold: Folded, dist_fold: Folded) -> tuple[FactTables, ValueTable]:
    ex = Exporter(problem, seq_fold, dist_fold)
    ex.graph(problem.seq, dist=False)
    ex.graph(problem.dist, dist=True)
    ex.boundary()
    ex.value_facts(seq_fold, dist_fold)
    layout_algebra.export_all(ex, problem.seq, problem.dist, seq_fold, dist_fold)
    tables = {rel: sorted(set(ex.t.get(rel, []))) for rel in S.INPUTS}
    return tables, ex.values
