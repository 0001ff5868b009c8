"""JUnit XML for multi-case runs: one testcase per case, failing when the verdict
does not match the case's expectation."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable
from xml.etree import ElementTree as ET

from dlverify.reports.text import failure_line, outcome_status
from dlverify.verdict import CaseOutcome


def junit_xml(outcomes: Iterable[CaseOutcome], suite: str = "dlverify") -> str:
    outcomes = list(outcomes)
    failures = sum(1 for o in outcomes if o.result is not None and not o.matches)
    errors = sum(1 for o in outcomes if o.result is None)
    root = ET.Element("testsuite", name=suite, tests=str(len(outcomes)), failures=str(failures),
                      errors=str(errors), time=f"{sum(o.seconds for o in outcomes):.3f}")
    for o in outcomes:
        tc = ET.SubElement(root, "testcase", name=o.name, classname=Path(o.file).stem,
                           file=o.file, time=f"{o.seconds:.3f}")
        if o.result is None:
            ET.SubElement(tc, "error", message=o.error or "error")
            continue
        got = "verified" if o.result.verified else "not verified"
        details = "\n".join(failure_line(f) for f in o.result.failures) or "\n".join(o.result.outputs)
        if not o.matches:
            el = ET.SubElement(tc, "failure", message=f"expected {o.expect}, got {got}")
            el.text = details
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = f"{outcome_status(o)[1]}\n{details}"
    return ET.tostring(root, encoding="unicode", xml_declaration=True)


def write_junit(outcomes: Iterable[CaseOutcome], path: Path) -> None:
    path.write_text(junit_xml(outcomes))
