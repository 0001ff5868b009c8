"""Text for people: one status line per case (or HLO pair), then its reconstructions or failures."""
from __future__ import annotations

from dlverify.ir import Frame
from dlverify.verdict import CaseOutcome, Failure, PatternMatch, Result, short_path

SHOWN_PATTERNS = 3  # matches printed without --verbose


def failure_line(f: Failure) -> str:
    where = f"{short_path(f.file)}:{f.line}" if f.file else "(no source line)"
    inner = f.frames[0] if f.frames else None
    if inner is not None and (inner.file, inner.line) != (f.file, f.line):
        # reported at a caller (frontends/jaxpr/frames.py): name the helper it went through
        where += f" (through {inner.function or 'a helper'} at {short_path(inner.file)}:{inner.line})"
    return f"{f.op} at {where}: {f.message}"


def _at(op: str, file: str, line: int) -> str:
    return f"{op} at {short_path(file)}:{line}" if file else op


def pattern_line(m: PatternMatch) -> str:
    path = (_at(m.end_op, m.end_file, m.end_line) if (m.start_op, m.start_file, m.start_line)
            == (m.end_op, m.end_file, m.end_line) else
            f"{_at(m.start_op, m.start_file, m.start_line)} -> {_at(m.end_op, m.end_file, m.end_line)}")
    return f"pattern {m.pattern}: {m.explanation} ({path})"


def pattern_lines(res: Result, verbose: bool = False) -> list[str]:
    """The bug patterns matched (README "Bug-pattern queries"), with their advice under -v."""
    shown = res.patterns if verbose else res.patterns[:SHOWN_PATTERNS]
    lines = []
    for m in shown:
        lines.append(f"  {pattern_line(m)}")
        if verbose and m.advice:
            lines.append(f"      advice: {m.advice}")
    if len(res.patterns) > len(shown):
        lines.append(f"  ... and {len(res.patterns) - len(shown)} more pattern matches (--verbose)")
    return lines


def result_text(res: Result, verbose: bool = False) -> list[str]:
    lines = []
    if res.verified:
        lines += [f"  {o}" for o in res.outputs]
    else:
        shown = res.failures if verbose else res.failures[:3]
        lines += [f"  {failure_line(f)}" for f in shown]
        if len(res.failures) > len(shown):
            lines.append(f"  ... and {len(res.failures) - len(shown)} more (--verbose)")
        if verbose and res.failures and res.failures[0].frames:
            lines.append("  called from: " + " <- ".join(
                f"{fr.function} ({short_path(fr.file)}:{fr.line})" for fr in res.failures[0].frames))
        lines += pattern_lines(res, verbose)
        lines += unknown_lines(res)
    if verbose:
        lines += [f"  assumption: {a}" for a in res.assumptions]
        lines += [f"  note: {n}" for n in res.notes]
        lines += plan_lines(res)
        lines.append(_timing_line(res))
    return lines


def unknown_lines(res: Result) -> list[str]:
    """The values neither file states (elided constants): printed with every failing
    verdict, since a failure downstream of one is no evidence of a bug."""
    return [f"  unknown: {u}" for u in res.unknowns]


def plan_lines(res: Result) -> list[str]:
    """How a segmented run cut and paired the programs (none for one fixpoint)."""
    if res.segment_plan is None:
        return []
    return [f"  plan: {line}" for line in res.segment_plan.lines()]


def _timing_line(res: Result) -> str:
    return ("  time: " + ", ".join(f"{k} {v:.2f}s" for k, v in res.timings.items())
            + f"; {res.fact_count} facts, {res.derived_count} derived, engine {res.engine}")


def outcome_status(o: CaseOutcome) -> tuple[str, str]:
    """The status word and the verdict phrase of a case's line: a bug the case
    expects is reported as expected ("bug found as expected"), not as a failed
    verification."""
    if o.result is None:
        return "ERROR", "error"
    got = "verified" if o.result.verified else "not verified"
    if o.status == "expected":
        return "expected", "bug found as expected"
    if o.status == "mismatch":
        return "MISMATCH", f"{got} (expected {o.expect})"
    return "ok", got


def outcome_text(o: CaseOutcome, verbose: bool = False) -> list[str]:
    if o.result is None:
        return [f"ERROR     {o.name}: {o.error}"]
    status, verdict = outcome_status(o)
    head = f"{status:<9} {o.name}  {verdict}  {o.seconds:.2f}s"
    return [head] + result_text(o.result, verbose)


# ---------------------------------------------------------------- HLO pairs (`check`, `check-dump`)

def source_chain(frames: tuple[Frame, ...]) -> str:
    """`instruction (file:line); source: innermost <- ... <- outermost` for a
    failure located in an HLO module (frames[0] is the HLO instruction)."""
    if not frames:
        return ""
    head, rest = frames[0], frames[1:]
    text = f"instruction %{head.function} ({short_path(head.file)}:{head.line})" if head.function \
        else f"{short_path(head.file)}:{head.line}"
    if rest:
        text += "; source: " + " <- ".join(
            f"{short_path(f.file)}:{f.line}" + (f" ({f.function})" if f.function else "")
            for f in rest)
    return text


def pair_text(name: str, res: Result, seconds: float, verbose: bool = False) -> list[str]:
    """The verdict of one HLO pair: the reconstructions, or each failure followed by
    its instruction and source chain (for the Neuron files, the Python stack of the
    metadata); then the assumptions the verdict rests on, always."""
    lines = [f"{'verified' if res.verified else 'NOT verified':<13} {name}  {seconds:.2f}s"]
    if res.verified:
        lines += result_text(res, verbose=False)
    else:
        shown = res.failures if verbose else res.failures[:3]
        for f in shown:
            lines.append(f"  {failure_line(f)}")
            chain = source_chain(f.frames)
            if chain:
                lines.append(f"      at {chain}")
        if len(res.failures) > len(shown):
            lines.append(f"  ... and {len(res.failures) - len(shown)} more (--verbose)")
        lines += pattern_lines(res, verbose)
        lines += unknown_lines(res)
    lines += [f"  assumption: {a}" for a in res.assumptions]
    if verbose:
        lines += [f"  note: {n}" for n in res.notes]
        lines += plan_lines(res)
        lines.append(_timing_line(res))
    return lines
