"""The versioned JSON report for machines (schema: dlverify/schemas/report-v1.schema.json)."""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Iterable

from dlverify.verdict import CaseOutcome, Result

JSON_SCHEMA_VERSION = 1


def result_dict(res: Result) -> dict[str, Any]:
    """The Result without the derived views and the programs (kept for --explain
    and --graph, too large and not stable enough for a report)."""
    problem, views, padded, plan = res.problem, res.views, res.padded_views, res.segment_plan
    res.problem, res.views, res.padded_views, res.segment_plan = None, [], [], None
    try:
        d = asdict(res)
    finally:
        res.problem, res.views, res.padded_views, res.segment_plan = problem, views, padded, plan
    d.pop("views")
    d.pop("padded_views")
    d.pop("problem")
    d.pop("segment_plan")
    for f in d["failures"]:
        f["frames"] = [dict(fr) for fr in f["frames"]]
        f["ranks"] = list(f["ranks"])
    return d


def outcome_dict(o: CaseOutcome) -> dict[str, Any]:
    return {
        "name": o.name, "file": o.file, "expect": o.expect, "verdict": o.verdict,
        "matches_expectation": o.matches, "status": o.status, "seconds": round(o.seconds, 4), "error": o.error,
        "result": (result_dict(o.result) | ({"witness": o.witness} if o.witness else {}))
        if o.result is not None else None,
    }


def outcomes_json(outcomes: Iterable[CaseOutcome]) -> str:
    cases = [outcome_dict(o) for o in outcomes]
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, "cases": cases}, indent=2)
