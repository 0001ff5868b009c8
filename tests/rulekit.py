"""Tiny hand-built sequential/distributed program pairs for rule-file tests.

A `Tiny` pair is built op by op with the IR builder, run through the real
pipeline (passes, fact export, Datalog), and every derived view can be checked
numerically against an interpreter run on random inputs: the soundness check
of each rule family.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlverify.api import verify_problem
from dlverify.engine import souffle_runner
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.numeric import padded_view_error, partial_sum_errors, run_both, view_error
from dlverify.problem import Problem
from dlverify.relations import BlockRelation, spec_relation
from dlverify.verdict import PaddedViewFact, Result, ViewFact


@dataclass
class Tiny:
    mesh: Mesh = field(default_factory=lambda: Mesh(("x",), (2,)))

    def __post_init__(self) -> None:
        self.ids = IdAllocator()
        self.seq = Graph("sequential")
        self.dist = Graph("distributed")
        self.S = GraphBuilder(self.seq, self.ids)
        self.D = GraphBuilder(self.dist, self.ids)
        self.in_rels: list[BlockRelation] = []
        self.out_rels: list[BlockRelation | None] = []

    def input(self, shape: tuple[int, ...], spec: tuple = (), dtype: str = "float32") -> tuple[int, int]:
        rel = spec_relation(shape, spec, self.mesh, "tiny input")
        s = self.S.tensor(shape, dtype, f"in{len(self.in_rels)}")
        d = self.D.tensor(rel.dist_shape, dtype, f"in{len(self.in_rels)}")
        self.seq.inputs.append(s)
        self.dist.inputs.append(d)
        self.in_rels.append(rel)
        return s, d

    def output(self, s: int, d: int, spec: tuple | None = ()) -> None:
        self.seq.outputs.append(s)
        self.dist.outputs.append(d)
        shape = self.seq.tensors[s].shape
        self.out_rels.append(None if spec is None else spec_relation(shape, spec, self.mesh, "tiny output"))

    def output_negated_psum(self, s: int, d: int, groups: list[list[int]]) -> None:
        """Output -s against the psum over `groups` of -d: a negation between, since the
        normal form writes a psum of a sum or concatenation itself as the sum or
        concatenation of the pieces' psums (dlverify/rewrites.py), and the rule family
        under test would not be needed."""
        shape = self.seq.tensors[s].shape
        red = self.dop("all_reduce", [self.dop("neg", [d], self.dist.tensors[d].shape)],
                       self.dist.tensors[d].shape, reducer="sum", groups=groups)
        self.output(self.sop("neg", [s], shape), red)

    def sop(self, kind: str, inputs: list[int], shape: tuple[int, ...], **params) -> int:
        return self.S.op(kind, inputs, shape, "float32", params)

    def dop(self, kind: str, inputs: list[int], shape: tuple[int, ...], **params) -> int:
        return self.D.op(kind, inputs, shape, "float32", params)

    def sconst(self, value: float, shape: tuple[int, ...] = ()) -> int:
        return self.S.constant(np.full(shape, value, dtype=np.float32), shape, "float32")

    def dconst(self, value: float, shape: tuple[int, ...] = ()) -> int:
        return self.D.constant(np.full(shape, value, dtype=np.float32), shape, "float32")

    def drank_is(self, rank: int, shape: tuple[int, ...], axis: str = "x") -> int:
        """A distributed bool tensor of `shape`, true on `rank` only: axis_index == rank."""
        r = self.D.op("axis_index", [], (), "int32", {"axis": axis})
        k = self.D.constant(np.asarray(rank, dtype=np.int32), (), "int32")
        p = self.D.op("eq", [r, k], (), "bool")
        return self.D.op("broadcast_in_dim", [p], shape, "bool", {"broadcast_dimensions": ()})

    def problem(self) -> Problem:
        names = [f"out{i}" for i in range(len(self.seq.outputs))]
        self.seq.output_names = self.dist.output_names = names
        return Problem(self.seq, self.dist, self.mesh, self.in_rels, self.out_rels, self.ids)

    def run(self, check_numerically: bool = True) -> "Derived":
        p = self.problem()
        res = verify_problem(p, engine="clingo")
        if check_numerically:
            assert_views_hold(p, res.views, padded=res.padded_views)
        return Derived(p, res)


@dataclass
class Derived:
    problem: Problem
    result: Result

    def views(self, s: int, d: int, rank: int | None = None) -> list[ViewFact]:
        return [v for v in self.result.views
                if v.seq == s and v.dist == d and (rank is None or v.rank == rank)]

    def offsets(self, s: int, d: int, rank: int, complete: bool = True) -> set[tuple[int, ...]]:
        return {v.offsets for v in self.views(s, d, rank) if not complete or v.complete}


def assert_engines_agree(problem: Problem, monkeypatch) -> None:
    """Soufflé (interpreted: one tiny program, no compile) and clingo both verify
    `problem` and derive the same views."""
    monkeypatch.setenv(souffle_runner.MODE_ENV, "interpreted")
    by_engine = {e: verify_problem(problem, engine=e) for e in ("clingo", "souffle")}
    assert by_engine["souffle"].verified and by_engine["clingo"].verified
    assert set(by_engine["souffle"].views) == set(by_engine["clingo"].views)


def assert_views_hold(problem: Problem, views: list[ViewFact], seeds: tuple[int, ...] = (0, 1),
                      padded: list[PaddedViewFact] = ()) -> None:
    """Every complete view, every padded view and every tiling set of partial terms holds
    on random data."""
    for seed in seeds:
        run = run_both(problem, seed)
        for pv in padded:
            err = padded_view_error(run, problem, pv)
            d = np.asarray(run.dist[pv.dist][pv.rank], dtype=np.float64)
            assert err <= 1e-9 * float(np.max(np.abs(d[np.isfinite(d)]), initial=1.0)), \
                f"unsound padded view {pv}: error {err}"
        for v in views:
            if v.partial is None:
                d = run.dist[v.dist][v.rank]
                scale = max(1.0, float(np.max(np.abs(d)))) if d.size else 1.0
                err = view_error(run, problem, v)
                assert err <= 1e-9 * scale, f"unsound view {v}: error {err}"
        for key, err in partial_sum_errors(run, problem, views):
            assert err <= 1e-9, f"partial terms {key} do not sum to the sequential block: {err}"
