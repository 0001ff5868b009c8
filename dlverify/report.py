"""Renderers of verdicts: text for people, versioned JSON for machines."""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Iterable

from dlverify.cases import CaseOutcome
from dlverify.verdict import Failure, Result

JSON_SCHEMA_VERSION = 1


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def failure_line(f: Failure) -> str:
    where = f"{_short(f.file)}:{f.line}" if f.file else "(no source line)"
    return f"{f.op} at {where}: {f.message}"


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
                f"{fr.function} ({_short(fr.file)}:{fr.line})" for fr in res.failures[0].frames))
    if verbose:
        lines += [f"  assumption: {a}" for a in res.assumptions]
        lines += [f"  note: {n}" for n in res.notes]
        lines.append("  time: " + ", ".join(f"{k} {v:.2f}s" for k, v in res.timings.items())
                     + f"; {res.fact_count} facts, {res.derived_count} derived, engine {res.engine}")
    return lines


def outcome_text(o: CaseOutcome, verbose: bool = False) -> list[str]:
    if o.result is None:
        return [f"ERROR     {o.name}: {o.error}"]
    status = "ok" if o.matches else "MISMATCH"
    got = "verified" if o.result.verified else "not verified"
    note = "" if o.matches else f" (expected {o.expect})"
    head = f"{status:<9} {o.name}  {got}{note}  {o.seconds:.2f}s"
    return [head] + result_text(o.result, verbose)


def result_dict(res: Result) -> dict[str, Any]:
    problem, views = res.problem, res.views
    res.problem, res.views = None, []
    try:
        d = asdict(res)
    finally:
        res.problem, res.views = problem, views
    d.pop("views")
    d.pop("problem")
    for f in d["failures"]:
        f["frames"] = [dict(fr) for fr in f["frames"]]
        f["ranks"] = list(f["ranks"])
    return d


def outcomes_json(outcomes: Iterable[CaseOutcome]) -> str:
    cases = []
    for o in outcomes:
        cases.append({
            "name": o.name, "file": o.file, "expect": o.expect, "verdict": o.verdict,
            "matches_expectation": o.matches, "seconds": round(o.seconds, 4), "error": o.error,
            "result": (result_dict(o.result) | ({"witness": o.witness} if o.witness else {}))
            if o.result is not None else None,
        })
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, "cases": cases}, indent=2)
