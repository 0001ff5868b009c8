"""The relation spec of an HLO pair, and the Problem built from two HLO files.

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
from dlverify.ir import Frame, Graph, IdAllocator, Mesh, Op, SourceLoc, Tensor
from dlverify.problem import Problem
from dlverify.relations import BlockRelation, replicated, split_relation


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
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise InputError("params must be a table [params]", file, _line_of(text, None, "params"))
    for key, val in params.items():
        line = _line_of(text, "params", key)
        if not re.fullmatch(r"\d+", key):
            raise InputError(f"[params] key {key!r} is not a parameter number", file, line)
        n = int(key)
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
        outs = data["outputs"]
        if not isinstance(outs, dict):
            raise InputError("outputs must be a table [outputs]", file, _line_of(text, None, "outputs"))
        spec.outputs = {}
        for key, val in outs.items():
            line = _line_of(text, "outputs", key)
            if not re.fullmatch(r"\d+", key):
                raise InputError(f"[outputs] key {key!r} is not an output position", file, line)
            n = int(key)
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


# ---------------------------------------------------------------------------
# Problem


def _shape_str(shape: tuple[int, ...], dtype: str = "") -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def _infer(n: int, name: str, s_shape: tuple[int, ...], d_shape: tuple[int, ...], ranks: int,
           dist_file: str, line: int) -> tuple[BlockRelation, str]:
    if s_shape == d_shape:
        return replicated(s_shape, ranks), "replicated (same shape in both programs)"
    if len(s_shape) == len(d_shape):
        diff = [i for i, (a, b) in enumerate(zip(s_shape, d_shape)) if a != b]
        if len(diff) == 1 and d_shape[diff[0]] * ranks == s_shape[diff[0]]:
            d = diff[0]
            return (split_relation(s_shape, d, ranks),
                    f"split evenly along dim {d} over {ranks} ranks, rank order (inferred from "
                    f"the shapes)")
    raise InputError(f"parameter {n} ({name}): cannot infer its relation from the shapes "
                     f"{_shape_str(s_shape)} (sequential) and {_shape_str(d_shape)} (distributed) "
                     f"over {ranks} ranks: name it in the spec's [params]", dist_file, line)


def _segment(graph: Graph, ids: IdAllocator, pos: int, dim: int, piece_shapes: list[tuple[int, ...]],
             name: str, loc: SourceLoc) -> list[int]:
    """Replace input `pos` of `graph` by one fresh input per piece and make the old
    input tensor their concatenation along `dim`."""
    t = graph.inputs[pos]
    dtype = graph.tensors[t].dtype
    pieces = []
    for i, shp in enumerate(piece_shapes):
        tid = ids()
        graph.tensors[tid] = Tensor(tid, tuple(shp), dtype, f"{name}.seg{i}")
        pieces.append(tid)
    graph.ops.insert(0, Op(ids(), "concatenate", list(pieces), t, {"dimension": dim}, loc,
                           f"{name}.segments"))
    graph.inputs[pos:pos + 1] = pieces
    graph.input_names[pos:pos + 1] = [f"{name}.seg{i}" for i in range(len(pieces))]
    return pieces


def hlo_problem(seq_path: str | Path, dist_path: str | Path, spec: Spec | None,
                ranks: int | None, ids: IdAllocator, *,
                custom_calls: dict[str, Any] | None = None,
                instruction_frames: bool = True) -> Problem:
    """Build the Problem of a sequential and a distributed (SPMD, one program per
    rank) HLO text module. Parameters are matched by parameter number, outputs by
    position in the ENTRY root tuple. `ranks`: the --ranks argument; else the
    spec's `ranks`; else the distributed module's num_partitions * replica_count.
    `instruction_frames`: ops are located at their instruction's line in the
    file first, then at the user frames of its metadata (see hlo_to_graph)."""
    from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module

    seq_path, dist_path = str(seq_path), str(dist_path)
    texts = []
    for p in (seq_path, dist_path):
        try:
            texts.append(Path(p).read_text(encoding="utf-8"))
        except OSError as e:
            raise InputError(f"cannot read HLO file: {e.strerror}", p) from None
        except UnicodeDecodeError:
            raise InputError("not a text file (HLO text expected)", p) from None
    seq_mod = parse_hlo_module(texts[0], seq_path)
    dist_mod = parse_hlo_module(texts[1], dist_path)
    spec_file = spec.file if spec is not None else ""

    header_n = (dist_mod.num_partitions or 1) * (dist_mod.replica_count or 1)
    if ranks is not None:
        n = ranks
        source = "--ranks"
    elif spec is not None and spec.ranks is not None:
        n = spec.ranks
        source = f"the spec's ranks ({spec_file})"
    elif header_n > 1:
        n = header_n
        source = "num_partitions/replica_count"
    else:
        raise InputError("the number of ranks is unknown: the distributed module declares no "
                         "num_partitions or replica_count; pass --ranks or set `ranks` in the spec",
                         dist_path)
    if n < 1:
        raise InputError(f"the number of ranks must be positive, got {n}", spec_file or dist_path)
    if header_n > 1 and header_n != n:
        raise InputError(f"{source} says {n} ranks but the module declares "
                         f"num_partitions * replica_count = {header_n}", dist_path)

    seq, seq_info = hlo_to_graph(seq_mod, ids, "sequential", custom_calls=custom_calls,
                                 instruction_frames=instruction_frames)
    dist, dist_info = hlo_to_graph(dist_mod, ids, "distributed", ranks=n, custom_calls=custom_calls,
                                   instruction_frames=instruction_frames)
    mesh = Mesh(("_flat",), (n,))

    sp, dp = seq_info.params, dist_info.params
    if len(sp) != len(dp):
        raise InputError(f"the sequential module has {len(sp)} parameters but the distributed one "
                         f"has {len(dp)}", dist_path, dist_mod.entry.line)
    spec_params = spec.params if spec is not None else {}
    for k, ps in spec_params.items():
        if k >= len(sp):
            raise InputError(f"the spec names parameter {k}, but the modules have {len(sp)} "
                             f"parameters (0..{len(sp) - 1})", spec_file, ps.line)

    assumptions = list(dict.fromkeys(seq_info.assumptions + dist_info.assumptions))
    relations: list[BlockRelation] = []
    segmented: list[tuple[int, ParamSpec]] = []
    for a, b in zip(sp, dp):
        k = a.number
        if a.dtype != b.dtype:
            raise InputError(f"parameter {k} ({b.name}) is {b.dtype} in the distributed module but "
                             f"{a.dtype} in the sequential one", dist_path, b.line)
        ps = spec_params.get(k)
        if ps is None:
            rel = b.relation
            if rel is not None and rel.seq_shape == a.shape and rel.dist_shape == b.shape \
                    and len(rel.offsets) == n:
                sh = b.sharding.text if b.sharding is not None else ""
                assumptions.append(f"parameter {k} ({b.name}): relation from its sharding "
                                   f"annotation sharding={sh}")
            else:
                rel, why = _infer(k, b.name, a.shape, b.shape, n, dist_path, b.line)
                assumptions.append(f"parameter {k} ({b.name}, sequential {_shape_str(a.shape, a.dtype)},"
                                   f" distributed {_shape_str(b.shape, b.dtype)}): {why}")
            relations.append(rel)
            continue
        where = f"parameter {k} ({b.name}): spec {ps.describe()}"
        if ps.kind == "replicated":
            if a.shape != b.shape:
                raise InputError(f"{where}, but the sequential shape {_shape_str(a.shape)} differs "
                                 f"from the distributed {_shape_str(b.shape)}", spec_file, ps.line)
            relations.append(replicated(a.shape, n))
            continue
        d = ps.dim
        assert d is not None
        if d >= len(a.shape):
            raise InputError(f"{where}: dim {d} is outside the rank-{len(a.shape)} shape "
                             f"{_shape_str(a.shape)}", spec_file, ps.line)
        if ps.segments:
            if sum(ps.segments) != a.shape[d]:
                raise InputError(f"{where}: segments sum to {sum(ps.segments)} but dim {d} of the "
                                 f"sequential shape {_shape_str(a.shape)} is {a.shape[d]}",
                                 spec_file, ps.line)
            bad = [s for s in ps.segments if s % n]
            if bad:
                raise InputError(f"{where}: segment of size {bad[0]} does not split evenly over "
                                 f"{n} ranks", spec_file, ps.line)
            local = a.shape[:d] + (sum(s // n for s in ps.segments),) + a.shape[d + 1:]
            if local != b.shape:
                raise InputError(f"{where} gives local shape {_shape_str(local)}, but the "
                                 f"distributed module declares {_shape_str(b.shape)}",
                                 spec_file, ps.line)
            relations.append(None)  # type: ignore[arg-type]  # replaced below
            segmented.append((k, ps))
            continue
        if a.shape[d] % n:
            raise InputError(f"{where}: dim {d} of size {a.shape[d]} does not split evenly over "
                             f"{n} ranks", spec_file, ps.line)
        rel = split_relation(a.shape, d, n)
        if rel.dist_shape != b.shape:
            raise InputError(f"{where} gives local shape {_shape_str(rel.dist_shape)}, but the "
                             f"distributed module declares {_shape_str(b.shape)}", spec_file, ps.line)
        relations.append(rel)

    # Segmented parameters: split both graphs' inputs (highest position first so
    # earlier positions stay valid).
    for k, ps in sorted(segmented, reverse=True):
        a = sp[k]
        d = ps.dim
        assert d is not None and ps.segments
        seg_seq = [a.shape[:d] + (s,) + a.shape[d + 1:] for s in ps.segments]
        seg_dist = [a.shape[:d] + (s // n,) + a.shape[d + 1:] for s in ps.segments]
        pos_s = seq.inputs.index(a.tensor)
        pos_d = dist.inputs.index(dp[k].tensor)
        _segment(seq, ids, pos_s, d, seg_seq, f"param{k}",
                 SourceLoc((Frame(seq_path, a.line, a.name),), ""))
        _segment(dist, ids, pos_d, d, seg_dist, f"param{k}",
                 SourceLoc((Frame(dist_path, dp[k].line, dp[k].name),), ""))
        relations[k:k + 1] = [split_relation(s, d, n) for s in seg_seq]

    if len(seq_info.outputs) != len(dist_info.outputs):
        raise InputError(f"the sequential module returns {len(seq_info.outputs)} arrays but the "
                         f"distributed one returns {len(dist_info.outputs)}", dist_path,
                         dist_mod.entry.root.line)
    outputs: list[BlockRelation | None] = [None] * len(seq_info.outputs)
    if spec is not None and spec.outputs is not None:
        for i, os_ in spec.outputs.items():
            if i >= len(outputs):
                raise InputError(f"the spec names output {i}, but the modules return "
                                 f"{len(outputs)} arrays", spec_file, os_.line)
            s_shape, d_shape = seq_info.outputs[i][0], dist_info.outputs[i][0]
            if os_.kind == "replicated":
                rel = replicated(s_shape, n)
                what = "replicated"
            else:
                assert os_.dim is not None
                if os_.dim >= len(s_shape) or s_shape[os_.dim] % n:
                    raise InputError(f"output {i}: concat = {os_.dim} does not split the sequential "
                                     f"shape {_shape_str(s_shape)} evenly over {n} ranks",
                                     spec_file, os_.line)
                rel = split_relation(s_shape, os_.dim, n)
                what = f"{{ concat = {os_.dim} }}"
            if rel.dist_shape != d_shape:
                raise InputError(f"output {i}: spec {what} gives local shape "
                                 f"{_shape_str(rel.dist_shape)} for the sequential "
                                 f"{_shape_str(s_shape)}, but the distributed module returns "
                                 f"{_shape_str(d_shape)}", spec_file, os_.line)
            outputs[i] = rel
    name = f"{Path(seq_path).name} vs {Path(dist_path).name}"
    return Problem(seq, dist, mesh, relations, outputs, ids, assumptions, name)
