"""Relations found by trying candidates under the engine (issue 12, item 3).

When neither the spec nor a sharding annotation says how a parameter is
related, the shapes may allow several relations (frontends/hlo/pairing.py,
`_shape_candidates`): an even split or segments of it, or, for a parameter the
distributed module declares reshaped, the block of any dim the rank count
divides. The pairing takes the likeliest of each; when the pair does not
verify under them, the other candidates are tried one parameter at a time
(coordinate search, at most `MAX_TRIALS` verifications), each parameter keeping
the candidate under which the most distributed tensors relate, until one
choice verifies.

Sound by construction: every candidate is a relation of the inputs, listed in
the verdict's assumptions with the others it was chosen over, and the rules
are the same under each. A candidate is a *layout* (which block a rank holds),
never a claim about values (zero padding, rank-0-only, a rank id): those are
the spec's to state, since a guess of them could excuse a real bug. When no
choice verifies, the result reported is the one under which the most
distributed values relate (the likeliest candidates on a tie), so the failure
is located past what some layout explains, with a note of what was tried.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from dlverify.frontends.hlo.pairing import PairingRecord
from dlverify.problem import Problem
from dlverify.verdict import Result

# Verifications per pair at most, the first (likeliest candidates) included.
MAX_TRIALS = 8

Build = Callable[[dict[int, int], PairingRecord], Problem]
Verify = Callable[[Problem, float], Result]   # the problem and the seconds its build took


@dataclass(frozen=True)
class TrialOutcome:
    """The problem and result reported, the choice of candidate per parameter
    (sequential number -> index; absent: the first) and what pairing recorded."""

    problem: Problem
    result: Result
    choice: dict[int, int]
    record: PairingRecord
    trials: int


def _related(res: Result) -> tuple[int, int]:
    """How many distributed tensors have a view on some rank, then how far into the
    distributed file the first failure is (HLO text lists instructions in order)."""
    first = next((f.line for f in res.failures if f.program == "distributed"), 0)
    return len({v.dist for v in res.views}), first


def _attempt(build: Build, verify: Verify, choice: dict[int, int], trials: int) -> TrialOutcome:
    """Build the pair under `choice` and verify it (the `trials`-th verification)."""
    record = PairingRecord()
    t0 = time.perf_counter()
    problem = build(choice, record)
    return TrialOutcome(problem, verify(problem, time.perf_counter() - t0), choice, record, trials)


def verify_by_trial(build: Build, verify: Verify, max_trials: int = MAX_TRIALS) -> TrialOutcome:
    """Verify `build(choice, record)` under the likeliest candidates, then under
    others (see the module docstring)."""
    best = _attempt(build, verify, {}, 1)
    candidates = best.record.candidates
    if best.result.verified or not candidates:
        return best
    best_score, trials = _related(best.result), 1
    for number, labels in sorted(candidates.items()):
        for i in range(1, len(labels)):
            if trials >= max_trials:
                break
            trials += 1
            out = _attempt(build, verify, {**best.choice, number: i}, trials)
            if out.result.verified:
                return out
            if _related(out.result) > best_score:
                best, best_score = out, _related(out.result)
    best.result.notes.append(
        f"not verified under any of the candidate relations tried ({trials} verifications): "
        + "; ".join(f"parameter {k}: {' or '.join(v)}" for k, v in sorted(candidates.items()))
        + "; shown: the choice under which the most distributed values relate (see the "
          "assumptions)")
    return replace(best, trials=trials)


__all__ = ["MAX_TRIALS", "TrialOutcome", "verify_by_trial"]
