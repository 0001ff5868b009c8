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

Pairing and the distributed program's own inputs. A `[params]` entry may say
which distributed parameter holds it, `dist = J` (torch_xla numbers parameters
by first use): `3 = { split = 1, dist = 5 }`, `4 = { replicated = true, dist = 0 }`.
Unnamed parameters pair by number when every pair's shapes fit, else by
metadata, shapes and uses (frontends/hlo/param_infer.py), listed as
assumptions. `"rank0_only"`: rank 0 holds the sequential value and every other
rank zeros (a row-parallel bias added before the all-reduce); it is
represented exactly, like a segmented split, by a select on the rank in the
distributed graph. `[dist_params]` declares the distributed module's inputs
that have no sequential counterpart, keyed by the distributed parameter
number: `"rank_id"` (each rank is passed its own rank), `{ value = X }` (the
same scalar X on every rank, e.g. a loss divisor), `"unused"` (read by
nothing that reaches an output, e.g. an ordering token). An `[outputs]`
entry `"sum"` (`"mean"`) says the sequential output is the sum (the mean) of
the ranks' outputs, e.g. a data-parallel step whose gradients are reduced
outside the module; it is stated as an all-reduce (and a division by the rank
count) appended to the distributed output.

Reshaped parameters. `reshaped = true` in a split or replicated table says the
distributed parameter holds its block (or the whole value) reshaped row-major
to the shape the distributed module declares (the same number of elements),
e.g. a weight handed over flattened: `3 = { split = 1, reshaped = true }`. It is
stated as a `reshape` of a fresh block-shaped input in the distributed graph.
Without a spec entry, a parameter whose shapes fit several such relations gets
the first candidate that makes the pair verify (dlverify/trial.py, listed).
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
    """One `[params]` entry: "replicated", "rank0_only", or split along `dim`
    (optionally as a concatenation of evenly split `segments`); `dist`: the
    distributed parameter number holding it (None: paired by the module)."""

    kind: str                                  # "replicated" | "split" | "rank0_only"
    dim: int | None = None
    segments: tuple[int, ...] | None = None
    line: int = 0
    dist: int | None = None
    pad: str | None = None                     # a padded split: "zero" | "any" (PAD_FORMS)
    # The distributed parameter holds its block (or the whole value) reshaped
    # row-major to the shape the distributed module declares.
    reshaped: bool = False

    def describe(self) -> str:
        """The entry in messages: the bare kind, or the TOML table of a split."""
        plain = self.kind in ("replicated", "rank0_only") and not self.reshaped
        return self.kind if plain else self.toml()

    def toml(self) -> str:
        """The entry as `[params]` TOML (what `dlverify spec` writes)."""
        dist = f", dist = {self.dist}" if self.dist is not None else ""
        reshaped = ", reshaped = true" if self.reshaped else ""
        if self.kind in ("replicated", "rank0_only"):
            return (f"{{ {self.kind} = true{reshaped}{dist} }}" if dist or reshaped
                    else f'"{self.kind}"')
        seg = f", segments = {list(self.segments)}" if self.segments else ""
        pad = f', pad = "{self.pad}"' if self.pad else ""
        return f"{{ split = {self.dim}{seg}{pad}{reshaped}{dist} }}"


@dataclass(frozen=True)
class DistOnlySpec:
    """One `[dist_params]` entry: an input of the distributed module only."""

    kind: str                                  # "rank_id" | "value" | "unused"
    value: float | None = None
    line: int = 0

    def describe(self) -> str:
        return f"{{ value = {self.value} }}" if self.kind == "value" else f'"{self.kind}"'


@dataclass(frozen=True)
class OutputSpec:
    """One `[outputs]` entry: "replicated" or the ranks' outputs concatenated along `dim`."""

    kind: str                                  # "replicated" | "concat" | "sum" | "mean"
    dim: int | None = None
    line: int = 0


@dataclass
class Spec:
    file: str
    ranks: int | None = None
    params: dict[int, ParamSpec] = field(default_factory=dict)
    outputs: dict[int, OutputSpec] | None = None
    dist_params: dict[int, DistOnlySpec] = field(default_factory=dict)


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
    unknown = set(data) - {"ranks", "params", "outputs", "dist_params"}
    if unknown:
        k = sorted(unknown)[0]
        raise InputError(f"unknown key {k!r} (expected ranks, [params], [outputs], "
                         f"[dist_params])", file,
                         _line_of(text, None, k) or _section_line(text, k))
    spec = Spec(file)
    if "ranks" in data:
        r = data["ranks"]
        if not _int(r) or r < 1:
            raise InputError(f"ranks must be a positive integer, got {r!r}", file,
                             _line_of(text, None, "ranks"))
        spec.ranks = r
    for entry in _numbered_entries(text, file, data, "params", "a parameter number"):
        spec.params[entry.n] = _param_entry(entry, file)
    for entry in _numbered_entries(text, file, data, "dist_params", "a parameter number"):
        spec.dist_params[entry.n] = _dist_only_entry(entry, file)
    for k, ps in spec.params.items():
        if ps.dist is not None and ps.dist in spec.dist_params:
            raise InputError(f"parameter {k}: dist = {ps.dist} is also declared in "
                             f"[dist_params]", file, ps.line)
    taken = [ps.dist for ps in spec.params.values() if ps.dist is not None]
    dup = [d for d in set(taken) if taken.count(d) > 1]
    if dup:
        line = min(ps.line for ps in spec.params.values() if ps.dist == dup[0])
        raise InputError(f"distributed parameter {dup[0]} is named by two [params] entries",
                         file, line)
    if "outputs" in data:
        spec.outputs = {}
        for entry in _numbered_entries(text, file, data, "outputs", "an output position"):
            n, val, line = entry.n, entry.val, entry.line
            if val in ("replicated", "sum", "mean"):
                spec.outputs[n] = OutputSpec(val, line=line)
            elif isinstance(val, dict) and set(val) == {"concat"} and _int(val["concat"]) \
                    and val["concat"] >= 0:
                spec.outputs[n] = OutputSpec("concat", val["concat"], line)
            else:
                raise InputError(f"output {n}: expected \"replicated\", \"sum\", \"mean\" or "
                                 f"{{ concat = DIM }}, got {val!r}", file, line)
    return spec


_PARAM_FORMS = ('"replicated", "rank0_only", { split = DIM } (optionally with segments = [...] '
                'or pad = "zero" | "any") or { replicated = true }, each table optionally with '
                'dist = J, split and replicated tables with reshaped = true')
# A padded split: blocks of ceil(n / ranks), the last ones padded past the end with
# zeros, or with values nothing is known of.
PAD_FORMS = ("zero", "any")


def _param_entry(entry: _Entry, file: str) -> ParamSpec:
    """One `[params]` row."""
    n, val, line = entry.n, entry.val, entry.line
    if val in ("replicated", "rank0_only"):
        return ParamSpec(val, line=line)
    if not isinstance(val, dict):
        raise InputError(f"parameter {n}: expected {_PARAM_FORMS}, got {val!r}", file, line)
    dist = val.get("dist")
    if dist is not None and (not _int(dist) or dist < 0):
        raise InputError(f"parameter {n}: dist must be a parameter number >= 0, got {dist!r}",
                         file, line)
    body = {k: v for k, v in val.items() if k not in ("dist", "reshaped")}
    reshaped = val.get("reshaped", False)
    if reshaped is not True and reshaped is not False:
        raise InputError(f"parameter {n}: reshaped must be true or false, got {reshaped!r}",
                         file, line)
    for kind in ("replicated", "rank0_only"):
        if set(body) == {kind}:
            if body[kind] is not True:
                raise InputError(f"parameter {n}: {kind} must be true, got {body[kind]!r}",
                                 file, line)
            if reshaped and kind == "rank0_only":
                raise InputError(f"parameter {n}: reshaped is not given with rank0_only",
                                 file, line)
            return ParamSpec(kind, line=line, dist=dist, reshaped=reshaped)
    extra = set(body) - {"split", "segments", "pad"}
    if extra or "split" not in body:
        raise InputError(f"parameter {n}: expected {_PARAM_FORMS}, got keys {sorted(val)}",
                         file, line)
    dim = body["split"]
    if not _int(dim) or dim < 0:
        raise InputError(f"parameter {n}: split must be a dim number >= 0, got {dim!r}", file, line)
    segs = body.get("segments")
    if segs is not None:
        if (not isinstance(segs, list) or not segs
                or not all(_int(s) and s > 0 for s in segs)):
            raise InputError(f"parameter {n}: segments must be a list of positive sizes, "
                             f"got {segs!r}", file, line)
        segs = tuple(segs)
    pad = body.get("pad")
    if pad is not None and (pad not in PAD_FORMS or segs is not None):
        raise InputError(f"parameter {n}: pad must be \"zero\" or \"any\", and not given with "
                         f"segments, got {pad!r}", file, line)
    if reshaped and (pad is not None or segs is not None):
        raise InputError(f"parameter {n}: reshaped is not given with segments or pad", file, line)
    return ParamSpec("split", dim, segs, line, dist, pad, reshaped)


def _dist_only_entry(entry: _Entry, file: str) -> DistOnlySpec:
    """One `[dist_params]` row."""
    n, val, line = entry.n, entry.val, entry.line
    if val in ("rank_id", "unused"):
        return DistOnlySpec(val, line=line)
    if isinstance(val, dict) and set(val) == {"value"} and isinstance(val["value"], (int, float)) \
            and not isinstance(val["value"], bool):
        return DistOnlySpec("value", float(val["value"]), line)
    raise InputError(f"distributed parameter {n}: expected \"rank_id\", \"unused\" or "
                     f"{{ value = NUMBER }}, got {val!r}", file, line)


def load_spec(path: str | Path) -> Spec:
    """Read a relation spec TOML file. Errors are InputError(message, file, line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read spec: {e.strerror}", str(path)) from None
    return parse_spec(text, str(path))
