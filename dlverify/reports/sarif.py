"""SARIF 2.1.0 output, so CI systems annotate the failing source lines."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from dlverify.verdict import FAILURE_KINDS, CaseOutcome, Failure, PatternMatch

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_URI = "https://github.com/dlverify/dlverify"


def _uri(path: str, root: Path) -> str:
    try:
        return Path(os.path.relpath(path, root)).as_posix() if path else ""
    except ValueError:  # another drive
        return Path(path).as_posix()


def _location(file: str, line: int, root: Path, text: str = "", ident: int | None = None) -> dict:
    loc: dict = {"physicalLocation": {"artifactLocation": {"uri": _uri(file, root)},
                                      "region": {"startLine": max(1, line)}}}
    if text:
        loc["message"] = {"text": text}
    if ident is not None:
        loc["id"] = ident
    return loc


def _result(f: Failure, case: str, root: Path, level: str) -> dict:
    res: dict = {
        "ruleId": f.kind,
        "level": level,
        "message": {"text": f"[{case}] {f.op}: {f.message}"},
        "properties": {"case": case, "program": f.program, "ranks": list(f.ranks)},
    }
    if f.file:
        res["locations"] = [_location(f.file, f.line, root)]
        if len(f.frames) > 1:
            res["relatedLocations"] = [_location(fr.file, fr.line, root, f"called from {fr.function}", i)
                                       for i, fr in enumerate(f.frames[1:], start=1)]
    return res


def _pattern_result(m: PatternMatch, case: str, root: Path) -> dict:
    """A matched bug pattern: a note at the op where the path ends, its start related."""
    text = f"[{case}] pattern {m.pattern}: {m.explanation}" + (f"; {m.advice}" if m.advice else "")
    res: dict = {"ruleId": f"pattern/{m.pattern}", "level": "note", "message": {"text": text},
                 "properties": {"case": case, "pattern_file": m.source}}
    if m.end_file:
        res["locations"] = [_location(m.end_file, m.end_line, root)]
    if m.start_file:
        res["relatedLocations"] = [_location(m.start_file, m.start_line, root,
                                             f"the path starts here ({m.start_op})", 1)]
    return res


def sarif_log(outcomes: Iterable[CaseOutcome], root: Path | None = None) -> dict:
    """One run; a result per failure of every case whose verdict is 'not verified',
    and one per case that verified although it expects a bug. Failures of a case
    that expects a bug are level "note" (the bug was found as expected); all
    others are errors. Each bug pattern matched is a note after the failures (an
    explanation, README "Bug-pattern queries")."""
    root = root or Path.cwd()
    results = []
    patterns: dict[str, str] = {}  # rule id -> explanation of the matched bug patterns
    for o in outcomes:
        if o.result is not None and not o.result.verified:
            level = "note" if o.expect == "bug" else "error"
            results += [_result(f, o.name, root, level) for f in o.result.failures]
            results += [_pattern_result(m, o.name, root) for m in o.result.patterns]
            patterns.update({f"pattern/{m.pattern}": m.explanation for m in o.result.patterns})
        if o.result is not None and not o.matches and o.result.verified:
            results.append({"ruleId": "unexpected-verdict", "level": "error",
                            "message": {"text": f"[{o.name}] verified, but the case expects a bug"},
                            "locations": [{"physicalLocation": {
                                "artifactLocation": {"uri": _uri(o.file, root)}}}]})
    rules = [{"id": k, "shortDescription": {"text": v}} for k, v in FAILURE_KINDS.items()]
    rules.append({"id": "unexpected-verdict",
                  "shortDescription": {"text": "a case verified although it expects a bug"}})
    rules += [{"id": k, "shortDescription": {"text": v}} for k, v in sorted(patterns.items())]
    return {
        "$schema": SARIF_SCHEMA_URI,
        "version": SARIF_VERSION,
        "runs": [{
            "tool": {"driver": {"name": "dlverify", "informationUri": TOOL_URI, "rules": rules}},
            "results": results,
        }],
    }


def write_sarif(outcomes: Iterable[CaseOutcome], path: Path) -> None:
    path.write_text(json.dumps(sarif_log(list(outcomes)), indent=2))
