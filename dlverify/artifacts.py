"""The optional products of a run the CLI asks for: explanations, numeric
witnesses, failing-subgraph drawings, SARIF and JUnit files. Not a renderer
itself (it runs the numeric witness): it calls the renderers of dlverify/reports/."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from dlverify.errors import InputError
from dlverify.reports.explain import explain as explain_output
from dlverify.reports.graph import write_graph
from dlverify.reports.junit import write_junit
from dlverify.reports.sarif import write_sarif
from dlverify.verdict import CaseOutcome
from dlverify.witness import witness as run_witness


def parse_explain_target(text: str) -> tuple[str, int]:
    """"out0" or "out0@RANK"."""
    name, _, rank = text.partition("@")
    if rank and not rank.isdigit():
        raise InputError(f"--explain {text!r}: the rank after @ must be a number")
    return name, int(rank) if rank else 0


def case_extras(o: CaseOutcome, explain: str | None = None, witness: bool = False,
                graph: Path | None = None) -> list[str]:
    """Lines to print after a case's verdict; stores the witness on the outcome."""
    lines: list[str] = []
    res = o.result
    if res is None:
        return lines
    if explain:
        name, rank = parse_explain_target(explain)
        try:
            lines += ["  " + line for line in explain_output(res, name, rank)]
        except ValueError as e:
            raise InputError(f"--explain: {e}") from None
    if witness:
        o.witness = run_witness(res).summary()
        lines.append("  " + o.witness)
    if graph is not None and not res.verified:
        lines.append("  " + write_graph(res, graph))
    return lines


def write_outputs(outcomes: Iterable[CaseOutcome], sarif: Path | None = None,
                  junit: Path | None = None) -> list[str]:
    outcomes = list(outcomes)
    notes = []
    if sarif is not None:
        write_sarif(outcomes, sarif)
        notes.append(f"wrote {sarif}")
    if junit is not None:
        write_junit(outcomes, junit)
        notes.append(f"wrote {junit}")
    return notes
