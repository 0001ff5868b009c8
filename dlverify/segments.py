"""Segment-by-segment evaluation of the rules, for deep graphs.

One fixpoint over a whole deep graph costs time quadratic in its depth (on
clingo and Soufflé alike, see shared/research/engines.md), so large problems
are evaluated in segments: a window of distributed ops in program order paired
with a window of sequential ops. Each segment's engine run gets every fact of
its ops (all of an op's facts, never part of them), the facts of the tensors
they touch, the interned values and reduction sizes those facts name, and as
seeds the views and padded views (datalog/padded.dl: blocks of uneven shards)
already derived for the tensors its ops read. Every rule is sound on any such
subset, so the union of the segments' views is sound.

The schedule follows the derivation, not a clock:
- a segment starts at the first distributed op that is *ready* (its operands
  have views or padded views, its result has neither) and has not been tried
  yet; an op ready at the start of a segment counts as tried, so every segment
  makes progress and a chain of any length advances one segment at a time;
- it ends at a boundary of the program's repeated blocks (dlverify/structure.py:
  forward layers, backward layers) when it lies in one, so the segments of
  equal layers are equal up to renaming and one engine run serves them all
  (dlverify/memo.py);
- the sequential window starts at the first *partner* of a distributed op
  ready at the start: a sequential op of the same kind whose operands are
  related to that op's operands (one not yet related preferred), or earlier at
  the first ready, untried sequential op (tables computed from constants); it
  covers as many sequential blocks as the distributed window covers blocks of
  the paired repetition, else the ops' ratio times 1.5. A sequential op ready
  at the start counts as tried once an op after it in the window was related.
- ops outside the window that compute, from constants alone, a tensor the
  window reads (iota, broadcast constants) join it: their views come from their
  own facts.

Outputs and the failing frontier are judged after the last segment from the
union of the views (the same definitions as datalog/verdict.dl), so no
whole-program rows travel with every segment.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Callable, Collection, Iterable

from dlverify import schema as S
from dlverify.engine import EngineName, run_program
from dlverify.facts import FactTables
from dlverify.induction import ScanSummary, induct, splat_views
from dlverify.ir import Graph
from dlverify.memo import (SIG_COLUMNS, Derived, Memo, PadRow, canonicalise, offsets_record,
                           pad_seed_views, pad_views_back, views_back)
from dlverify.problem import Problem
from dlverify.structure import Segment, SegmentPlan, block_end, containing, find_repetitions

# Small relations every segment needs whole.
GLOBAL = frozenset({S.RANK_COUNT})
# Judged once after the last segment (see `_judge_outputs`).
OUTPUT_RELS = frozenset({S.OUTPUT_PAIR, S.OUTPUT_OFF})
SEEDS = frozenset({S.SEED, S.SEED_OFF, S.PAD_SEED, S.PAD_SEED_OFF})
SEQ_SLACK = 1.5  # sequential ops per distributed op, times the programs' ratio, off the blocks

ViewRow = tuple  # (s, d, r, offsets-record, tag-record | None, scale-record), as the engine returns it


@dataclass
class SegmentedRun:
    relations: dict[str, list[tuple]]
    seconds: float
    engine: str
    windows: int
    per_window: list[float] = field(default_factory=list)
    plan: SegmentPlan | None = None  # how the programs were cut and paired


class _Index:
    """Rows of the fact tables grouped by the op, tensor or value they describe."""

    def __init__(self, tables: FactTables) -> None:
        self.by_op: dict[int, list[tuple[str, tuple]]] = defaultdict(list)
        self.by_tensor: dict[int, list[tuple[str, tuple]]] = defaultdict(list)
        self.by_value: dict[int, list[tuple[str, tuple]]] = defaultdict(list)
        self.contract: dict[int, list[tuple]] = defaultdict(list)
        # rows about an op signature (no op or tensor column): they travel with the
        # window's Op_Sig rows of that signature
        self.by_sig: dict[int, list[tuple[str, tuple]]] = defaultdict(list)
        self.global_rows: dict[S.Relation, list[tuple]] = {}
        self.relation = {rel.name: rel for rel in tables}  # rows are grouped by name
        for rel, rows in tables.items():
            if rel in GLOBAL or rel in OUTPUT_RELS:
                self.global_rows[rel] = list(rows)
                continue
            if rel in SEEDS:
                continue
            if rel is not S.OP_SIG and rel.name in SIG_COLUMNS:
                c = rel.column_index(SIG_COLUMNS[rel.name])
                for row in rows:
                    self.by_sig[row[c]].append((rel.name, row))
                continue
            op_cols = [i for i, c in enumerate(rel.columns) if c.type == "OpId"]
            t_cols = [i for i, c in enumerate(rel.columns) if c.type == "TensorId"]
            if not op_cols and not t_cols and rel.columns[0].type == "ValueId":
                # about an interned value (Value_Int, Value_Ratio, ...): travels with
                # the splat rows naming it (_window_tables)
                for row in rows:
                    self.by_value[row[0]].append((rel.name, row))
                continue
            assert op_cols or t_cols, f"{rel.name}: no column to place its rows by"
            if rel is S.CONTRACT_SIZE:
                for row in rows:
                    self.contract[row[0]].append(row)
            # Rows are placed by relation name (a str caches its hash; a Relation does not).
            name = rel.name
            if op_cols:
                c = op_cols[0]
                for row in rows:
                    self.by_op[row[c]].append((name, row))
            else:
                c = t_cols[0]
                for row in rows:
                    self.by_tensor[row[c]].append((name, row))


class _Side:
    """Readiness bookkeeping of one program: which tensors have views (or need
    none), which ops have all operands related, which ops were tried."""

    def __init__(self, g: Graph, has: set[int]) -> None:
        self.ops = g.ops
        self.has = has
        self.consumers: dict[int, list[int]] = defaultdict(list)
        self.pending: list[int] = []
        self.tried: set[int] = set()
        self.heap: list[int] = []
        self.last_use = {t: len(g.ops) for t in g.outputs}
        self.producer = {op.output: i for i, op in enumerate(g.ops)}
        for i, op in enumerate(g.ops):
            ins = set(op.inputs)
            for t in ins:
                self.consumers[t].append(i)
                self.last_use[t] = i
            missing = sum(1 for t in ins if t not in has)
            self.pending.append(missing)
            if missing == 0 and op.inputs:
                self.heap.append(i)
        heapq.heapify(self.heap)

    def ready(self, i: int) -> bool:
        op = self.ops[i]
        return bool(op.inputs) and self.pending[i] == 0 and op.output not in self.has

    def add(self, t: int) -> None:
        if t in self.has:
            return
        self.has.add(t)
        for i in self.consumers.get(t, ()):
            self.pending[i] -= 1
            if self.pending[i] == 0:
                heapq.heappush(self.heap, i)

    def first_ready(self) -> int | None:
        while self.heap:
            i = self.heap[0]
            if i in self.tried or not self.ready(i):
                heapq.heappop(self.heap)
                continue
            return i
        return None


def run_segmented(problem: Problem, tables: FactTables, main_dl: Path, engine: EngineName,
                  window: int, cache_dir: Path | None = None,
                  progress: "Callable[[int, int], None] | None" = None,
                  seeds_in: set[ViewRow] | None = None) -> SegmentedRun:
    """`seeds_in`: views given besides the input relations (the seeds of a scan
    body's placeholders, dlverify/induction.py)."""
    t_start = time.perf_counter()  # (the index and the block search included)
    index = _Index(tables)
    seq, dist = problem.seq, problem.dist
    seq_ops, dist_ops = seq.ops, dist.ops

    # Tensors that have a view, or need none (constants): what "ready" is judged by.
    has_s = set(seq.inputs) | {op.output for op in seq_ops if not op.inputs}
    has_s |= {row[0] for row in tables.get(S.SEQ_SPLAT, [])}
    constants_d = {op.output for op in dist_ops if not op.inputs}
    constants_d |= {row[0] for row in tables.get(S.DIST_SPLAT, [])}
    has_d = set(dist.inputs) | constants_d
    side_s, side_d = _Side(seq, has_s), _Side(dist, has_d)

    # Insertion-ordered (a dict): the views come out in the order they were derived,
    # which is deterministic, without sorting a deep run's 10^5 rows by their repr.
    known: dict[ViewRow, None] = {}
    by_seq: dict[int, set[ViewRow]] = defaultdict(set)
    by_dist: dict[int, set[ViewRow]] = defaultdict(set)

    def learn(rows: Iterable[ViewRow]) -> int:
        """Add views; how many were new. (One loop over a segment's views: a deep
        training step learns 10^5 of them.)"""
        new = 0
        for row in rows:
            if row in known:
                continue
            known[row] = None
            s, d = row[0], row[1]
            by_seq[s].add(row)
            by_dist[d].add(row)
            if s not in has_s:
                side_s.add(s)
            if d not in has_d:
                side_d.add(d)
            new += 1
        return new

    # Padded views (blocks of uneven shards, datalog/padded.dl) are carried like views:
    # a tensor with only a padded view is related (its valid part) for the ready test.
    known_pad: dict[PadRow, None] = {}
    pad_by_seq: dict[int, set[PadRow]] = defaultdict(set)
    pad_by_dist: dict[int, set[PadRow]] = defaultdict(set)

    def learn_padded(rows: Iterable[PadRow]) -> int:  # as learn(), for padded views
        new = 0
        for row in rows:
            if row in known_pad:
                continue
            known_pad[row] = None
            pad_by_seq[row[0]].add(row)
            pad_by_dist[row[1]].add(row)
            side_s.add(row[0])
            side_d.add(row[1])
            new += 1
        return new

    # The input relations are the first seeds.
    offs: dict[int, dict[int, int]] = defaultdict(dict)
    for sid, i, o in tables.get(S.SEED_OFF, []):
        offs[sid][i] = o
    for row in tables.get(S.SEED, []):
        sid, s, d, r, tag, scale = S.seed_fields(row)
        o = tuple(offs[sid][i] for i in range(len(offs[sid])))
        learn([(s, d, r, offsets_record(o), tag, scale)])
    for row in sorted(seeds_in or (), key=repr):
        learn([row])
    learn_padded(pad_seed_views(tables))
    pending_scans = list(problem.scans)
    splats = splat_views(problem, tables) if pending_scans else {}
    body_plans: list[SegmentPlan] = []  # of the scan bodies' runs

    def run_body(sc: ScanSummary, seeds: set[ViewRow]) -> set[ViewRow]:
        from dlverify.api import problem_tables  # (api imports this module)

        if sc.tables is None:
            sc.tables = problem_tables(sc.body)
        run = run_segmented(sc.body, sc.tables, main_dl, engine, window, cache_dir,
                            seeds_in=seeds)
        if run.plan is not None:
            plan.engine_runs += run.plan.engine_runs
            body_plans.append(run.plan)
        return set(run.relations[S.VIEW.name])

    rep_s, rep_d = find_repetitions(seq), find_repetitions(dist)
    plan = SegmentPlan(rep_s, rep_d)
    engines_used: list[str] = []

    def evaluate(order: list[int], seeds: set[ViewRow],
                 pad_seeds: set[PadRow]) -> tuple[list[ViewRow], list[PadRow], str, float]:
        """The views and padded views one window derives (ids and op/operand/result
        order in `order`), from the memo when an equal window ran before; where they
        came from; seconds."""
        wt = _window_tables(index, order, seeds, pad_seeds)
        canon = canonicalise(order, wt, seeds, pad_seeds)
        t0 = time.perf_counter()
        got = memo.get(canon.key)
        source = "memo"
        if got is None:
            res = run_program(main_dl, canon.tables, [S.VIEW, S.PAD_VIEW], engine=engine)
            engines_used.append(res.engine)
            got = Derived([tuple(r) for r in res.relations[S.VIEW.name]],
                          [tuple(r) for r in res.relations[S.PAD_VIEW.name]])
            memo.put(canon.key, got)
            source = "engine"
            plan.engine_runs += 1
        elif memo.disk_hits > plan.cache_hits:
            source = "cache"
        plan.cache_hits = memo.disk_hits
        seconds = time.perf_counter() - t0
        per_window.append(seconds)
        return views_back(canon, got.views), pad_views_back(canon, got.padded), source, seconds

    memo = Memo(main_dl, str(engine), cache_dir)
    ratio = len(seq_ops) / max(1, len(dist_ops))
    per_window: list[float] = []
    floor_s = 0
    late_constants = sorted(_from_constants(dist, constants_d) - side_d.has)
    while True:
        p = side_d.first_ready()
        if p is None:
            # Nothing left to evaluate before a scan's results: the first scan whose
            # operands all have views is concluded by induction (dlverify/induction.py).
            sc = next((sc for sc in pending_scans
                       if all(t in side_s.has for t in sc.seq.operands())
                       and all(t in side_d.has for t in sc.dist.operands())), None)
            if sc is None:
                if late_constants:
                    # An op reading a tensor computed from constants alone that has no
                    # view (a mask of the padding: Mask_Prefix is derived per run) would
                    # wait forever: such tensors now need none, so their consumers get
                    # ready and their producers join the window (_constant_producers).
                    for t in late_constants:
                        side_d.add(t)
                    late_constants = []
                    continue
                break
            pending_scans.remove(sc)
            t0 = time.perf_counter()
            outer = {t: by_seq.get(t, set()) | splats.get(t, set()) for t in sc.seq.operands()}
            concluded = induct(sc, outer, run_body)
            new = learn(concluded.views)
            plan.inductions.append(f"scan at {sc.where}: body verified once for {sc.seq.length} "
                                   f"iterations, {len(concluded.seeds)} seeds, {new} views of "
                                   f"its results, {time.perf_counter() - t0:.2f} s")
            if body_plans:  # (-v: the body's own segments)
                plan.body_segments.extend(f"scan at {sc.where}: body {seg.line()}"
                                          for seg in body_plans[-1].segments)
            continue
        if progress is not None:  # the CLI's progress line: distributed ops reached
            progress(p, len(dist_ops))
        end = block_end(rep_d, p, window, len(dist_ops))
        d_hi, reason = end.stop, end.reason
        d_reads = {t for op in dist_ops[p:d_hi] for t in op.inputs}
        ready_d = [i for i in range(p, d_hi) if side_d.ready(i) and i not in side_d.tried]
        # Where the window's partners begin; earlier when ops computed from
        # constants alone (rope tables, masks) are still waiting.
        q = _seq_start(ready_d, dist_ops, seq_ops, by_dist, side_s, max(1, (d_hi - p) // 2))
        why = "from the first partner (same kind, related operands) of a ready distributed op"
        first = side_s.first_ready()
        if first is not None and (q is None or first < q):
            q, why = first, "from the first ready sequential op (computed from constants)"
        if q is None:
            q, why = floor_s, "where the previous one started (no partner candidates)"
        k = containing(rep_d, p)
        if k is not None and len(rep_s) == len(rep_d):
            # The k-th repetitions of the two programs are the same layers.
            s_len = math.ceil((d_hi - p) / rep_d[k].period) * rep_s[k].period
            why += f", as many sequential blocks of {rep_s[k].period} ops"
        else:
            s_len = math.ceil((d_hi - p) * max(1.0, ratio) * SEQ_SLACK) + 1
        s_hi = min(len(seq_ops), q + s_len)
        ready_s = [i for i in range(q, s_hi) if side_s.ready(i) and i not in side_s.tried]

        order: list[int] = []
        w_ops = (_constant_producers(side_s, q, s_hi, by_seq, pad_by_seq) + seq_ops[q:s_hi]
                 + _constant_producers(side_d, p, d_hi, by_dist, pad_by_dist) + dist_ops[p:d_hi])
        for op in w_ops:
            order.append(op.id)
            order.extend(op.inputs)
            order.append(op.output)
        seeds: set[ViewRow] = set()
        pad_seeds: set[PadRow] = set()
        for op in seq_ops[q:s_hi]:
            for t in op.inputs:
                seeds |= by_seq.get(t, set())
                pad_seeds |= pad_by_seq.get(t, set())
        for t in d_reads:
            seeds |= by_dist.get(t, set())
            pad_seeds |= pad_by_dist.get(t, set())

        def live(row: tuple) -> bool:
            return side_s.last_use.get(row[0], -1) >= q and side_d.last_use.get(row[1], -1) >= p
        seeds = set(filter(live, seeds))
        pad_seeds = set(filter(live, pad_seeds))
        derived, derived_pad, source, seconds = evaluate(order, seeds, pad_seeds)
        new = learn(derived) + learn_padded(derived_pad)

        side_d.tried.update(ready_d)
        matched = [i for i in range(q, s_hi)
                   if seq_ops[i].output in by_seq or seq_ops[i].output in pad_by_seq]
        if matched:
            side_s.tried.update(i for i in ready_s if i <= matched[-1])
        floor_s = q
        plan.segments.append(Segment(len(plan.segments), (q, s_hi), (p, d_hi),
                                     len(seeds) + len(pad_seeds), new,
                                     seconds, source, f"distributed: {reason}; sequential: {why}"))
    plan.memo_hits = memo.hits + sum(b.memo_hits for b in body_plans)
    plan.cache_hits = memo.disk_hits + sum(b.cache_hits for b in body_plans)
    relations = {
        S.VIEW.name: list(known),
        S.PAD_VIEW.name: list(known_pad),
        S.OUTPUT_OK.name: _judge_outputs(index, known, main_dl, engine),
        **_frontiers(problem, tables, known, known_pad),
    }
    engine_name = engines_used[-1] if engines_used else ""
    return SegmentedRun(relations, time.perf_counter() - t_start, engine_name or str(engine),
                        len(per_window), per_window, plan)


def _from_constants(g: Graph, constants: set[int]) -> set[int]:
    """Tensors of g computed from `constants` (nullary ops' results, splats) alone:
    those, and the results of ops reading only such tensors (program order)."""
    out = set(constants)
    for op in g.ops:
        if op.inputs and all(t in out for t in op.inputs):
            out.add(op.output)
    return out


def _constant_producers(side: _Side, lo: int, hi: int, views: dict[int, set[ViewRow]],
                        padded: dict[int, set[PadRow]]) -> list:
    """Ops outside [lo, hi) that compute, from constants alone, tensors the window
    reads and that have no view (nor padded view) yet (iota, broadcast constants):
    their views are derived from their own facts, so they join the window."""
    prod = side.producer
    want: set[int] = set()
    stack = [t for op in side.ops[lo:hi] for t in op.inputs]
    while stack:
        t = stack.pop()
        i = prod.get(t)
        if i is None or lo <= i < hi or i in want or t not in side.has or t in views or t in padded:
            continue
        want.add(i)
        stack.extend(side.ops[i].inputs)
    return [side.ops[i] for i in sorted(want)]


def _seq_start(ready_d: list[int], dist_ops: list, seq_ops: list,
               by_dist: dict[int, set[ViewRow]], side_s: _Side, look_back: int) -> int | None:
    """Where the partners of the distributed ops ready at the start of the window
    begin. A partner has the same kind and arity, and each operand related to the
    distributed operand at the same position (operands with no view yet,
    constants, match anything). Ops of equal operands recur (a broadcast of a norm
    weight in the forward and again in the backward pass), so a partner whose
    result has no view yet ("fresh") is preferred; an already related one counts
    only within `look_back` ops before the first fresh one (a sequential value
    shared by two distributed values). None when no ready op has a partner."""
    first_fresh: int | None = None
    done: list[int] = []
    for i in ready_d:
        dop = dist_ops[i]
        related = [{row[0] for row in by_dist.get(t, ())} for t in dop.inputs]
        # search from the operand whose related tensors have the fewest readers (a
        # shared constant, read by every op of a chain, would make the search linear)
        keyed = [(sum(len(side_s.consumers.get(x, ())) for x in r), k)
                 for k, r in enumerate(related) if r]
        if not keyed:
            continue
        _, k = min(keyed)
        fresh: int | None = None
        old: int | None = None
        for s in related[k]:
            for c in side_s.consumers.get(s, ()):
                if fresh is not None and c >= fresh:
                    break
                sop = seq_ops[c]
                if sop.kind != dop.kind or len(sop.inputs) != len(dop.inputs):
                    continue
                if not all(not r or t in r for t, r in zip(sop.inputs, related)):
                    continue
                if sop.output not in side_s.has:
                    fresh = c
                    break
                if old is None or c < old:
                    old = c
        if fresh is not None:
            if first_fresh is None or fresh < first_fresh:
                first_fresh = fresh
        elif old is not None:
            done.append(old)
    if first_fresh is None:
        return min(done, default=None)
    near = [c for c in done if first_fresh - look_back <= c < first_fresh]
    return min(near, default=first_fresh)


def _window_tables(index: _Index, order: list[int], seeds: set[ViewRow],
                   pad_seeds: Collection[PadRow] = ()) -> dict[S.Relation, list[tuple]]:
    """Every fact the rules can read about the window's ops, tensors and values
    (and the tensors the seeds and padded seeds name).
    (Rows are grouped by relation name: hashing a Relation per row costs more than
    everything else here.)"""
    wt: dict[str, list[tuple]] = defaultdict(list)
    for rel, rows in index.global_rows.items():
        if rel not in OUTPUT_RELS:
            wt[rel.name] = list(rows)
    seen: set[int] = set()
    tensors: list[int] = []
    for x in order:
        if x in seen:
            continue
        seen.add(x)
        for name, row in index.by_op.get(x, ()):
            wt[name].append(row)
        tensors.append(x)
    if index.by_sig:
        c = S.OP_SIG.column_index(SIG_COLUMNS[S.OP_SIG.name])
        for sig in dict.fromkeys(row[c] for row in wt.get(S.OP_SIG.name, ())):
            for name, row in index.by_sig.get(sig, ()):
                wt[name].append(row)
    for s, d, *_ in chain(seeds, pad_seeds):
        for t in (s, d):
            if t not in seen:
                seen.add(t)
                tensors.append(t)
    values: set[int] = set()
    seq_splat, dist_splat = S.SEQ_SPLAT.name, S.DIST_SPLAT.name
    for t in tensors:
        for name, row in index.by_tensor.get(t, ()):
            wt[name].append(row)
            if name == seq_splat:
                values.add(row[1])
            elif name == dist_splat:
                values.add(row[2])
    # Partial terms carried in from earlier segments name their reduction: its size.
    for _, _, _, _, tag, _ in seeds:
        if tag is not None and tag[1] not in seen:
            wt[S.CONTRACT_SIZE.name].extend(index.contract.get(tag[1], ()))
    ratio = S.VALUE_RATIO.name
    for v in values:
        for name, row in index.by_value.get(v, ()):
            if name != ratio or row[1] in values:
                wt[name].append(row)
    return {index.relation[name]: rows for name, rows in wt.items()}


def _judge_outputs(index: _Index, known: Collection[ViewRow], main_dl: Path,
                   engine: EngineName) -> list[tuple]:
    """Output_Ok, from the expected relations and the views of the output pairs."""
    pairs = index.global_rows.get(S.OUTPUT_PAIR, [])
    if not pairs:
        return []
    wanted = {(s, d) for s, d, _ in pairs}
    seeds = {v for v in known if (v[0], v[1]) in wanted}
    order = [t for s, d in sorted(wanted) for t in (s, d)]
    wt = _window_tables(index, order, seeds)
    for rel in OUTPUT_RELS:
        wt[rel] = list(index.global_rows.get(rel, []))
    canon = canonicalise(order, wt, seeds)
    res = run_program(main_dl, canon.tables, [S.OUTPUT_OK], engine=engine)
    b = canon.back
    return sorted((b[s], b[d], r) for s, d, r in res.relations[S.OUTPUT_OK.name])


def _frontiers(problem: Problem, tables: FactTables, known: Collection[ViewRow],
               padded: Collection[PadRow]) -> dict[str, list[tuple]]:
    """Seq_Frontier and Dist_Frontier of the union of the views and padded views, as
    datalog/verdict.dl defines them: ops whose operands are all related (or constants)
    but whose result is not; a padded block counts as related where an op reads it
    (at an output, padding nothing cut off is where the relation ends).
    (Zero, derived per segment, is not carried here: a failing deep run may list an op
    reading a tensor that is zero on some rank.)"""
    ranks = range(int(tables[S.RANK_COUNT][0][0])) if tables.get(S.RANK_COUNT) else range(1)
    # iotas and constants written in the program are known, related or not
    known_ops = {row[0] for row in tables.get(S.IOTA_DIM, []) + tables.get(S.KNOWN_CONST, [])}
    seq_has = {v[0] for v in known} | {row[0] for row in tables.get(S.SEQ_SPLAT, [])}
    seq_has |= {op.output for op in problem.seq.ops if op.id in known_ops}
    dist_has = {(v[1], v[2]) for v in known} | {(row[0], row[1]) for row in tables.get(S.DIST_SPLAT, [])}
    dist_has |= {(op.output, r) for op in problem.dist.ops if op.id in known_ops for r in ranks}
    read = {t for op in problem.dist.ops for t in op.inputs}
    dist_has |= {(v[1], v[2]) for v in padded if v[1] in read}
    seq_front = [(op.id,) for op in problem.seq.ops
                 if op.inputs and op.output not in seq_has and all(t in seq_has for t in op.inputs)]
    dist_front = [(op.id, r) for op in problem.dist.ops if op.inputs for r in ranks
                  if (op.output, r) not in dist_has and all((t, r) in dist_has for t in op.inputs)]
    return {S.SEQ_FRONTIER.name: sorted(seq_front), S.DIST_FRONTIER.name: sorted(dist_front)}


def needs_segments(problem: Problem, window: int) -> bool:
    """Scans summarised for induction are concluded by the segmented run only."""
    return bool(problem.scans) or max(len(problem.seq.ops), len(problem.dist.ops)) > window
