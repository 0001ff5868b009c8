"""The report files of a zoo run, in one folder: index.html (dlverify/zoo/html.py),
zoo.json (the versioned JSON report of dlverify/reports/json_report.py, one
entry per item, so it validates against report-v1.schema.json), junit.xml and
zoo.sarif (dlverify/reports/junit.py and sarif.py)."""
from __future__ import annotations

import os
from pathlib import Path

from dlverify.zoo.html import zoo_html
from dlverify.zoo.runner import ZooRun

HTML, JSON, JUNIT, SARIF = "index.html", "zoo.json", "junit.xml", "zoo.sarif"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_reports(run: ZooRun, folder: Path) -> Path:
    """Write the four files; returns the HTML page's path. OSError when the
    folder cannot be written."""
    import json

    from dlverify.reports.json_report import outcomes_json
    from dlverify.reports.junit import junit_xml
    from dlverify.reports.sarif import sarif_log

    folder.mkdir(parents=True, exist_ok=True)
    outcomes = [r.case_outcome() for r in run.results]
    for o, r in zip(outcomes, run.results):
        o.name = r.id  # unique in the run: a case name alone may repeat across files
    _write(folder / JSON, outcomes_json(outcomes))
    _write(folder / JUNIT, junit_xml(outcomes, suite="dlverify zoo"))
    _write(folder / SARIF, json.dumps(sarif_log(outcomes), indent=2))
    _write(folder / HTML, zoo_html(run.results, run.summary()))
    return folder / HTML
