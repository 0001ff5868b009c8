"""The relation spec of an HLO pair (a TOML file). It is read here; the pairing
of two modules under it is frontends/hlo/pairing.py (this module does not
depend on any frontend).

The spec is TOML:

    ranks = 2
    [params]                      # keys: the N of parameter(N) in ENTRY
    0 = "replicated"
    9 = { split = 1, segments = [2048, 512, 512] }   # fused QKV: each segment split evenly
    10 = { split = 1 }            # split evenly along dim 1, rank order
    [outputs]                     # optional: expected relations; else inferred and printed
    0 = { concat = 0 }

Parameters the spec does not name are inferred: from the distributed module's
`sharding=` annotation when it gives the exact block of every rank, else from
the shapes (same shape: replicated; exactly one dim divided by the rank count:
split evenly along it; anything else is an error naming the parameter). Every
inferred relation is listed in `Problem.assumptions`.

Segmented splits. `{ split = d, segments = [s0, s1, ...] }` says dim d of the
sequential parameter is a concatenation of segments s0, s1, ... and rank r
holds its even share of every segment in turn (a fused QKV weight: its Q part,
then its K part, then its V part). That is not one block of the sequential
tensor, so it is represented exactly by splitting the parameter itself:

* in the distributed graph the parameter tensor becomes the output of a
  `concatenate` (dimension d) of one fresh input per segment, each holding that
  rank's even share of the segment (segment size / ranks along d);
* in the sequential graph the parameter tensor becomes the output of a
  `concatenate` (dimension d) of one fresh input per segment, each the full
  segment.

`Problem.inputs` then pairs sequential segment i with distributed segment i by
the plain BlockRelation `split_relation(segment shape, d, ranks)`; both graphs
gain the same inputs at the same positions (named `paramN.seg<i>`).
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlverify.errors import InputError


@dataclass(frozen=True)
class ParamSpec:
    """One `[params]` entry: "replicated", or split along `dim` (optionally as
    a concatenation of evenly split `segments`)."""

    kind: str                                  # "replicated" | "split"
    dim: int | None = None
    segments: tuple[int, ...] | None = None
    line: int = 0

    def describe(self) -> str:
        if self.kind == "replicated":
            return "replicated"
        seg = f", segments = {list(self.segments)}" if self.segments else ""
        return f"{{ split = {self.dim}{seg} }}"


@dataclass(frozen=True)
class OutputSpec:
    """One `[outputs]` entry: "replicated" or the ranks' outputs concatenated along `dim`."""

    kind: str                                  # "replicated" | "concat"
    dim: int | None = None
    line: int = 0


@dataclass
class Spec:
    file: str
    ranks: int | None = None
    params: dict[int, ParamSpec] = field(default_factory=dict)
    outputs: dict[int, OutputSpec] | None = None


# ---------------------------------------------------------------------------
# Loading


def _line_of(text: str, section: str | None, key: str) -> int:
    """Line of `key = ...` in `[section]` (or at top level), 0 if not found."""
    cur = None
    pat = re.compile(r'^\s*["\']?' + re.escape(key) + r'["\']?\s*=')
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*\[\s*([^\]]+?)\s*\]", line)
        if m:
            cur = m.group(1).strip("\"' ")
            continue
        if cur == section and pat.match(line):
            return i
    return 0


def _section_line(text: str, section: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*\[\s*" + re.escape(section) + r"\s*\]", line):
            return i
    return 0


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class _Entry:
    """One `N = value` row of a numbered table ([params], [outputs]) and its line in the file."""
    n: int
    val: Any
    line: int


def _numbered_entries(text: str, file: str, data: dict, table: str, what: str) -> list[_Entry]:
    """The rows of the table `table` (absent: none), each key checked to be a number (`what`)."""
    rows = data.get(table, {})
    if not isinstance(rows, dict):
        raise InputError(f"{table} must be a table [{table}]", file, _line_of(text, None, table))
    out = []
    for key, val in rows.items():
        line = _line_of(text, table, key)
        if not re.fullmatch(r"\d+", key):
            raise InputError(f"[{table}] key {key!r} is not {what}", file, line)
        out.append(_Entry(int(key), val, line))
    return out


def parse_spec(text: str, file: str) -> Spec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        raise InputError(f"bad TOML: {msg}", file, int(m.group(1)) if m else 0) from None
    unknown = set(data) - {"ranks", "params", "outputs"}
    if unknown:
        k = sorted(unknown)[0]
        raise InputError(f"unknown key {k!r} (expected ranks, [params], [outputs])", file,
                         _line_of(text, None, k) or _section_line(text, k))
    spec = Spec(file)
    if "ranks" in data:
        r = data["ranks"]
        if not _int(r) or r < 1:
            raise InputError(f"ranks must be a positive integer, got {r!r}", file,
                             _line_of(text, None, "ranks"))
        spec.ranks = r
    for entry in _numbered_entries(text, file, data, "params", "a parameter number"):
        n, val, line = entry.n, entry.val, entry.line
        if val == "replicated":
            spec.params[n] = ParamSpec("replicated", line=line)
            continue
        if not isinstance(val, dict):
            raise InputError(f"parameter {n}: expected \"replicated\" or {{ split = DIM }} "
                             f"(optionally with segments = [...]), got {val!r}", file, line)
        extra = set(val) - {"split", "segments"}
        if extra or "split" not in val:
            raise InputError(f"parameter {n}: expected {{ split = DIM }} (optionally with "
                             f"segments = [...]), got keys {sorted(val)}", file, line)
        dim = val["split"]
        if not _int(dim) or dim < 0:
            raise InputError(f"parameter {n}: split must be a dim number >= 0, got {dim!r}", file, line)
        segs = val.get("segments")
        if segs is not None:
            if (not isinstance(segs, list) or not segs
                    or not all(_int(s) and s > 0 for s in segs)):
                raise InputError(f"parameter {n}: segments must be a list of positive sizes, "
                                 f"got {segs!r}", file, line)
            segs = tuple(segs)
        spec.params[n] = ParamSpec("split", dim, segs, line)
    if "outputs" in data:
        spec.outputs = {}
        for entry in _numbered_entries(text, file, data, "outputs", "an output position"):
            n, val, line = entry.n, entry.val, entry.line
            if val == "replicated":
                spec.outputs[n] = OutputSpec("replicated", line=line)
            elif isinstance(val, dict) and set(val) == {"concat"} and _int(val["concat"]) \
                    and val["concat"] >= 0:
                spec.outputs[n] = OutputSpec("concat", val["concat"], line)
            else:
                raise InputError(f"output {n}: expected \"replicated\" or {{ concat = DIM }}, "
                                 f"got {val!r}", file, line)
    return spec


def load_spec(path: str | Path) -> Spec:
    """Read a relation spec TOML file. Errors are InputError(message, file, line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read spec: {e.strerror}", str(path)) from None
    return parse_spec(text, str(path))
