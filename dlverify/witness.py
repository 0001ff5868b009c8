"""`--witness`: run both programs on random inputs and show how far apart they are,
at the outputs and at the located op. A bug report whose witness shows no
difference says "not confirmed numerically" instead of hiding it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlverify.interpret import NotExecutable
from dlverify.numeric import _block, run_both, value_error
from dlverify.problem import Problem
from dlverify.verdict import Result

MAX_BYTES = 2 << 30  # values of both programs, as float64
RTOL = 1e-6


@dataclass
class OutputDiff:
    output: str
    rank: int
    max_abs_diff: float
    max_abs_value: float


@dataclass
class Witness:
    """`confirmed`: some output differs beyond rounding on the random inputs."""

    ran: bool
    confirmed: bool
    outputs: list[OutputDiff] = field(default_factory=list)
    located: str = ""
    note: str = ""
    seed: int = 0

    def summary(self) -> str:
        if not self.ran:
            return f"witness: not run: {self.note}"
        worst = max(self.outputs, key=lambda o: o.max_abs_diff, default=None)
        head = ("witness: confirmed numerically" if self.confirmed
                else "witness: not confirmed numerically (no output differs on these inputs)")
        if worst is not None:
            head += (f"; largest output difference {worst.max_abs_diff:.3g} at {worst.output} "
                     f"on rank {worst.rank} (values up to {worst.max_abs_value:.3g}, seed {self.seed})")
        return head + (f"; {self.located}" if self.located else "") + \
            (f"; {self.note}" if self.note else "")


def value_bytes(problem: Problem) -> int:
    n = sum(int(np.prod(t.shape)) for t in problem.seq.tensors.values())
    n += problem.mesh.size * sum(int(np.prod(t.shape)) for t in problem.dist.tensors.values())
    return 8 * n


def witness(result: Result, seed: int = 0, max_bytes: int = MAX_BYTES) -> Witness:
    p = result.problem
    if p is None:
        return Witness(False, False, note="the result carries no program")
    need = value_bytes(p)
    if need > max_bytes:
        return Witness(False, False, note=f"the programs hold {need / 2**30:.1f} GiB of values at "
                                          f"these shapes, over the {max_bytes / 2**30:.1f} GiB limit; "
                                          "verify a smaller configuration to get a witness")
    try:
        run = run_both(p, seed)
    except NotExecutable as e:
        return Witness(False, False, note=f"the programs cannot be executed here: {e}")
    diffs = []
    names = p.seq.output_names or [f"out{i}" for i in range(len(p.seq.outputs))]
    unknown = []
    for i, (s, d, rel) in enumerate(zip(p.seq.outputs, p.dist.outputs, p.outputs)):
        if rel is None:  # nothing says which block each rank should hold
            unknown.append(names[i])
            continue
        seq_val = np.asarray(run.seq[s][0], dtype=np.float64)
        for r in range(p.mesh.size):
            got = np.asarray(run.dist[d][r], dtype=np.float64)
            want = _block(seq_val, rel.offsets[r], got.shape)
            diff = value_error(got, want)
            diffs.append(OutputDiff(names[i], r, diff, float(np.max(np.abs(want))) if want.size else 0.0))
    confirmed = any(o.max_abs_diff > RTOL * max(1.0, o.max_abs_value) for o in diffs)
    note = (f"no expected relation for {', '.join(unknown)} (give [outputs] in the spec) "
            "so those outputs were not compared") if unknown else ""
    return Witness(True, confirmed, diffs, _located(result, run), note, seed=seed)


def _located(result: Result, run) -> str:
    """The difference at the first located distributed op, against the sequential op
    of the same kind that consumes what its operands are related to."""
    p = result.problem
    assert p is not None
    f = next((f for f in result.failures if f.program == "distributed"), None)
    if f is None:
        return ""
    op = next((o for o in p.dist.ops if o.kind == f.op and o.loc.line == f.line
               and o.loc.file == f.file), None)
    if op is None or not f.ranks:
        return ""
    r = f.ranks[0]
    views = {}
    for v in result.views:
        if v.rank == r and v.dist in op.inputs and v.complete:
            views.setdefault(v.dist, v)
    first = views.get(op.inputs[0]) if op.inputs else None
    if first is None:
        return ""
    for sop in p.seq.ops:
        if sop.kind == op.kind and first.seq in sop.inputs and \
                p.seq.tensors[sop.output].rank == p.dist.tensors[op.output].rank:
            got = np.asarray(run.dist[op.output][r], dtype=np.float64)
            seq_val = np.asarray(run.seq[sop.output][0], dtype=np.float64)
            offs = tuple(max(o, 0) for o in first.offsets) if len(first.offsets) == got.ndim \
                else (0,) * got.ndim
            want = _block(seq_val, offs, got.shape)
            if want.shape != got.shape:
                return ""
            diff = value_error(got, want)
            return (f"at the located {op.kind} (line {op.loc.line}) on rank {r}: largest "
                    f"difference {diff:.3g} from the sequential {sop.kind} (line {sop.loc.line})")
    return ""
