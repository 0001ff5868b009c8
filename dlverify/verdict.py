"""The result model: what a verification run returns, and nothing that computes it.

`Result` is the verdict of one program pair (the reconstruction of each output,
or the located failures, and the assumptions it rests on); `CaseOutcome` is a
verdict set against what a case's author expected. The derived views are kept
as `ViewFact`s for --explain, --graph, --witness and the numeric checks.
Renderers (dlverify/reports/) depend on this module only; the diagnosis that
builds a Result from the engine's relations is dlverify/diagnosis.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Iterable, Literal

from dlverify import schema as S
from dlverify.case import Expect
from dlverify.ir import Frame
from dlverify.problem import Problem

if TYPE_CHECKING:  # a record of the segment runner's, only referred to here
    from dlverify.structure import SegmentPlan

UNIT_SCALE = S.UNIT_SCALE


@dataclass(frozen=True)
class Partial:
    """A partial term: range [lo, hi) of reduced axis `axis` of sequential op `op`."""

    reducer: int  # a code of schema.REDUCERS
    op: int
    axis: int
    lo: int
    hi: int

    @property
    def reducer_name(self) -> str:
        return S.reducer_name(self.reducer)


@dataclass(frozen=True)
class ViewFact:
    """A derived `View` row: on rank `rank`, distributed tensor `dist` equals
    scale x (the partial term of) the block of sequential tensor `seq` at `offsets`."""

    seq: int
    dist: int
    rank: int
    offsets: tuple[int, ...]
    partial: Partial | None
    scale: tuple[int, int, int, int]

    @property
    def complete(self) -> bool:
        return self.partial is None and self.scale == UNIT_SCALE


@dataclass(frozen=True)
class PaddedViewFact:
    """A derived `Pad_View` row: on rank `rank`, element i of distributed tensor
    `dist` is element offsets + i of sequential tensor `seq` where that lies
    inside it; elsewhere (the padding) `padding` (0, -inf or +inf), or unknown
    when it is None."""

    seq: int
    dist: int
    rank: int
    offsets: tuple[int, ...]
    padding: float | None


@dataclass
class Failure:
    """Where derivation failed: an op of either program, or an output."""

    op: str
    file: str
    line: int
    message: str
    program: str = "distributed"
    frames: tuple[Frame, ...] = ()
    ranks: tuple[int, ...] = ()
    reason: str = ""
    # A stable id of the recognised pattern (one of FAILURE_KINDS), for tools.
    kind: str = "no-relation"
    # Per failing rank, what each operand of the op was related to.
    operand_views: dict[int, list[str]] = field(default_factory=dict)


FAILURE_KINDS = {
    "no-relation": "no relation to the sequential program could be derived",
    "unreduced-partial": "a partial sum (or max/min) is never completed by a collective",
    "partial-plus-complete": "a complete value is added to a partial sum on every rank",
    "nonlinear-on-partial": "a nonlinear op is applied to a partial sum",
    "partial-times-partial": "two partial sums are multiplied",
    "wrong-group": "a collective reduces over ranks whose terms do not tile the reduction",
    "not-adjacent": "an all-gather concatenates blocks that are not adjacent in group order",
    "operand-mismatch": "the operands hold different blocks of the sequential values",
    "scale-mismatch": "a value is a constant multiple of the sequential one (reported where the factor enters)",
    "wrong-block": "an output holds another block than its output relation requires",
    "sequential-frontier": "a sequential op whose output no distributed value matches",
    "double-counted-terms": "partial terms of overlapping ranges of one sum are added",
    "unproved-extrema-merge": "partial maxima (minima) of ranges that neither touch nor overlap merged by an elementwise max (min)",
    "missing-terms": "a reduction's partial terms leave some terms held by no rank (never computed)",
    "interleaved-terms": "a collective sums interleaved partial terms: not supported yet, not a located bug",
    "split-axis": "a scan, sort or softmax works along a dim each rank holds only a block of",
    "differs-from-counterpart": "diagnosis: an op holds a block of a value that the sequential op "
                                "written at the same source does not compute",
    "index-cut-on-kept-rows": "diagnosis: a bound on a masked gather's index changes it on rows the "
                              "mask keeps (they read another element than their own)",
}


@dataclass(frozen=True)
class PatternMatch:
    """A bug pattern (dlverify/patterns/) matched by a path of distributed ops from
    `start_*` to `end_*`: an explanation of a failure, never part of the verdict."""

    pattern: str
    explanation: str
    advice: str
    start_op: str
    start_file: str
    start_line: int
    end_op: str
    end_file: str
    end_line: int
    source: str = ""   # the pattern file


@dataclass
class Result:
    """The verdict on one program pair."""

    name: str
    verified: bool
    outputs: list[str]
    failures: list[Failure]
    assumptions: list[str]
    notes: list[str] = field(default_factory=list)
    # values the programs read that the input does not state (Problem.unknowns)
    unknowns: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    fact_count: int = 0
    derived_count: int = 0
    engine: str = ""
    # Every derived view (for --explain and the numeric soundness checks);
    # left out of the JSON report.
    views: list[ViewFact] = field(default_factory=list, repr=False)
    # Every derived padded view (datalog/padded.dl), for the numeric soundness checks.
    padded_views: list[PaddedViewFact] = field(default_factory=list, repr=False)
    # The two programs, for --explain, --graph and --witness; left out of the JSON report.
    problem: Problem | None = field(default=None, repr=False)
    # How a deep pair was cut into segments and why each pair of windows was made
    # (`SegmentPlan.lines()`, for -v); None when evaluated as one fixpoint.
    segment_plan: SegmentPlan | None = field(default=None, repr=False)
    # Bug patterns matched on a failing result (explanations, README "Bug-pattern queries").
    patterns: list[PatternMatch] = field(default_factory=list)


Status = Literal["ok", "expected", "mismatch", "error"]


@dataclass
class CaseOutcome:
    """One case's verdict against what its author expected."""

    name: str
    file: str
    expect: Expect
    result: Result | None
    error: str = ""
    seconds: float = 0.0
    witness: str = ""  # the numeric witness summary, when asked for

    @property
    def verdict(self) -> str:
        if self.result is None:
            return "error"
        return "verified" if self.result.verified else "bug"

    @property
    def matches(self) -> bool:
        return self.result is not None and self.verdict == self.expect

    @property
    def status(self) -> Status:
        """"ok" (verified as expected), "expected" (the bug the case expects was
        found: a success, not a failed verification), "mismatch" or "error"."""
        if self.result is None:
            return "error"
        if not self.matches:
            return "mismatch"
        return "expected" if self.expect == "bug" else "ok"


# ---------------------------------------------------------------- reading engine rows

def _offlist(v: object) -> tuple[int, ...]:
    out = []
    while v is not None:
        h, v = v  # type: ignore[misc]
        out.append(int(h))
    return tuple(out)


def parse_views(rows: Iterable[tuple]) -> list[ViewFact]:
    """`View` rows (columns read by their schema names) as ViewFacts."""
    col = S.VIEW.column_index
    s_, d_, r_, o_, p_, c_ = (col(n) for n in ("s", "d", "r", "o", "p", "c"))
    # A deep program's views share few offset, partial-term and scale records (the
    # 405B forward's 102,824 views: 167, 2,049 and 7): each is converted once, and
    # the converted values are shared.
    offsets: dict = {}
    partials: dict = {None: None}
    scales: dict = {}
    views = []
    for row in rows:
        o, p, c = row[o_], row[p_], row[c_]
        if o not in offsets:  # (None, the empty list, too)
            offsets[o] = _offlist(o)
        if p not in partials:
            partials[p] = Partial(*p)
        scale = scales.get(c)
        if scale is None:
            scale = scales[c] = tuple(c)
        views.append(ViewFact(row[s_], row[d_], row[r_], offsets[o], partials[p], scale))
    return views


def parse_padded_views(rows: Iterable[tuple]) -> list[PaddedViewFact]:
    """`Pad_View` rows as PaddedViewFacts."""
    col = S.PAD_VIEW.column_index
    s_, d_, r_, o_, z_ = (col(n) for n in ("s", "d", "r", "o", "z"))
    return [PaddedViewFact(row[s_], row[d_], row[r_], _offlist(row[o_]), PADDING_VALUE.get(row[z_]))
            for row in rows]


# Pad_View's z: 0 unknown, else 1 + the code of the reducer whose identity pads.
PADDING_VALUE = {1 + S.REDUCER_CODE[name]: v for name, v in S.REDUCER_IDENTITY.items()}


# ---------------------------------------------------------------- shared formatting

def scale_value(c: tuple[int, ...]) -> Fraction:
    """The exact rational a Scale record stands for."""
    v = Fraction(1)
    for p, e in zip(S.SCALE_PRIMES, c):
        v *= Fraction(p) ** e
    return v


def fmt_offsets(offs: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """A block as slices, `:` for a wildcard offset."""
    parts = []
    for o, n in zip(offs, shape):
        parts.append(":" if o < 0 else f"{o}:{o + n}")
    return "[" + ", ".join(parts) + "]"


def short_path(path: str) -> str:
    return path.rsplit("/", 1)[-1]
