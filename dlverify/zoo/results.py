"""The result of one zoo item, as the child process returns it and the cache
keeps it: picklable, light (no problem graphs), enough for every report."""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the parent process stays light: unpickled only for the reports
    from dlverify.verdict import CaseOutcome

ItemKind = Literal["case", "hlo", "dump"]
Status = Literal["ok", "expected", "mismatch", "error"]
# How an item that has no verdict ended (dlverify.supervise's statuses)
ErrorKind = Literal["", "input_error", "out_of_time", "out_of_memory", "crashed", "internal_error"]
LIMIT_KINDS = ("out_of_time", "out_of_memory")


@dataclass
class ItemDetail:
    """What the HTML page shows of an item beyond its status line."""

    first_failure: str = ""      # "op at file.py:12: message"
    source_file: str = ""        # where the first failure is
    source_line: int = 0
    source_text: str = ""        # the text of that line, stripped
    svg: str = ""                # the failing subgraph, inline SVG ("" when verified)
    svg_note: str = ""           # why there is no drawing, when one was due
    assumptions: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # the proved reconstructions


@dataclass
class ItemResult:
    """One item's verdict (or why it has none)."""

    id: str                      # unique in a run: "path.py::case", "seq.hlo vs dist.hlo", ...
    name: str                    # the case or module pair
    kind: ItemKind
    file: str
    expect: str                  # "verified" | "bug"
    status: Status
    verdict: str                 # "verified" | "bug" | "error"
    seconds: float
    lines: list[str]             # the text report's lines for it
    error: str = ""
    error_kind: ErrorKind = ""
    detail: ItemDetail = field(default_factory=ItemDetail)
    outcome_pickle: bytes = b""  # the CaseOutcome (no problem graphs), for JSON/JUnit/SARIF
    cached: bool = False         # served from the cache or the resume journal

    @property
    def hit_limit(self) -> bool:
        return self.error_kind in LIMIT_KINDS

    def case_outcome(self) -> "CaseOutcome":
        from dlverify.verdict import CaseOutcome

        if self.outcome_pickle:
            o = pickle.loads(self.outcome_pickle)
            o.seconds = self.seconds
            return o
        return CaseOutcome(self.name, self.file, "bug" if self.expect == "bug" else "verified",
                           None, error=self.error, seconds=self.seconds)


def error_result(item_id: str, name: str, kind: ItemKind, file: str, expect: str,
                 error_kind: ErrorKind, text: str, seconds: float) -> ItemResult:
    """An item that ended without a verdict: bad input, a limit, a crash."""
    return ItemResult(item_id, name, kind, file, expect, "error", "error", seconds,
                      [f"ERROR     {item_id}: {text}"], error=text, error_kind=error_kind)
