"""Segment-by-segment evaluation of the rules, for deep graphs.

One fixpoint over a whole deep graph costs time quadratic in its depth (on
clingo and Soufflé alike, see shared/research/engines.md), so large problems
are evaluated in windows of ops in topological order. Each window gets the
facts of its ops (all of each op's facts, never part of them), and as seeds the
views already derived for the tensors its ops read. The rules are sound on any
such subset, so the union of the windows' views is sound; the distributed
windows advance on a fixed schedule and each sequential window follows the
sequential positions already matched, so corresponding layers meet.

The frontier of a window can name an op whose output only a later window
relates; the final frontier keeps only ops whose outputs have no view at all.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dlverify import schema as S
from dlverify.engine import EngineName, run_program
from dlverify.facts import FactTables
from dlverify.ir import Graph
from dlverify.problem import Problem

# Relations every window needs whole: they are small and not tied to the window's ops.
GLOBAL = frozenset({S.RANK_COUNT, S.VALUE_INT, S.VALUE_RATIO, S.VALUE_EXP, S.CONTRACT_SIZE,
                    S.OUTPUT_PAIR, S.OUTPUT_OFF})
SEEDS = frozenset({S.SEED, S.SEED_OFF})

ViewRow = tuple  # (s, d, r, offsets-record, tag-record | None, scale-record), as the engine returns it


@dataclass
class SegmentedRun:
    relations: dict[str, list[tuple]]
    seconds: float
    engine: str
    windows: int
    per_window: list[float] = field(default_factory=list)


def _offsets_record(offs: tuple[int, ...]) -> object:
    rec: object = None
    for o in reversed(offs):
        rec = (o, rec)
    return rec


def _record_offsets(rec: object) -> list[int]:
    out = []
    while rec is not None:
        h, rec = rec  # type: ignore[misc]
        out.append(h)
    return out


class _Index:
    """Rows of the fact tables grouped by the ops and tensors they mention."""

    def __init__(self, tables: FactTables) -> None:
        self.by_op: dict[int, list[tuple[S.Relation, tuple]]] = defaultdict(list)
        self.by_tensor: dict[int, list[tuple[S.Relation, tuple]]] = defaultdict(list)
        self.global_rows: dict[S.Relation, list[tuple]] = {}
        for rel, rows in tables.items():
            if rel in GLOBAL:
                self.global_rows[rel] = list(rows)
                continue
            if rel in SEEDS:
                continue
            op_cols = [i for i, c in enumerate(rel.columns) if c.type == "OpId"]
            t_cols = [i for i, c in enumerate(rel.columns) if c.type == "TensorId"]
            for row in rows:
                if op_cols:
                    self.by_op[row[op_cols[0]]].append((rel, row))
                elif t_cols:
                    self.by_tensor[row[t_cols[0]]].append((rel, row))


def _positions(g: Graph) -> dict[int, int]:
    """Topological position of the op producing each tensor."""
    return {op.output: i for i, op in enumerate(g.ops)}


def _last_use(g: Graph) -> dict[int, int]:
    """Position of the last op reading each tensor; outputs live to the end."""
    last = {t: len(g.ops) for t in g.outputs}
    for i, op in enumerate(g.ops):
        for t in op.inputs:
            last[t] = max(last.get(t, -1), i)
    return last


def _aligned(matched: list[int], p: int, span: int) -> int:
    """The sequential position that corresponds to distributed position p: the
    median of the matches of the last `span` distributed ops before p (a median,
    because a few ops relate to far-away positions: tables computed once, outputs)."""
    recent = sorted(m for m in matched[max(0, p - span):p + 1] if m >= 0)
    if not recent:
        earlier = [m for m in matched[:p + 1] if m >= 0]
        return max(earlier, default=-1)
    return recent[len(recent) // 2]


def _first_ready(ops: list, start: int, stop: int, has: set[int]) -> int:
    """Position of the first op in [start, stop) whose operands are all related but
    whose output is not; `stop` when there is none."""
    for p in range(start, stop):
        op = ops[p]
        if op.inputs and op.output not in has and all(i in has for i in op.inputs):
            return p
    return stop


def run_segmented(problem: Problem, tables: FactTables, main_dl: Path, engine: EngineName,
                  window: int) -> SegmentedRun:
    index = _Index(tables)
    seq_ops, dist_ops = problem.seq.ops, problem.dist.ops
    pos_s, pos_d = _positions(problem.seq), _positions(problem.dist)
    # A view can only help a window if both of its tensors are still read at or
    # after the window's start (or are outputs): dead views are not seeded, which
    # keeps the seeds of a window proportional to the window, not to the graph.
    last_s, last_d = _last_use(problem.seq), _last_use(problem.dist)
    consumers_s: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(seq_ops):
        for t in op.inputs:
            consumers_s[t].append(i)
    outputs = set(problem.seq.outputs) | set(problem.dist.outputs)

    known: set[ViewRow] = set()
    by_seq: dict[int, set[ViewRow]] = defaultdict(set)
    by_dist: dict[int, set[ViewRow]] = defaultdict(set)

    def learn(row: ViewRow) -> None:
        if row not in known:
            known.add(row)
            by_seq[row[0]].add(row)
            by_dist[row[1]].add(row)

    # The input relations are the first seeds.
    offs: dict[int, dict[int, int]] = defaultdict(dict)
    for sid, i, o in tables.get(S.SEED_OFF, []):
        offs[sid][i] = o
    for row in tables.get(S.SEED, []):
        sid, s, d, r, red, op, ax, lo, hi, *e = row
        o = tuple(offs[sid][i] for i in range(len(offs[sid])))
        learn((s, d, r, _offsets_record(o), None if red < 0 else (red, op, ax, lo, hi), tuple(e)))

    # matched[p] = the furthest sequential position related to the distributed op at p (-1: none)
    matched = [-1] * max(1, len(dist_ops))
    seq_per_dist = max(1.0, len(seq_ops) / max(1, len(dist_ops)))
    seq_width = int(window * seq_per_dist * 1.5) + 1
    back = max(4, window // 8)  # overlap between consecutive windows, for alignment drift
    reach = 4 * window
    # Tensors that have a view, or need none (constants): what "ready" is judged by.
    has_s = set(problem.seq.inputs) | {op.output for op in seq_ops if not op.inputs}
    has_s |= {row[0] for row in tables.get(S.SEQ_SPLAT, [])}
    has_d = set(problem.dist.inputs) | {op.output for op in dist_ops if not op.inputs}
    has_d |= {row[0] for row in tables.get(S.DIST_SPLAT, [])}

    ok: set[tuple] = set()
    seq_front: set[int] = set()
    dist_front: set[tuple[int, int]] = set()
    per_window: list[float] = []
    engine_name = ""
    t_start = time.perf_counter()
    a = 0
    while True:
        # Each window starts at the earliest op that is ready (operands related,
        # output not yet) on either side, so a pair whose halves drifted apart
        # meets again; reaching back is capped so a stuck op cannot make windows grow.
        ready_d = _first_ready(dist_ops, max(0, a - reach), a, has_d)
        d_lo, d_hi = max(0, min(ready_d, a) - back), min(len(dist_ops), a + window)
        best = _aligned(matched, d_lo, window)
        ready_s = _first_ready(seq_ops, max(0, best - reach), max(best, 0), has_s)
        # The partners of the first ready distributed op read the sequential
        # tensors its operands are related to: start the sequential window there
        # too (its partner may already be related to something else).
        anchor = best
        if ready_d < len(dist_ops):
            floor = max(0, best - reach)
            for t in dist_ops[ready_d].inputs:
                for row in by_dist.get(t, ()):
                    for q in consumers_s.get(row[0], ()):
                        if floor <= q < anchor:
                            anchor = q
        s_lo = max(0, min(ready_s, best, anchor) - back)
        s_hi = min(len(seq_ops), max(best, 0) + seq_width)
        if a + window >= len(dist_ops):
            s_hi = len(seq_ops)  # the last window takes the rest of the sequential program
        w_ops = seq_ops[s_lo:s_hi] + dist_ops[d_lo:d_hi]
        tensors = set(outputs)
        op_ids = set()
        for op in w_ops:
            op_ids.add(op.id)
            tensors.add(op.output)
            tensors.update(op.inputs)
        seeds: set[ViewRow] = set()
        for op in seq_ops[s_lo:s_hi]:
            for t in op.inputs:
                seeds |= by_seq.get(t, set())
        for op in dist_ops[d_lo:d_hi]:
            for t in op.inputs:
                seeds |= by_dist.get(t, set())
        for t in outputs:
            seeds |= by_dist.get(t, set())
        seeds = {row for row in seeds
                 if last_s.get(row[0], -1) >= s_lo and last_d.get(row[1], -1) >= d_lo}
        for row in seeds:
            tensors.add(row[0])
            tensors.add(row[1])
        wt: dict[S.Relation, list[tuple]] = defaultdict(list)
        for rel, rows in index.global_rows.items():
            wt[rel] = rows
        for o in op_ids:
            for rel, row in index.by_op.get(o, ()):
                wt[rel].append(row)
        for t in tensors:
            for rel, row in index.by_tensor.get(t, ()):
                wt[rel].append(row)
        for sid, (s, d, r, o, p, c) in enumerate(sorted(seeds, key=repr), start=1):
            tag = p if p is not None else (-1, 0, 0, 0, 0)
            wt[S.SEED].append((sid, s, d, r, *tag, *c))
            for i, off in enumerate(_record_offsets(o)):
                wt[S.SEED_OFF].append((sid, i, off))
        res = run_program(main_dl, wt, S.OUTPUTS, engine=engine)
        engine_name = res.engine
        per_window.append(res.seconds)
        for row in res.relations[S.VIEW.name]:
            learn(tuple(row))
            s, d = row[0], row[1]
            has_s.add(s)
            has_d.add(d)
            if s in pos_s and d in pos_d:
                matched[pos_d[d]] = max(matched[pos_d[d]], pos_s[s])
        ok.update(tuple(r) for r in res.relations[S.OUTPUT_OK.name])
        seq_front.update(r[0] for r in res.relations[S.SEQ_FRONTIER.name])
        dist_front.update(tuple(r) for r in res.relations[S.DIST_FRONTIER.name])
        if d_hi >= len(dist_ops) and s_hi >= len(seq_ops):
            break
        a += window
        if a >= len(dist_ops):
            a = max(0, len(dist_ops) - window + back + 1)

    producer_s = {op.id: op.output for op in seq_ops}
    producer_d = {op.id: op.output for op in dist_ops}
    dist_has = {(row[1], row[2]) for row in known}
    relations = {
        S.VIEW.name: sorted(known, key=repr),
        S.OUTPUT_OK.name: sorted(ok),
        S.SEQ_FRONTIER.name: sorted((o,) for o in seq_front if not by_seq.get(producer_s[o])),
        S.DIST_FRONTIER.name: sorted((o, r) for o, r in dist_front if (producer_d[o], r) not in dist_has),
    }
    return SegmentedRun(relations, time.perf_counter() - t_start, engine_name, len(per_window),
                        per_window)


def needs_segments(problem: Problem, window: int) -> bool:
    return max(len(problem.seq.ops), len(problem.dist.ops)) > window
