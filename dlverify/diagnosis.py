"""The diagnosis: the engine's derived relations -> a verdict (dlverify.verdict.Result
fields): a reconstruction per proved output, or the located failures with the
recognised pattern (FAILURE_KINDS) and what each operand was related to."""
from __future__ import annotations

import functools
from collections import defaultdict

import networkx as nx

from dlverify import ir
from dlverify import schema as S
from dlverify.correspondence import counterpart_failure
from dlverify.diagnosis_origin import (earliest_origin, origin, own_loc, primitives, rescaled_sums,
                                       resummed_whole, scaled_operand, unscaled_sum)
from dlverify.diagnosis_outputs import output_failures, seq_frontier_failures
from dlverify.ir import Graph, Op
from dlverify.outputs import infer_output_relation
from dlverify.partial_tags import TRANS_BASE, full_size, group_class, is_group_axis, reindexing
from dlverify.problem import Problem
from dlverify.rank_flow import rank_ancestors
from dlverify.relations import describe_reconstruction
from dlverify.verdict import (UNIT_SCALE, Failure, ViewFact, fmt_offsets, parse_padded_views,
                              parse_views, scale_value, short_path)


class Judge:
    """Builds the Result from the engine's output relations."""

    def __init__(self, problem: Problem, relations: dict[str, list[tuple]]) -> None:
        self.p = problem
        self.views = parse_views(relations[S.VIEW.name])
        self.padded_views = parse_padded_views(relations.get(S.PAD_VIEW.name, []))
        self.by_dist: dict[tuple[int, int], list[ViewFact]] = defaultdict(list)
        for v in self.views:
            self.by_dist[(v.dist, v.rank)].append(v)
        self.output_ok = {tuple(r) for r in relations[S.OUTPUT_OK.name]}
        self.seq_frontier = {r[0] for r in relations[S.SEQ_FRONTIER.name]}
        self.dist_frontier: dict[int, list[int]] = defaultdict(list)
        for op, r in relations[S.DIST_FRONTIER.name]:
            self.dist_frontier[op].append(r)
        self.seq_ops = {op.id: op for op in problem.seq.ops}
        self.dist_ops = {op.id: op for op in problem.dist.ops}
        self.seq_prod = problem.seq.producer()
        self.dist_prod = problem.dist.producer()
        self.inferred: list[str] = []  # output relations inferred from the views

    def _origin(self, d: int, r: int, vs: list[ViewFact]) -> Op | None:
        return origin(self.dist_prod, self.by_dist, d, r, vs)   # diagnosis_origin.py

    @functools.cached_property
    def _consumers(self) -> dict[int, list[Op]]:
        return self.p.dist.consumers()

    @functools.cached_property
    def _order(self) -> dict[int, int]:
        """Distributed op id -> its position in the program."""
        return {op.id: i for i, op in enumerate(self.p.dist.ops)}

    @functools.cached_property
    def by_seq_dist(self) -> dict[tuple[int, int, int], list[ViewFact]]:
        """The views by (seq, dist, rank); only a failure's diagnosis reads them, so a
        verified deep program (10^5 views) does not pay for the index."""
        out: dict[tuple[int, int, int], list[ViewFact]] = defaultdict(list)
        for v in self.views:
            out[(v.seq, v.dist, v.rank)].append(v)
        return out

    # ------------------------------------------------------------------ naming
    def tname(self, g: Graph, t: int) -> str:
        ten = g.tensors[t]
        if t in g.inputs:
            return g.input_names[g.inputs.index(t)] if g.input_names else f"in{g.inputs.index(t)}"
        return ten.name or f"%{t}"

    def seq_desc(self, s: int) -> str:
        op = self.seq_prod.get(s)
        if op is None:
            return self.tname(self.p.seq, s)
        return f"{op.kind} at {short_path(op.loc.file)}:{op.loc.line}" if op.loc.frames else op.kind

    def view_text(self, v: ViewFact) -> str:
        shape = self.p.dist.tensors[v.dist].shape
        text = f"block {fmt_offsets(v.offsets, shape)} of {self.seq_desc(v.seq)}"
        if v.partial is not None:
            red = v.partial.reducer_name
            if is_group_axis(v.partial.axis):   # the family of a class of a collective's groups
                cls = group_class(v.partial.axis)
                group = cls.first + v.partial.lo * cls.stride
                text = (f"partial {red} (the {red} over group {group} of the {cls.count} groups "
                        f"{cls.first}, {cls.first + cls.stride}, ... of "
                        f"{self.op_desc(self.dist_ops[v.partial.op])}) of " + text)
            else:
                axis, how = v.partial.axis, ""
                if axis >= TRANS_BASE:
                    ri = reindexing(axis)
                    axis, how = ri.axis, (f", re-indexed by the transpose of its blocks of "
                                          f"{ri.block}, {ri.stride} per row")
                text = (f"partial {red} (range [{v.partial.lo}:{v.partial.hi}) of reduced dim "
                        f"{axis}{how} of {self.op_desc(self.seq_ops[v.partial.op])}) of " + text)
        if v.scale != UNIT_SCALE:
            text = f"{scale_value(v.scale)} x " + text
        return text

    def op_desc(self, op: Op) -> str:
        if op.loc.frames:
            return f"{op.kind} at {short_path(op.loc.file)}:{op.loc.line}"
        return op.kind

    # ------------------------------------------------------------------ verdict
    def judge(self) -> tuple[bool, list[str], list[Failure]]:
        p = self.p
        ranks = p.mesh.size
        outputs, failing = [], []
        for idx, (s, d) in enumerate(zip(p.seq.outputs, p.dist.outputs)):
            name = p.seq.output_names[idx] if p.seq.output_names else f"out{idx}"
            rel = p.outputs[idx]
            if rel is None:
                # No expected relation given: the one the complete views tile, if any.
                rel = infer_output_relation(p, idx, self.views)
                if rel is not None:
                    self.inferred.append("output relation inferred: "
                                         + describe_reconstruction(name, rel, ranks))
                    outputs.append(describe_reconstruction(name, rel, ranks))
                    continue
            bad = [r for r in range(ranks) if (s, d, r) not in self.output_ok]
            if rel is not None and not bad:
                outputs.append(describe_reconstruction(name, rel, ranks))
            else:
                failing.append((idx, name, s, d, rel, bad))
                outputs.append(f"{name}: not proved on ranks {bad}")
        if not failing:
            return True, outputs, []
        dist_anc = self._ancestor_ops(p.dist, [f[3] for f in failing])
        seq_first, seq_later = seq_frontier_failures(self, failing)   # diagnosis_outputs.py
        failures = (self.frontier_failures(failing, dist_anc) + seq_first
                    + output_failures(self, failing) + seq_later)
        # a distributed failure at the diagnosed instruction itself says more than the
        # diagnosis (the normal form may split one instruction into ops the other side
        # writes otherwise: a transpose of a dot whose partial sum is never reduced)
        found = [c for c in self._counterpart(dist_anc)
                 if not any((f.program, f.file, f.line) == (c.program, c.file, c.line)
                            for f in failures)]
        refused = {d.op.id: d.failure(self._consumers, self.dist_prod, self.operand_views) for d in p.diagnoses
                   if d.op.id in self.dist_ops and d.op.id in dist_anc}   # (why a rewrite was refused)
        return False, outputs, list(refused.values()) + found + failures

    def _counterpart(self, anc: set[int]) -> list[Failure]:
        """dlverify/correspondence.py's diagnosis: an op before the first distributed
        op with no view (among those frontier_failures kept: on the way to a failing
        output, on some rank that reaches it) that holds a block of something its
        source line does not compute in the sequential program."""
        frontier = [o for o, ranks in self.dist_frontier.items() if o in anc and ranks]
        before = min(frontier, key=self._order.__getitem__) if frontier else None
        found = counterpart_failure(self.p, self.views, anc, before, self.seq_desc, self.view_text)
        return [found] if found is not None else []

    def _ancestor_ops(self, g: Graph, outs: list[int]) -> set[int]:
        graph = nx.DiGraph()
        prod = g.producer()
        for op in g.ops:
            for i in op.inputs:
                graph.add_edge(i, op.output)
        keep: set[int] = set()
        for t in outs:
            if t in graph:
                keep |= nx.ancestors(graph, t) | {t}
            else:
                keep.add(t)
        return {prod[t].id for t in keep if t in prod}

    def frontier_failures(self, failing: list, dist_anc: set[int]) -> list[Failure]:
        """`dist_anc`: the distributed ops the failing outputs depend on."""
        p = self.p
        out: list[Failure] = []
        dist_ops = [o for o in self.dist_frontier if o in dist_anc]
        # ranks on which the op's result reaches a failing output
        reach = rank_ancestors(p.dist, p.mesh, [(f[3], r) for f in failing for r in f[5]])
        for o in dist_ops:
            out_t = self.dist_ops[o].output
            self.dist_frontier[o] = [r for r in self.dist_frontier[o] if (out_t, r) in reach]
        self._drop_bridged(dist_ops, dist_anc)
        dist_ops = [o for o in dist_ops if self.dist_frontier[o]]
        reduced_later = self._reduced_downstream()
        live = self._live(failing)
        for op_id in sorted(dist_ops, key=self._order.__getitem__):
            op = self.dist_ops[op_id]
            ranks = tuple(sorted(self.dist_frontier[op_id]))
            never = (self._unreduced_partial(op, ranks[0], reduced_later)
                     or self._missing_terms(op, ranks[0], live) or self._split_axis(op, ranks[0]))
            if never is not None:
                out.append(never)
                continue
            scaled = self._scaled_operand_failure(op, ranks)
            if scaled is not None:
                out.append(scaled)
                continue
            kind, reason = self.reason(op, ranks, live)
            msg = (f"no relation to the sequential program derived for the output of "
                   f"{op.kind} on ranks {list(ranks)}")
            views = {r: self.operand_views(op, r) for r in ranks}
            first = views[ranks[0]]
            ins = (" [" + " | ".join(f"operand {i} on rank {ranks[0]}: {d}"
                                     for i, d in enumerate(first)) + "]") if first else ""
            loc = own_loc(op, self._consumers, self.dist_prod)
            out.append(Failure(op.kind, loc.file, loc.line,
                               msg + (f": {reason}" if reason else "") + ins, "distributed",
                               loc.frames, ranks, reason, kind, views))
        return out

    def _scaled_operand_failure(self, op: Op, ranks: tuple[int, ...]) -> Failure | None:
        """A frontier op reading an operand that is c x its sequential value (c != 1):
        reported where the factor enters (dlverify/diagnosis_origin.py)."""
        if (found := scaled_operand(self.by_dist, op, ranks[0])) is None:
            return None
        pos, vs = found
        entry_view = earliest_origin(self.dist_prod, self.by_dist, self.seq_prod, self._order,
                                     op.inputs[pos], ranks[0], vs)
        if entry_view is None:
            return (self._rescaled_sum_failure(op, ranks, pos, vs)
                    or self._unscaled_sum_failure(op, ranks, pos, vs)
                    or self._resummed_failure(op, ranks, pos, vs))
        if entry_view[0].id == op.id:
            return None
        entry, at = entry_view
        msg = (f"{entry.kind} makes {self.view_text(at)} on rank {ranks[0]}, a value "
               f"{scale_value(at.scale)} times the sequential one; the factor is carried to "
               f"{self.op_desc(op)}, which reads operand {pos} as {self.view_text(vs[0])}: a "
               f"factor such as the world size applied twice, or not at all?")
        return self._scale_failure(entry, ranks, msg)

    def _rescaled_sum_failure(self, op: Op, ranks: tuple[int, ...], pos: int,
                              vs: list[ViewFact]) -> Failure | None:
        """The scaled operand of a frontier op is a collective's sum of scaled terms
        divided by the wrong amount after it (diagnosis_origin.rescaled_sums). Of
        several such ops (XLA folds a division into each literal product that follows
        it, and keeps the division's metadata on one), a division the user wrote
        first, then the earliest."""
        found = rescaled_sums(self.dist_prod, self._consumers, self.by_dist,
                              op.inputs[pos], ranks[0])
        if not found:
            return None
        best = min(found, key=lambda f: ("div" not in primitives(f.op.loc.op_name),
                                         self._order[f.op.id]))
        at, coll, summed, made = best.op, best.collective, best.summed, best.made
        msg = (f"{at.kind} turns the result of {self.op_desc(coll)}, {self.view_text(summed)} on "
               f"rank {ranks[0]}, into {self.view_text(made)}, still {scale_value(made.scale)} "
               f"times the sequential value; {self.op_desc(op)} reads operand {pos} as "
               f"{self.view_text(vs[0])}: a division of the collective's sum by the wrong "
               f"factor (applied twice, or the wrong world size)?")
        return self._scale_failure(at, ranks, msg)

    def _unscaled_sum_failure(self, op: Op, ranks: tuple[int, ...], pos: int,
                              vs: list[ViewFact]) -> Failure | None:
        """The scaled operand of a frontier op is a collective's sum of terms that carry
        the factor, which nothing after it divides (diagnosis_origin.unscaled_sum)."""
        found = unscaled_sum(self.dist_prod, self.by_dist, self.seq_prod, op.inputs[pos],
                             ranks[0], vs)
        if found is None:
            return None
        coll, terms, made = found.collective, found.terms, found.made
        msg = (f"{coll.kind} sums partial terms each {scale_value(terms.scale)} times the "
               f"sequential ones into {self.view_text(made)} on rank {ranks[0]}, and nothing "
               f"after it divides the sum; {self.op_desc(op)} reads operand {pos} as "
               f"{self.view_text(vs[0])}: local means summed over the ranks, a division missing?")
        return self._scale_failure(coll, ranks, msg)

    def _resummed_failure(self, op: Op, ranks: tuple[int, ...], pos: int,
                          vs: list[ViewFact]) -> Failure | None:
        """The scaled operand of a frontier op comes from a psum of a value every rank
        already holds whole (diagnosis_origin.resummed_whole)."""
        found = resummed_whole(self.dist_prod, self.by_dist, self._order, op.inputs[pos], ranks[0])
        if found is None:
            return None
        msg = (f"{self.op_desc(found.collective)} sums {self.view_text(found.whole)} on rank "
               f"{ranks[0]}, a value every rank of its group already holds whole, into "
               f"{self.view_text(found.made)}; {self.op_desc(op)} reads operand {pos} as "
               f"{self.view_text(vs[0])}: a value reduced twice (a pmean of gradients JAX's "
               f"replication checks already summed?)")
        return self._scale_failure(found.collective, ranks, msg)

    def _scale_failure(self, at: Op, ranks: tuple[int, ...], msg: str) -> Failure:
        """A scale-mismatch failure reported at `at`, with its operands' views."""
        return Failure(at.kind, at.loc.file, at.loc.line, msg, "distributed", at.loc.frames,
                       ranks, kind="scale-mismatch",
                       operand_views={q: self.operand_views(at, q) for q in ranks})

    def _drop_bridged(self, dist_ops: list[int], dist_anc: set[int]) -> None:
        """Forget the ranks on which a frontier op's result is bridged: every consumer
        on the way to a failing output has a view there. A chain of ops that move no
        element (a reduction over size-1 dims, then a broadcast reinserting them) is
        related end to end while its middle, of another rank than the sequential
        value, has no view of its own; reporting the middle as the first failure
        would point away from where the relation really stops."""
        for o in dist_ops:
            users = [u for u in self._consumers.get(self.dist_ops[o].output, []) if u.id in dist_anc]
            if users:
                self.dist_frontier[o] = [r for r in self.dist_frontier[o]
                                         if not all(self.by_dist.get((u.output, r)) for u in users)]

    def _reduced_downstream(self) -> set[int]:
        """Distributed tensors from which some reducing collective is reachable."""
        has: set[int] = set()
        for op in reversed(self.p.dist.ops):
            for i in op.inputs:
                if op.kind in ("all_reduce", "reduce_scatter") or op.output in has:
                    has.add(i)
        return has

    def _merged_downstream(self) -> set[int]:
        """Distributed tensors merged by elementwise maxima (minima) into a complete value
        (a ring's running max): partial maxima that are reduced, only not yet where a
        frontier op reads them, so no pmax is missing."""
        has: set[int] = set()
        for op in reversed(self.p.dist.ops):
            merged = op.kind in ("max", "min") and any(
                v.partial is None for r in range(self.p.mesh.size)
                for v in self.by_dist.get((op.output, r), []))
            for i in op.inputs:
                if merged or op.output in has:
                    has.add(i)
        return has

    def _unreduced_partial(self, op: Op, rank: int, reduced_later: set[int]) -> Failure | None:
        """A partial operand with no reducing collective anywhere downstream: the bug is
        the missing reduction, at the op that created the partial sum."""
        if op.output in reduced_later or op.kind in ("all_reduce", "reduce_scatter"):
            return None
        if self._merges_partial_extrema(op, rank):   # a max of partial maxima: reason() says why
            return None
        if not hasattr(self, "_merged_later"):
            self._merged_later = self._merged_downstream()
        for t in op.inputs:
            views = self.by_dist.get((t, rank), [])
            # an operand also holding a (scaled) block is reduced (a ring's wrapped-round sum)
            for v in views if all(w.partial is not None for w in views) else ():
                if v.partial is not None:
                    origin = self._origin(t, rank, [v]) or op
                    if origin.output in self._merged_later:
                        continue
                    kind = v.partial.reducer_name
                    reason = "partial result never reduced: add the missing all-reduce" + (
                        "" if kind == "sum" else f" with {kind} (p{kind})")
                    mover = self._split_by_data_movement(origin)
                    if mover is not None:  # the dim became split here: blame the move
                        reason = (f"{origin.kind} reduces a dim that {mover.kind} left split "
                                  f"over the ranks, and nothing completes the partial {kind}")
                        msg = (f"{mover.kind} splits the dim that {self.op_desc(origin)} "
                               f"reduces, so each rank holds only a partial {kind} "
                               f"({self.view_text(v)}) that is never reduced")
                        at = mover
                    else:
                        msg = (f"{origin.kind} produces a partial {kind} on every rank "
                               f"({self.view_text(v)}) and no all-reduce or reduce-scatter "
                               f"follows before {op.kind} at {short_path(op.loc.file)}:"
                               f"{op.loc.line} uses it")
                        at = origin
                    return Failure(at.kind, at.loc.file, at.loc.line, f"{msg}: {reason}",
                                   "distributed", at.loc.frames, (rank,), reason,
                                   "unreduced-partial", {rank: self.operand_views(op, rank)})
        return None

    def _missing_terms(self, op: Op, rank: int, live: set[int]) -> Failure | None:
        """A reducing collective whose operand's partial terms, over all ranks, leave some
        terms of the sum held by no rank, and no value the outputs depend on holds them
        either: those terms were never computed, or computed and dropped (a lost
        micro-batch or shard), so the bug is where the kept partial terms were made.
        (Terms held by a live value are reduced separately: an unsupported pattern,
        not a located bug.)"""
        if op.kind not in ("all_reduce", "reduce_scatter") or not op.inputs:
            return None
        x = op.inputs[0]
        mine = [v for v in self.by_dist.get((x, rank), []) if v.partial is not None]
        # every family the rank's terms belong to misses some terms on all ranks
        gaps_of = [self._gaps(x, v) for v in mine]
        if not mine or not all(gaps_of):
            return None
        holders = {w.dist for v, gaps in zip(mine, gaps_of) for w in self._holders(v, gaps)}
        if holders & live:
            return None
        v, gaps = mine[0], gaps_of[0]
        origin = self._origin(x, rank, [v]) or op
        red = v.partial.reducer_name
        missing = ", ".join(f"[{lo}:{hi})" for lo, hi in gaps)
        fate = ("they are computed but dropped: no value the outputs depend on holds them"
                if holders else "they were never computed")
        reason = (f"no rank holds the terms {missing} of the partial {red} that {op.kind} at "
                  f"{short_path(op.loc.file)}:{op.loc.line} reduces: {fate} (a lost micro-batch "
                  f"or shard?)")
        msg = (f"{origin.kind} produces a partial {red} on rank {rank} ({self.view_text(v)}), "
               f"but {reason}")
        return Failure(origin.kind, origin.loc.file, origin.loc.line, msg, "distributed",
                       origin.loc.frames, (rank,), reason, "missing-terms",
                       {rank: self.operand_views(op, rank)})

    def _interleaved(self, op: Op, live: set[int]) -> bool:
        """Every group of the collective sums pairwise disjoint terms of one family, the
        operand misses terms on all ranks, and values the outputs depend on hold them."""
        x = op.inputs[0]
        first = next((v for r in range(self.p.mesh.size) for v in self.by_dist.get((x, r), [])
                      if v.partial is not None), None)
        if first is None:
            return False
        for group in op.params.get("groups", []):
            ranges = []
            for r in group:
                mine = [v for v in self.by_dist.get((x, r), []) if v.partial is not None
                        and (v.seq, v.partial.op, v.partial.axis)
                        == (first.seq, first.partial.op, first.partial.axis)]
                if not mine:
                    return False
                ranges.append((mine[0].partial.lo, mine[0].partial.hi))
            ranges.sort()
            if any(hi > lo for (_, hi), (lo, _) in zip(ranges, ranges[1:])):
                return False   # overlapping terms: counted twice
        gaps = self._gaps(x, first)
        return bool(gaps) and any(w.dist in live for w in self._holders(first, gaps))

    def _holders(self, v: ViewFact, gaps: list[tuple[int, int]]) -> list[ViewFact]:
        """The views of any distributed value, on any rank, holding terms of v's family
        inside the gaps."""
        return [w for w in self.views
                if w.partial is not None and w.seq == v.seq and w.partial.op == v.partial.op
                and w.partial.axis == v.partial.axis and w.partial.reducer == v.partial.reducer
                and any(w.partial.lo < hi and lo < w.partial.hi for lo, hi in gaps)]

    def _gaps(self, x: int, v: ViewFact) -> list[tuple[int, int]]:
        """The terms of v's family that no rank's view of x (same block and scale) holds."""
        def family(w: ViewFact) -> tuple:
            return (w.seq, w.offsets, w.scale, w.partial.reducer, w.partial.op, w.partial.axis)

        held = sorted({(w.partial.lo, w.partial.hi) for r in range(self.p.mesh.size)
                       for w in self.by_dist.get((x, r), [])
                       if w.partial is not None and family(w) == family(v)})
        gaps, pos = [], 0
        for lo, hi in held:
            if lo > pos:
                gaps.append((pos, lo))
            pos = max(pos, hi)
        full = full_size(self.p.seq, v.partial.op, v.partial.axis)
        if full is not None and pos < full:   # (None: a family this graph cannot size)
            gaps.append((pos, full))
        return gaps

    def _split_axis(self, op: Op, rank: int) -> Failure | None:
        """A scan, sort or softmax along a dim its operand holds only a block of: the
        op needs the whole dim; blame the data movement that split it, if any."""
        if ir.KINDS[op.kind].family not in (ir.Family.SCAN, ir.Family.SORT) or not op.inputs:
            return None
        ax, t = op.params.get("axis", op.params.get("dimension")), op.inputs[0]
        vs = [v for v in self.by_dist.get((t, rank), []) if v.partial is None]
        n = self.p.dist.tensors[t].shape[ax]
        if not vs or all(self.p.seq.tensors[v.seq].shape[ax] == n for v in vs):
            return None
        mover = self._split_by_data_movement(op)
        reason = (f"{op.kind} works along dim {ax} as a whole, but each rank holds only "
                  f"{n} of its positions")
        at = mover or op
        msg = (f"{mover.kind} splits the dim that {self.op_desc(op)} works along" if mover
               else f"{op.kind} works along a dim held in blocks")
        return Failure(at.kind, at.loc.file, at.loc.line, f"{msg}: {reason}", "distributed",
                       at.loc.frames, (rank,), reason, "split-axis", {rank: self.operand_views(op, rank)})

    def _split_by_data_movement(self, reducer: Op) -> Op | None:
        """The collective or slice that produced the operand of `reducer` (through
        same-shape elementwise ops): where the reduced dim became split."""
        if not reducer.inputs:
            return None
        t = reducer.inputs[0]
        shape = self.p.dist.tensors[t].shape
        while t in self.dist_prod:
            op = self.dist_prod[t]
            if op.kind in ("all_to_all", "all_gather", "reduce_scatter", "dynamic_slice", "slice"):
                return op
            same = [i for i in op.inputs if self.p.dist.tensors[i].shape == shape]
            if not same or self.p.dist.tensors[op.output].shape != shape:
                return None
            t = same[0]
        return None

    def operand_views(self, op: Op, rank: int) -> list[str]:
        """What each operand of a distributed op is related to on `rank`."""
        return ["; ".join(self.view_text(v) for v in self.by_dist.get((t, rank), [])[:3])
                or self.padded_text(t, rank)
                or ("a constant array equal to no constant of the sequential program"
                    if self._literal(t) else "no view")
                for t in op.inputs]

    def _literal(self, t: int) -> bool:
        """t is a constant, or a broadcast of one (XLA's form of a splat literal)."""
        op = self.dist_prod.get(t)
        if op is not None and op.kind == "broadcast_in_dim":
            op = self.dist_prod.get(op.inputs[0])
        return op is not None and op.kind == "constant"

    def padded_text(self, t: int, rank: int) -> str:
        """A padded block of t on `rank` (datalog/padded.dl), zero padding first."""
        pads = sorted((v for v in self.padded_views if v.dist == t and v.rank == rank),
                      key=lambda v: v.padding is None)
        if not pads:
            return ""
        v = pads[0]
        shape = self.p.dist.tensors[t].shape
        return (f"block {fmt_offsets(v.offsets, shape)} of {self.seq_desc(v.seq)} padded past its "
                f"end with {'unknown values' if v.padding is None else v.padding}")

    def reason(self, op: Op, ranks: tuple[int, ...], live: set[int]) -> tuple[str, str]:
        """The recognised pattern (a FAILURE_KINDS key) and a plain-language reason."""
        r = ranks[0]
        ins = [self.by_dist.get((t, r), []) for t in op.inputs]
        partial = [bool(vs) and all(v.partial is not None for v in vs) for vs in ins]
        complete = [any(v.partial is None for v in vs) for vs in ins]
        k = op.kind
        if k in ("add", "sub") and any(partial) and any(complete):
            return "partial-plus-complete", ("adds a complete value to a partial sum, so it is "
                                             "counted once per rank: add it after the reduction")
        if k == "add" and len(ins) == 2 and all(partial) and self._overlapping_terms(ins[0], ins[1]):
            return "double-counted-terms", ("adds partial terms of overlapping ranges of one sum, "
                                            "so those terms are counted twice (an accumulation "
                                            "that repeats a micro-batch or a shard?)")
        if self._merges_partial_extrema(op, r):
            return "unproved-extrema-merge", (
                f"merges partial {k}ima with an elementwise {k}, but their ranges neither touch "
                f"nor overlap (a skipped or misaligned range?); only the {k} of adjacent or "
                f"overlapping ranges is proved, and a p{k} over the ranks holding the other "
                f"ranges completes each partial {k}")
        if (k in ir.ELEMENTWISE_NONLINEAR_UNARY or k in ir.ELEMENTWISE_NONLINEAR_BINARY
                or k in ir.ELEMENTWISE_NARY) and any(partial):
            return "nonlinear-on-partial", "nonlinear op applied to a partial sum: reduce first"
        if k in ("mul", "dot_general") and all(partial) and len(partial) == 2:
            return "partial-times-partial", "multiplies two partial sums: reduce one of them first"
        if k in ("all_reduce", "reduce_scatter") and op.inputs and self._interleaved(op, live):
            return "interleaved-terms", (
                f"{k} sums disjoint partial terms that form no range the rules track, and the "
                f"other terms are reduced separately (micro-batches or shards reduced step by "
                f"step in an interleaved order): not supported yet, not necessarily a bug")
        if k in ("all_reduce", "reduce_scatter") and op.inputs:
            text = self.group_reason(op)
            return ("wrong-group" if text else "no-relation"), text
        if k == "all_gather":
            return "not-adjacent", (f"the members' blocks are not adjacent along dim "
                                    f"{op.params['dimension']} in group order")
        if k in ir.ELEMENTWISE_ADDSUB | {"mul", "div"} | ir.ELEMENTWISE_NONLINEAR_BINARY:
            offs = [{v.offsets for v in vs} for vs in ins]
            if all(offs) and not set.intersection(*offs):
                return "operand-mismatch", "operands hold different blocks of the sequential values"
        return "no-relation", ""

    def _merges_partial_extrema(self, op: Op, rank: int) -> bool:
        """op is an elementwise max (min) of two partial maxima (minima): the merge of an
        online max, not a misuse (max(m, -inf) of one partial max is not a merge)."""
        if op.kind not in ("max", "min") or len(op.inputs) != 2:
            return False
        ins = [self.by_dist.get((t, rank), []) for t in op.inputs]
        return all(vs and all(v.partial is not None and v.partial.reducer_name == op.kind
                              for v in vs) for vs in ins)

    @staticmethod
    def _overlapping_terms(a: list[ViewFact], b: list[ViewFact]) -> bool:
        """Some view of a and some view of b are terms of one family with overlapping ranges."""
        return any(v.seq == w.seq and v.partial.op == w.partial.op and v.partial.axis == w.partial.axis
                   and v.partial.lo < w.partial.hi and w.partial.lo < v.partial.hi
                   for v in a for w in b)

    def group_reason(self, op: Op) -> str:
        x = op.inputs[0]
        groups = op.params.get("groups", [])
        held = {}
        for r in range(self.p.mesh.size):
            tags = [v.partial for v in self.by_dist.get((x, r), []) if v.partial is not None]
            if tags:
                held[r] = tags[0]
        if not held:
            vs = [v for r in range(self.p.mesh.size) for v in self.by_dist.get((x, r), [])]
            if vs and all(v.partial is None for v in vs):
                return "the operand is already complete on every rank"
            return ""
        full = max(t.hi for t in held.values())
        bad = []
        for g in groups:
            rng = sorted((held[r].lo, held[r].hi) for r in g if r in held)
            pos, ok = 0, True
            for lo, hi in rng:
                ok &= lo == pos
                pos = hi
            if not ok or len(rng) != len(g):
                bad.append(g)
        holdings = ", ".join(f"rank {r} [{t.lo}:{t.hi})" for r, t in sorted(held.items()))
        what = "the reduced dim"
        if any(is_group_axis(t.axis) for t in held.values()):
            what = "the groups of the earlier collective"
        return (f"{op.kind} over groups {groups}, but the members of {bad or groups} do not hold "
                f"ranges that tile {what} (0:{full}); partial terms held: {holdings}")

    def _live(self, failing: list) -> set[int]:
        """The distributed values the failing outputs depend on."""
        anc = self._ancestor_ops(self.p.dist, [f[3] for f in failing])
        return {self.dist_ops[o].output for o in anc if o in self.dist_ops} | set(self.p.dist.inputs)
