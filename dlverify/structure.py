"""The repeated structure of a program: where its layers start and how long they are.

Deep programs are stacks of identical blocks (transformer layers, unrolled
chains). Cutting both programs at the block boundaries gives segments that are
identical up to renaming of ids, so one engine run serves all of them
(dlverify/memo.py), and windows never drift out of step with the layers.

A block is found by canonical hashing of the op sequence: each op gets a
signature that ignores ids (kind, shapes, dtype, operand count), and a period P
is accepted when the signatures repeat with period P over a run of at least
`MIN_REPEATS` blocks. Candidate periods come from the gaps between occurrences
of rarely repeated signatures (one dot per layer gives the layer length). The
cut inside a block is placed where the fewest computed tensors cross it (the
residual stream between layers), so a segment carries few boundary views.

This is only a schedule: the rules are sound on any window, so a wrong guess
costs time (an extra window), never a wrong verdict.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from dlverify.ir import Graph, Op

MIN_REPEATS = 3
MIN_COVERED = 24  # ops: shorter repetitions (three equal broadcasts) are not structure
CANDIDATE_SIGNATURES = 24  # rarest repeated signatures whose gaps propose periods


@dataclass(frozen=True)
class Repetition:
    """Ops [start, start + period * count) of a program are `count` consecutive
    blocks of `period` ops with equal signatures; `start` is a low-traffic cut."""

    start: int
    period: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.period * self.count

    def describe(self) -> str:
        return f"{self.count} blocks of {self.period} ops from op {self.start}"


@dataclass
class Segment:
    """One engine run (or memo hit): op positions [lo, hi) of each program."""

    index: int
    seq: tuple[int, int]
    dist: tuple[int, int]
    seeds: int
    new_views: int
    seconds: float
    source: str  # "engine", "memo" (this run) or "cache" (on disk)
    reason: str  # why these windows were paired

    def line(self) -> str:
        return (f"segment {self.index}: distributed ops [{self.dist[0]}, {self.dist[1]}) with "
                f"sequential ops [{self.seq[0]}, {self.seq[1]}), {self.seeds} seeds -> "
                f"{self.new_views} new views, {self.source} {self.seconds:.3f} s; {self.reason}")


@dataclass
class SegmentPlan:
    """How the programs were cut and paired (printed by `-v`)."""

    seq_blocks: list[Repetition]
    dist_blocks: list[Repetition]
    segments: list[Segment] = field(default_factory=list)
    memo_hits: int = 0
    cache_hits: int = 0
    engine_runs: int = 0
    inductions: list[str] = field(default_factory=list)  # scans concluded by induction
    body_segments: list[str] = field(default_factory=list)  # the segments of their bodies

    def lines(self) -> list[str]:
        def blocks(name: str, reps: list[Repetition]) -> str:
            found = "; ".join(r.describe() for r in reps)
            return f"{name}: " + (found or "no repeated blocks found")

        summary = (f"{len(self.segments)} segments: {self.engine_runs} engine runs, "
                   f"{self.memo_hits} memo hits ({self.cache_hits} from the on-disk cache)")
        out = [blocks("sequential", self.seq_blocks), blocks("distributed", self.dist_blocks),
               summary]
        return out + self.inductions + self.body_segments + [s.line() for s in self.segments]


def op_signature(g: Graph, op: Op) -> tuple:
    """What an op computes, without ids: equal for the same op of two layers."""
    out = g.tensors[op.output]
    ins = tuple(g.tensors[t].shape for t in op.inputs)
    return (op.kind, out.shape, out.dtype, ins)


def signature_ids(g: Graph) -> list[int]:
    """Each op's signature as a small integer, numbered in order of first appearance
    (deterministic, unlike hash() of strings)."""
    numbers: dict[tuple, int] = {}
    return [numbers.setdefault(op_signature(g, op), len(numbers)) for op in g.ops]


def _candidate_periods(sigs: list[int]) -> list[int]:
    where: dict[int, list[int]] = defaultdict(list)
    for i, h in enumerate(sigs):
        where[h].append(i)
    repeated = sorted((len(v), h) for h, v in where.items() if len(v) >= MIN_REPEATS)
    periods = set()
    for _, h in repeated[:CANDIDATE_SIGNATURES]:
        pos = where[h]
        gaps = Counter(b - a for a, b in zip(pos, pos[1:]))
        periods.add(gaps.most_common(1)[0][0])
    return sorted(periods)


def _longest_run(sigs: list[int], period: int) -> tuple[int, int]:
    """The longest [a, b) with sigs[i] == sigs[i + period] for every i in it."""
    best = (0, 0)
    a = 0
    n = len(sigs) - period
    for i in range(n + 1):
        if i == n or sigs[i] != sigs[i + period]:
            if i - a > best[1] - best[0]:
                best = (a, i)
            a = i + 1
    return best


def _crossing_counts(g: Graph) -> list[int]:
    """crossing[i]: computed tensors produced before position i and read at or after it
    (program inputs and constants are left out: they are not carried between windows)."""
    pos = {op.output: i for i, op in enumerate(g.ops)}
    last: dict[int, int] = {}
    for i, op in enumerate(g.ops):
        for t in op.inputs:
            last[t] = i
    nullary = {op.output for op in g.ops if not op.inputs}
    diff = [0] * (len(g.ops) + 2)
    for t, lu in last.items():
        p = pos.get(t)
        if p is None or t in nullary or lu <= p:
            continue
        diff[p + 1] += 1
        diff[lu + 1] -= 1
    out, run = [], 0
    for i in range(len(g.ops) + 1):
        run += diff[i]
        out.append(run)
    return out


def _best_in(sigs: list[int], lo: int, hi: int, crossing: list[int]) -> Repetition | None:
    """The longest stretch of identical consecutive blocks within ops [lo, hi), cut at
    its quietest point."""
    sub = sigs[lo:hi]
    best: tuple[int, int, int] | None = None  # (covered ops, -period, a)
    for period in _candidate_periods(sub):
        if period <= 0 or period * MIN_REPEATS > len(sub):
            continue
        a, b = _longest_run(sub, period)
        covered = b - a + period
        if covered // period < MIN_REPEATS:
            continue
        key = (covered, -period, a)
        if best is None or key > best:
            best = key
    if best is None:
        return None
    covered, neg_period, a = best
    period = -neg_period
    # The cut: the position in the first block crossed by the fewest tensors.
    cut = min(range(lo + a, lo + a + period), key=lambda i: (crossing[i], i))
    count = (lo + a + covered - cut) // period
    if count < MIN_REPEATS - 1 or count * period < MIN_COVERED:
        return None
    return Repetition(cut, period, count)


def find_repetitions(g: Graph) -> list[Repetition]:
    """Every stretch of repeated blocks, in program order: the longest one, then the
    longest ones before and after it (a training step: the forward layers, then
    the backward layers)."""
    if len(g.ops) < 2 * MIN_REPEATS:
        return []
    sigs = signature_ids(g)
    crossing = _crossing_counts(g)
    out: list[Repetition] = []
    todo = [(0, len(sigs))]
    while todo:
        lo, hi = todo.pop()
        if hi - lo < 2 * MIN_REPEATS:
            continue
        rep = _best_in(sigs, lo, hi, crossing)
        if rep is None:
            continue
        out.append(rep)
        todo += [(lo, rep.start), (rep.stop, hi)]
    return sorted(out, key=lambda r: r.start)


def find_repetition(g: Graph) -> Repetition | None:
    """The stretch of repeated blocks covering the most ops."""
    return max(find_repetitions(g), key=lambda r: (r.period * r.count, -r.start), default=None)


def containing(reps: list[Repetition], p: int) -> int | None:
    """Index of the repetition whose blocks contain position p."""
    for k, rep in enumerate(reps):
        if rep.start <= p < rep.stop:
            return k
    return None


@dataclass(frozen=True)
class WindowEnd:
    """Where a distributed window of a segmented run ends (dlverify/segments.py)."""

    stop: int  # the distributed window is [start, stop)
    reason: str  # why it ends there


def block_end(reps: list[Repetition], p: int, window: int, n: int) -> WindowEnd:
    """End of the distributed window starting at p, and why it ends there."""
    k = containing(reps, p)
    if k is not None:
        rep = reps[k]
        m = max(1, round(window / rep.period))
        blocks = min(rep.count, (p + m * rep.period - rep.start) // rep.period)
        end = rep.start + blocks * rep.period
        if end <= p:
            end = min(rep.stop, rep.start + ((p - rep.start) // rep.period + 1) * rep.period)
        first = (p - rep.start) // rep.period
        return WindowEnd(end, f"blocks {first}..{(end - rep.start - 1) // rep.period} of "
                               f"{rep.count} (repetition {k})")
    nxt = [r.start for r in reps if p < r.start <= p + window]
    if nxt:
        return WindowEnd(min(nxt), "ops before repeated blocks")
    return WindowEnd(min(n, p + window), f"{window}-op window")


