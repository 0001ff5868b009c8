"""Induction over `lax.scan`: the body is verified once, for every iteration.

When the sequential and the distributed program each hold a scan and the two
pair (the k-th scan of one with the k-th of the other, same length, same
`reverse` flag), the jaxpr frontend (frontends/jaxpr/loops.py) does not unroll
them. It exports each body once, as a graph of its own whose inputs are
placeholders (consts, carry, one row of each scanned operand), and gives each
program placeholder tensors for the scan's results (the final carry, the
stacked per-iteration outputs `ys`). A `ScanSummary` holds both sides.

A `fori_loop` (a scan whose carry counts iterations) reading `w[i]` is first
turned into a scan over rows of `w[a:a+L]` when the index, evaluated by the
shared evaluator for every iteration, is a, a+1, ..., a+L-1 (loops.py): the
slice it reads at iteration t is then exactly row t. While the IR passes
rewrite the programs, the scans' operands are pinned as extra outputs
(`pinned_scan_operands`), since no op reads them.

The segmented run (dlverify/segments.py) reaches a summary when the scan's
operands have views. It then concludes views for the results here:

1. Seeds. A view of the outer operands becomes a seed of the body's inputs:
   - a view relating a const of one side to a const of the other, or an
     initial carry to an initial carry, is a seed of the two placeholders;
   - a view relating two stacked operands X (seq) and Y (dist) whose block
     starts at 0 along dim 0 (both stacks have the scan's length L there)
     says Y[i] = c * block(X[i]) at the other offsets, for every row i: it
     is a seed of the two row placeholders, with dim 0 removed;
   - a seq and a dist const (or initial carry) that hold the same single value
     everywhere (a zero-initialised accumulator) are related at any offset
     (`splat_views`: every block of one is the other when it fits);
   - views with a partial-sum tag, or relating a row to a non-row, are
     dropped (a seed dropped is a hypothesis not made: never unsound).
   Consts computed from constants alone (masks, rotary tables) are not seeded:
   their ops are copied into the body, which computes them itself.
2. The body's views are derived from its facts and these seeds only (one
   segmented run of the body problem: the seeds are the only views of its
   placeholders).
3. Closure. For every seed that involves a carry, the same view (rank,
   offsets, scale) must be derived between the carries after the body (a const
   after the body is itself). Otherwise `InductionOpen` is raised: the caller
   unrolls the scans and verifies again, and says so.
4. Conclusions. The final carries get the body's views of the carries after
   the body (untagged ones); the stacked outputs get the body's views of their
   rows with dim 0 prepended at offset 0; the views a dist result shares with a
   seq result are the only ones concluded.

Why this is sound. Call H the set of seeds. Claim: before every iteration t
(0 <= t < L), every seed of H holds of that iteration's actual inputs. At
t = 0 the carries are the initial ones and the rows are row 0 (the seq row t
and the dist row t are read at the same step: both scans have the same length
and direction), so each seed holds because the outer view it comes from holds
(the rows' by the row argument of step 1). Every view derived in step 2 is a
consequence of the body's ops and H (each rule is sound on any subset of
facts, and the placeholders have no facts besides their shapes), so it holds
of iteration t's values. Step 3 checked that the views H states of the carries
are among those derived for the carries after the body, which are the carries
entering iteration t + 1; consts do not change; rows of t + 1 satisfy H by
the row argument again. By induction H holds at every iteration, hence so do
the body's derived views; those of the final carry hold after the last
iteration (L >= 1), and a view derived for a row of `ys` holds for every row,
which is the stacked view of step 4. Seeds without a view on some carry are
no hypothesis on it: views derived without them hold for any value.

What this costs does not depend on L: the body is exported and verified once.
Only a verified result is kept from this path; a run that is not verified
with summaries is verified again with the scans unrolled (api.py), so every
failure is located at its line exactly as before.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from dlverify.ir import Graph

if TYPE_CHECKING:
    from dlverify.problem import Problem

ViewRow = tuple  # (s, d, r, offsets-record, tag-record | None, scale-record), as segments.py


@dataclass
class ScanSide:
    """One program's scan: outer tensors (in its program's graph) and the body's
    placeholders (in `body`, whose outputs are the carries after the body, then
    the rows of `ys`)."""

    where: str  # file:line of the scan
    length: int
    reverse: bool
    consts: list[int]  # outer consts that are seeded (not computed from constants alone)
    body_consts: list[int]  # their placeholders in `body`, same order
    init: list[int]  # initial carries (outer)
    body_carry: list[int]  # carry placeholders in `body`
    xs: list[int]  # stacked scanned operands (outer)
    body_rows: list[int]  # row placeholders in `body`
    final: list[int]  # final carries (outer placeholders, no producer)
    ys: list[int]  # stacked per-iteration outputs (outer placeholders, no producer)
    body: Graph

    def carry_out(self) -> list[int]:
        return self.body.outputs[:len(self.init)]

    def y_rows(self) -> list[int]:
        return self.body.outputs[len(self.init):]

    def operands(self) -> list[int]:
        return self.consts + self.init + self.xs


@dataclass
class ScanSummary:
    """A pair of scans verified by induction: `body` is the problem of the two
    bodies (its graphs are `seq.body` and `dist.body`)."""

    seq: ScanSide
    dist: ScanSide
    body: "Problem"
    tables: dict | None = None  # the body's fact tables, once made (rewrites change `body`)

    @property
    def where(self) -> str:
        return self.dist.where or self.seq.where


class InductionOpen(Exception):
    """The induction over a scan does not close: the scans must be unrolled."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"scan at {where} unrolled: {reason}")
        self.where = where
        self.reason = reason


@dataclass
class Induction:
    """What the induction over one summary concluded."""

    seeds: set[ViewRow] = field(default_factory=set)
    views: list[ViewRow] = field(default_factory=list)  # of the outer results


def _offsets(rec: object) -> list[int]:
    out = []
    while rec is not None:
        h, rec = rec  # type: ignore[misc]
        out.append(h)
    return out


def _record(offs: list[int]) -> object:
    rec: object = None
    for o in reversed(offs):
        rec = (o, rec)
    return rec


def _pairs(a: list[int], b: list[int]) -> dict[int, list[int]]:
    """outer tensor -> its placeholders (one outer tensor may be passed twice)."""
    out: dict[int, list[int]] = {}
    for x, y in zip(a, b):
        out.setdefault(x, []).append(y)
    return out


def splat_views(problem: "Problem", tables: dict) -> dict[int, set[ViewRow]]:
    """Views between the summarised scans' sequential and distributed consts and
    initial carries that hold the same single value everywhere (a zero-initialised
    accumulator): any block of one is the other (every offset a wildcard), when
    their ranks agree and the distributed dims are no larger. The rules relate
    splats only where an op reads them (elementwise.dl), so nothing relates these."""
    from dlverify import schema as S

    seq_val = {t: v for t, v in tables.get(S.SEQ_SPLAT, [])}
    dist_val: dict[int, dict[int, int]] = {}
    for t, r, v in tables.get(S.DIST_SPLAT, []):
        dist_val.setdefault(t, {})[r] = v
    out: dict[int, set[ViewRow]] = {}
    unit = tuple(S.UNIT_SCALE)
    for sc in problem.scans:
        for s_list, d_list in ((sc.seq.consts, sc.dist.consts), (sc.seq.init, sc.dist.init)):
            for s in s_list:
                if s not in seq_val:
                    continue
                s_shape = problem.seq.tensors[s].shape
                for d in d_list:
                    d_shape = problem.dist.tensors[d].shape
                    if len(d_shape) != len(s_shape) or any(a > b for a, b in zip(d_shape, s_shape)):
                        continue
                    for r, v in dist_val.get(d, {}).items():
                        if v == seq_val[s]:
                            out.setdefault(s, set()).add(
                                (s, d, r, _record([-1] * len(s_shape)), None, unit))
    return out


def body_seeds(sc: ScanSummary, by_seq: dict[int, set[ViewRow]]) -> set[ViewRow]:
    """Step 1: the seeds of the body's placeholders, from the outer views."""
    seeds: set[ViewRow] = set()
    # consts with consts, carries with carries (a const related to a carry holds
    # entering the first iteration only, seldom after it)
    for s_state, d_state in (
            (_pairs(sc.seq.consts, sc.seq.body_consts), _pairs(sc.dist.consts, sc.dist.body_consts)),
            (_pairs(sc.seq.init, sc.seq.body_carry), _pairs(sc.dist.init, sc.dist.body_carry))):
        for s_outer, s_bodies in s_state.items():
            for s, d, r, o, p, c in by_seq.get(s_outer, ()):
                if p is not None or d not in d_state:
                    continue
                for sb in s_bodies:
                    for db in d_state[d]:
                        seeds.add((sb, db, r, o, None, c))
    s_rows = _pairs(sc.seq.xs, sc.seq.body_rows)
    d_rows = _pairs(sc.dist.xs, sc.dist.body_rows)
    for s_outer, s_bodies in s_rows.items():
        for s, d, r, o, p, c in by_seq.get(s_outer, ()):
            if p is not None or d not in d_rows:
                continue
            offs = _offsets(o)
            if not offs or offs[0] != 0:
                continue
            row = _record(offs[1:])
            for sb in s_bodies:
                for db in d_rows[d]:
                    seeds.add((sb, db, r, row, None, c))
    return seeds


def conclude(sc: ScanSummary, seeds: set[ViewRow], body_views: set[ViewRow]) -> list[ViewRow]:
    """Steps 3 and 4: check that the seeds close over one body, then the views
    of the outer results. Raises InductionOpen when they do not close."""
    s_next = dict(zip(sc.seq.body_carry, sc.seq.carry_out()))
    d_next = dict(zip(sc.dist.body_carry, sc.dist.carry_out()))
    s_carry, d_carry = set(sc.seq.body_carry), set(sc.dist.body_carry)
    for s, d, r, o, p, c in sorted(seeds, key=repr):
        if s not in s_carry and d not in d_carry:
            continue
        after = (s_next.get(s, s), d_next.get(d, d), r, o, p, c)
        if after not in body_views:
            j = sc.seq.body_carry.index(s) if s in s_carry else None
            k = sc.dist.body_carry.index(d) if d in d_carry else None
            which = f"seq carry {j}" if j is not None else f"dist carry {k}"
            raise InductionOpen(sc.where, "the carry's view after the body differs from before "
                                f"({which}, rank {r}, offsets {_offsets(o)})")
    out: list[ViewRow] = []
    s_final = _pairs(sc.seq.carry_out(), sc.seq.final)
    d_final = _pairs(sc.dist.carry_out(), sc.dist.final)
    s_ys = _pairs(sc.seq.y_rows(), sc.seq.ys)
    d_ys = _pairs(sc.dist.y_rows(), sc.dist.ys)
    for s, d, r, o, p, c in body_views:
        if p is not None:
            continue
        if s in s_final and d in d_final:
            out.extend((so, do, r, o, None, c) for so in s_final[s] for do in d_final[d])
        if s in s_ys and d in d_ys:
            stacked = _record([0] + _offsets(o))
            out.extend((so, do, r, stacked, None, c) for so in s_ys[s] for do in d_ys[d])
    return sorted(set(out), key=repr)


def induct(sc: ScanSummary, by_seq: dict[int, set[ViewRow]],
           run_body: Callable[[ScanSummary, set[ViewRow]], set[ViewRow]]) -> Induction:
    """Steps 1-4 for one summary; `run_body` derives the body's views from seeds."""
    seeds = body_seeds(sc, by_seq)
    body_views = run_body(sc, seeds)
    return Induction(seeds, conclude(sc, seeds, body_views))


def pair_scans(seq: list[ScanSide], dist: list[ScanSide]) -> str | None:
    """Why the scans of the two programs do not pair (None when they do)."""
    if len(seq) != len(dist):
        return f"the sequential program has {len(seq)} scans and the distributed one {len(dist)}"
    for a, b in zip(seq, dist):
        if a.length != b.length or a.reverse != b.reverse:
            return (f"scan at {b.where}: length {b.length} (reverse={b.reverse}) does not pair "
                    f"with the scan at {a.where}: length {a.length} (reverse={a.reverse})")
        if len(a.ys) != len(b.ys) and (not a.ys or not b.ys):
            return f"scan at {b.where}: one side stacks outputs, the other none"
    return None


def verify_with_induction(problem: "Problem", verify: Callable[["Problem"], object]) -> object:
    """Verify with the scans summarised; a run that is not verified (or whose
    induction does not close) is verified again with every scan unrolled, and
    its notes say which scan and why."""
    if not problem.scans or problem.unroll is None:
        return verify(problem)
    import time

    unroll = problem.unroll
    where = ", ".join(dict.fromkeys(sc.where for sc in problem.scans))  # (a grad's two scans share a line)
    t0 = time.perf_counter()
    try:
        res = verify(problem)
    except InductionOpen as e:
        reason = str(e)
    else:
        if getattr(res, "verified", False):
            problem.unroll = None  # (a closure over the traced programs: not kept in the result)
            res.notes.append(f"{len(problem.scans)} scan(s) at {where} verified by induction "  # type: ignore[attr-defined]
                             "over one body each (dlverify/induction.py)")
            return res
        reason = f"scan at {where} unrolled: not verified with the body summarised"
    problem.unroll = None
    attempt = time.perf_counter() - t0
    again = unroll()
    res = verify(again)
    res.notes.append(reason)  # type: ignore[attr-defined]
    res.timings["induction_attempt"] = attempt  # type: ignore[attr-defined]
    return res


def run_with_scans(graph: Graph, sides: list[ScanSide], ranks: int, coords: Callable | None,
                   inputs: list[list]) -> dict[int, list]:
    """Run `graph` (inputs[i][r]: input i on rank r) on the shared evaluator, each
    summarised scan of `sides` by running its body once per iteration (the
    numeric soundness checks of the views concluded by induction)."""
    import numpy as np

    from dlverify.interpret import Interpreter

    vals: dict[int, list] = {t: [np.asarray(v) for v in per_rank]
                             for t, per_rank in zip(graph.inputs, inputs)}
    owner = {t: side for side in sides for t in side.final + side.ys}

    def run_ops(g: Graph, env: dict[int, list]) -> None:
        interp = Interpreter(g, ranks, coords)
        for op in g.ops:
            for t in op.inputs:
                if t not in env and t in owner and g is graph:
                    run_scan(owner[t])
            out = g.tensors[op.output]
            res = interp.op(op, [env[i] for i in op.inputs])
            env[op.output] = [np.asarray(v).reshape(out.shape) for v in res]

    def run_scan(side: ScanSide) -> None:
        carry = [vals[t] for t in side.init]
        ys: list[list[list]] = [[[] for _ in range(ranks)] for _ in side.ys]
        order = range(side.length - 1, -1, -1) if side.reverse else range(side.length)
        for i in order:
            env = {b: vals[o] for b, o in zip(side.body_consts, side.consts)}
            env.update(zip(side.body_carry, carry))
            env.update((b, [x[i] for x in vals[o]]) for b, o in zip(side.body_rows, side.xs))
            run_ops(side.body, env)
            carry = [env[t] for t in side.carry_out()]
            for k, t in enumerate(side.y_rows()):
                for r in range(ranks):
                    ys[k][r].append((i, env[t][r]))
        for t, c in zip(side.final, carry):
            vals[t] = c
        for t, per_rank in zip(side.ys, ys):
            vals[t] = [np.stack([y for _, y in sorted(rows, key=lambda iy: iy[0])])
                       for rows in per_rank]

    run_ops(graph, vals)
    for side in sides:  # results nobody reads (program outputs)
        if side.final and side.final[0] not in vals or side.ys and side.ys[0] not in vals:
            run_scan(side)
    return vals


@contextmanager
def pinned_scan_operands(problem: "Problem") -> Iterator[None]:
    """While the IR passes rewrite `problem`, the summarised scans' operands are
    extra outputs of their graphs: no op reads them (a summary is not an op), so a
    rewrite could otherwise replace or drop them. Afterwards the summaries name
    the tensors the passes left in their place."""
    pinned = [(g, [getattr(sc, side) for sc in problem.scans])
              for g, side in ((problem.seq, "seq"), (problem.dist, "dist"))]
    counts = []
    for g, sides in pinned:
        counts.append(len(g.outputs))
        for s in sides:
            g.outputs.extend(s.consts + s.init + s.xs)
    try:
        yield
    finally:
        for (g, sides), n in zip(pinned, counts):
            tail = g.outputs[n:]
            del g.outputs[n:]
            for s in sides:
                k, m = len(s.consts), len(s.init)
                s.consts, s.init = tail[:k], tail[k:k + m]
                s.xs = tail[k + m:k + m + len(s.xs)]
                tail = tail[k + m + len(s.xs):]
