"""XLA's all-to-all resharding, rewritten as an all-gather and a slice.

When XLA's SPMD partitioner moves a tensor from being split along dim s to
being split along dim t (FSDP's gradients, a batch-split activation meeting a
column-split weight), it writes a chain of data movement on the distributed
side only: reshape (dim t cut into [n, t/n]), all-to-all over the new dim,
transpose (the new dim next to dim s), reshape (merged into dim s). No op of
the sequential program mirrors that chain, so nothing relates its pieces.

Its end value is simpler than its pieces: on the rank at position q of its
group, the block q of dim t of the all-gather of x along dim s. This pass
replaces the chain's last op by that all-gather and a `dynamic_slice` at
`q(rank) * (t/n)` (the rank's position read from a constant table indexed by
the rank, as XLA writes partition-dependent offsets), which the rules relate.

A compiled module writes the same exchange as a region rather than a chain:
XLA's tuple all-to-all slices the block into one piece per peer, exchanges the
pieces and concatenates what it receives, and elementwise ops may sit between
the exchange and the layout ops that finish the resharding (they commute with
data movement). So the pass first moves reshapes and transposes above the
elementwise ops they follow (`x` op splats: each element's value is unchanged,
only where it sits), then takes the region of data movement around each
all-to-all: the ops between one source tensor and one end tensor, reshape,
transpose, slice, concatenate and the all-to-all, and tries every source and
end, largest region first.

A region may also end at an all-gather over the all-to-all's groups that reads it:
XLA's backward of a fused QKV projection reshards the cotangent from batch-split to
slot-split, then gathers the slots for the input gradient's dot. What the gather
returns is the source gathered along its own split dim (no slice), so the dot reads
a gathered concatenation of the pieces, as the sequential dot reads their
concatenation (otherwise the sequential one is split into per-piece dots that no
distributed dot matches).

A gather may also end a round trip: XLA shards a value the members of a group hold
alike (a cotangent after its all-reduce) by padding it and slicing it per rank,
reshards the pieces and gathers them back (`undo_round_trips`, after the regions
above: its readers then read the value itself, as the sequential program does).

Sound by construction, not by pattern: the region and the candidate are pure
data movement (every output element is one input element), so running both
on inputs whose elements are all distinct (each rank's flat positions, tagged
by the rank) and getting the same outputs on every rank proves them equal for
all inputs. Only programs whose all-to-alls have `groups` over the flat rank
(HLO programs) are tried, and only when the tags fit in `MAX_TAGGED` elements
per rank.
"""
from __future__ import annotations

import numpy as np

from dlverify.frontends.hlo.model import FLAT_AXIS
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op
from dlverify.ops import KINDS, RANK_OPAQUE, Family, NotExecutable
from dlverify.problem import Problem

MAX_REGION = 64        # ops of one region
MAX_CUTS = 40          # sources and ends tried around one all-to-all (16 peers' pieces)
MAX_TAGGED = 1 << 20   # elements per rank run through the proof
MOVES = frozenset({"reshape", "transpose", "slice", "concatenate", "all_to_all"})
LAYOUTS = frozenset({"reshape", "transpose"})


def _readers(g: Graph) -> dict[int, list[Op]]:
    out: dict[int, list[Op]] = {}
    for op in g.ops:
        for t in op.inputs:
            out.setdefault(t, []).append(op)
    return out


def _splat_scalar(g: Graph, producer: dict[int, Op], t: int) -> int | None:
    """The scalar a broadcast of one value reads (`broadcast_in_dim` with no dims)."""
    op = producer.get(t)
    if op is not None and op.kind == "broadcast_in_dim" and not op.params["broadcast_dimensions"] \
            and g.tensors[op.inputs[0]].shape == ():
        return op.inputs[0]
    return None


def _data_operand(g: Graph, producer: dict[int, Op], e: Op) -> int | None:
    """The position of the one operand of elementwise `e` that is not a splat, when its
    other operands are splats and it has e's shape."""
    if KINDS[e.kind].family is not Family.ELEMENTWISE or e.kind == "select_n":
        return None
    data = [i for i, t in enumerate(e.inputs) if _splat_scalar(g, producer, t) is None]
    if len(data) != 1 or g.tensors[e.inputs[data[0]]].shape != g.tensors[e.output].shape:
        return None
    return data[0]


def _after_exchanges(g: Graph, producer: dict[int, Op]) -> set[int]:
    """Tensors computed from an all-to-all's result by data movement and elementwise ops
    on it and splats."""
    out: set[int] = set()
    for op in g.ops:
        if op.kind == "all_to_all" or (op.kind in MOVES and op.inputs and op.inputs[0] in out):
            out.add(op.output)
        elif op.inputs and (i := _data_operand(g, producer, op)) is not None and op.inputs[i] in out:
            out.add(op.output)
    return out


def hoist_layouts(g: Graph, ids: IdAllocator) -> bool:
    """Move every reshape or transpose above the elementwise op it reads, after an
    all-to-all, when that op has one data operand, its other operands splats, and no
    other reader: layout(e(x, splats)) = e(layout(x), splats of the new shape). Each
    element keeps its value; only where it sits changes. Returns whether anything moved."""
    changed = False
    while True:   # one pass per elementwise op a layout still has to pass
        producer, readers = {op.output: op for op in g.ops}, _readers(g)
        after = _after_exchanges(g, producer)
        kept: list[Op] = []
        hoisted: set[int] = set()        # elementwise ops now computed below their layout
        for lay in g.ops:
            e = producer.get(lay.inputs[0]) if lay.kind in LAYOUTS else None
            d = None if e is None else _data_operand(g, producer, e)
            if d is None or e.output not in after or len(readers.get(e.output, [])) != 1 \
                    or e.output in g.outputs:
                kept.append(lay)
                continue
            kept.extend(_hoisted(g, ids, producer, lay, e, d))
            hoisted.add(e.id)
        if not hoisted:
            return changed
        g.ops = [op for op in kept if op.id not in hoisted]
        changed = True


def _hoisted(g: Graph, ids: IdAllocator, producer: dict[int, Op], lay: Op, e: Op, d: int) -> list[Op]:
    """layout(e(..x..)) as e(..layout(x)..), the splats broadcast to the new shape; the
    last op writes the layout's output tensor."""
    out = g.tensors[lay.output]
    scratch = Graph("hoisted", tensors=g.tensors)
    b = GraphBuilder(scratch, ids)
    x = e.inputs[d]
    ins = [b.op(lay.kind, [x], out.shape, g.tensors[x].dtype, dict(lay.params), lay.loc)
           if i == d else
           b.op("broadcast_in_dim", [_splat_scalar(g, producer, t)], out.shape, g.tensors[t].dtype,
                {"broadcast_dimensions": ()}, e.loc)
           for i, t in enumerate(e.inputs)]
    b.op(e.kind, ins, out.shape, out.dtype, dict(e.params), e.loc, e.name, output=lay.output)
    return scratch.ops


def _upward(producer: dict[int, Op], start: Op, source: int) -> list[Op] | None:
    """The data-movement ops computing `start`'s operands from `source` alone, in
    program order by discovery (None when another tensor feeds them)."""
    ops: dict[int, Op] = {}
    stack = list(start.inputs)
    while stack:
        t = stack.pop()
        if t == source:
            continue
        op = producer.get(t)
        if op is None or op.kind not in MOVES or len(ops) > MAX_REGION:
            return None
        if op.id not in ops:
            ops[op.id] = op
            stack.extend(op.inputs)
    return list(ops.values())


def _sources(producer: dict[int, Op], a2a: Op) -> list[int]:
    """Tensors above the all-to-all, through data movement, nearest first."""
    out, seen, frontier = [], set(), [a2a.inputs[0]]
    while frontier and len(out) < MAX_CUTS:
        t = frontier.pop(0)
        if t in seen:
            continue
        seen.add(t)
        out.append(t)
        op = producer.get(t)
        if op is not None and op.kind in MOVES:
            frontier.extend(op.inputs)
    return out


def _ends(g: Graph, readers: dict[int, list[Op]], a2a: Op) -> list[Op]:
    """Data-movement ops below the all-to-all (itself included), nearest first, and the
    all-gathers over its groups reading them (a region ends there: the gather undoes the
    resharding's split)."""
    out, seen, frontier = [a2a], {a2a.id}, [a2a.output]
    while frontier and len(out) < MAX_CUTS:
        t = frontier.pop(0)
        for op in readers.get(t, []):
            if op.id in seen:
                continue
            if op.kind in MOVES:
                seen.add(op.id)
                out.append(op)
                frontier.append(op.output)
            elif op.kind == "all_gather" and op.params.get("groups") == a2a.params["groups"]:
                seen.add(op.id)
                out.append(op)
    return out


def _regions(g: Graph) -> list[tuple[int, list[Op]]]:
    """(source, ops in program order) of each data-movement region around an all-to-all
    that computes its end from the source alone, largest first for each all-to-all:
    the ops from the source to the all-to-all and from the all-to-all to the end."""
    producer, readers = {op.output: op for op in g.ops}, _readers(g)
    order = {op.id: i for i, op in enumerate(g.ops)}
    out = []
    for a2a in g.ops:
        if a2a.kind != "all_to_all" or "groups" not in a2a.params:
            continue
        above = [(x, ops) for x in _sources(producer, a2a)
                 if (ops := _upward(producer, a2a, x)) is not None]
        below = [(e, ops) for e in _ends(g, readers, a2a)
                 if (ops := _upward(producer, e, a2a.output) if e is not a2a else []) is not None]
        found = []
        for x, up in above:
            for e, down in below:
                region = {op.id: op for op in [*up, a2a, *down, e]}
                found.append((x, sorted(region.values(), key=lambda o: order[o.id])))
        found.sort(key=lambda xr: -len(xr[1]))
        out.extend(found)
    return out


def _tags(shape: tuple[int, ...], ranks: int) -> list[np.ndarray]:
    size = int(np.prod(shape))
    return [np.arange(r * size, (r + 1) * size, dtype=np.float64).reshape(shape)
            for r in range(ranks)]


def _run(tensors: dict, ops: list[Op], x: int, ranks: int) -> dict[int, list[np.ndarray]]:
    sub = Graph("resharding", tensors=tensors, inputs=[x], ops=list(ops))
    return Interpreter(sub, ranks, lambda r, a: r).run([_tags(tensors[x].shape, ranks)])


def _candidate(g: Graph, ids: IdAllocator, x: int, end: Op, a2a: Op, groups: list[list[int]],
               ranks: int, s: int, t: int | None) -> Graph:
    """all_gather(x, s) sliced at q(rank) * size along t (t None: not sliced), then
    reshaped to the end's
    shape when it differs, in a scratch graph holding x, the region's end and the new
    tensors only (not a copy of all of g's). The all-gather is the region's exchange:
    it carries the all-to-all's source location, so a failure at it names the line
    that wrote the exchange, not the layout op the region happens to end at (a user's
    reshape after the all-to-all, in the partitioner's output)."""
    xt, ot = g.tensors[x], g.tensors[end.output]
    n = len(groups[0])
    scratch = Graph("candidate", tensors={x: xt, end.output: ot})
    b = GraphBuilder(scratch, ids)
    gathered_shape = tuple(d * n if i == s else d for i, d in enumerate(xt.shape))
    sliced_shape = tuple(d // n if i == t else d for i, d in enumerate(gathered_shape))
    if t is None:   # the region gathers what it resharded: the gather of the source
        if gathered_shape == ot.shape:
            b.op("all_gather", [x], ot.shape, ot.dtype, {"dimension": s, "groups": groups},
                 a2a.loc, end.name, output=end.output)
        else:
            gathered = b.op("all_gather", [x], gathered_shape, xt.dtype,
                            {"dimension": s, "groups": groups}, a2a.loc, f"{end.name}.gathered")
            b.op("reshape", [gathered], ot.shape, ot.dtype, {}, end.loc, end.name,
                 output=end.output)
        return scratch
    gathered = b.op("all_gather", [x], gathered_shape, xt.dtype,
                    {"dimension": s, "groups": groups}, a2a.loc, f"{end.name}.gathered")
    table = np.zeros(ranks, np.int32)
    for grp in groups:
        for q, r in enumerate(grp):
            table[r] = q * sliced_shape[t]
    offsets = b.constant(table, (ranks,), "int32", end.loc, f"{end.name}.offsets")
    rank = b.op("axis_index", [], (), "int32", {"axis": FLAT_AXIS}, end.loc, f"{end.name}.rank")
    picked = b.op("dynamic_slice", [offsets, rank], (1,), "int32", {"slice_sizes": (1,)},
                  end.loc, f"{end.name}.offset1")
    start = b.op("reshape", [picked], (), "int32", {}, end.loc, f"{end.name}.offset")
    zero = b.constant(np.int32(0), (), "int32", end.loc, f"{end.name}.zero")
    starts = [start if i == t else zero for i in range(len(sliced_shape))]
    if sliced_shape == ot.shape:
        b.op("dynamic_slice", [gathered, *starts], ot.shape, ot.dtype,
             {"slice_sizes": ot.shape}, end.loc, end.name, output=end.output)
    else:   # the region also merges or splits dims: the block, reshaped
        block = b.op("dynamic_slice", [gathered, *starts], sliced_shape, ot.dtype,
                     {"slice_sizes": sliced_shape}, end.loc, f"{end.name}.block")
        b.op("reshape", [block], ot.shape, ot.dtype, {}, end.loc, end.name, output=end.output)
    return scratch


def _replacement(g: Graph, ids: IdAllocator, x: int, region: list[Op], ranks: int) -> list[Op] | None:
    """The all-gather and slice equal to the region's end (proven on tags), else None.
    Tried: every dim s to gather along and t to slice, when the end has the block's
    shape (t = s excluded: that is no exchange) or, merging or splitting dims, its
    element count; for a region ending in an all-gather, every dim s to gather along
    and no slice."""
    end = region[-1]
    xs, os_ = g.tensors[x].shape, g.tensors[end.output].shape
    a2a = next(op for op in region if op.kind == "all_to_all")
    groups = a2a.params["groups"]
    n = len(groups[0]) if groups else 0
    gathers = end.kind == "all_gather"
    if n < 2 or any(len(grp) != n for grp in groups) \
            or sorted(r for grp in groups for r in grp) != list(range(ranks)) \
            or int(np.prod(xs)) > MAX_TAGGED \
            or int(np.prod(xs)) * (n if gathers else 1) != int(np.prod(os_)):
        return None
    def block(s: int, t: int | None) -> tuple[int, ...]:
        return tuple(d * n if i == s else d // n if i == t else d for i, d in enumerate(xs))
    pairs: list[tuple[int, int | None]]
    if gathers:
        pairs = [(s, None) for s in range(len(xs))]
    else:
        pairs = [(s, t) for s in range(len(xs)) for t in range(len(xs))
                 if s != t and xs[t] % n == 0]
    if end.kind == "all_to_all":   # an exchange alone: the collective rules read it as it is
        pairs = [st for st in pairs if block(*st) == tuple(os_)]
    pairs.sort(key=lambda st: block(*st) != tuple(os_))   # a block needing no reshape first
    try:
        want = _run(g.tensors, region, x, ranks)[end.output]
    except NotExecutable:   # e.g. an exchange the evaluator refuses: nothing is rewritten
        return None
    for s, t in pairs:
        scratch = _candidate(g, ids, x, end, a2a, groups, ranks, s, t)
        got = _run(scratch.tensors, scratch.ops, x, ranks)[end.output]
        if all(np.array_equal(a, b) for a, b in zip(got, want)):
            g.tensors.update(scratch.tensors)
            return scratch.ops
    return None


def rewrite_reshardings(problem: Problem) -> bool:
    """Replace the end of every all-to-all resharding region of the distributed graph
    that an all-gather and a slice reproduce (see the module docstring)."""
    g = problem.dist
    if problem.mesh.axis_names != (FLAT_AXIS,) or not any(op.kind == "all_to_all" for op in g.ops):
        return False
    ranks = problem.mesh.size
    # layouts hoisted above elementwise ops, kept only when a region then becomes an
    # all-gather: elsewhere the program keeps the order the rules pair. Hoisting
    # replaces ops (it changes none in place) and adds tensors: the old op list and
    # tensor ids undo it.
    ops, tensors = list(g.ops), set(g.tensors)
    if hoist_layouts(g, problem.ids):
        if _rewrite_regions(g, problem.ids, ranks):
            undo_round_trips(g, problem.ids, ranks)
            return True
        g.ops = ops
        for t in set(g.tensors) - tensors:
            del g.tensors[t]
    if not _rewrite_regions(g, problem.ids, ranks):
        return False
    undo_round_trips(g, problem.ids, ranks)   # (the round trips a resharding is part of)
    return True


def _rewrite_regions(g: Graph, ids: IdAllocator, ranks: int) -> bool:
    """Replace each region's end, the largest first for each all-to-all (an end shared
    by two regions is replaced once), in one pass over the op list at the end."""
    done: set[int] = set()              # all-to-alls whose region was rewritten
    replaced: dict[int, list[Op]] = {}  # end op id -> the ops computing its tensor now
    for x, region in _regions(g):
        a2a = next(op for op in region if op.kind == "all_to_all")
        if a2a.id in done or region[-1].id in replaced:
            continue
        ops = _replacement(g, ids, x, region, ranks)
        if ops is None:
            continue
        replaced[region[-1].id] = ops
        done.add(a2a.id)
    if replaced:
        g.ops = [new for op in g.ops for new in replaced.get(op.id, [op])]
    return bool(done)


# ---------------------------------------------------------------- round trips
# XLA shards a value that every member of a group holds (the output of a collective
# over the group) by padding and slicing it per rank, reshards it and gathers it back
# (a backward pass's cotangent split into a fused projection's slots): the end of the
# round trip is the value itself, though no rank computes it from its own copy alone.
# Proven as the regions above, on tags, but with the source tagged alike on the members
# of each group (it is the same value there) and apart across groups. Only the values
# of literals and the rank (offset tables, pad values) enter besides the source.

ROUND_TRIP_MOVES = MOVES | {"dynamic_slice", "pad", "all_gather", "collective_permute"}
COLLECTIVE_OUTPUTS = frozenset({"all_reduce", "all_gather"})
LITERALS = frozenset({"constant", "iota", "axis_index"})
OPAQUE = RANK_OPAQUE   # may differ by rank whatever they read


def _rank_only(g: Graph) -> set[int]:
    """Tensors computed from literals and the rank alone (offset tables, pad values)."""
    out: set[int] = set()
    inputs = set(g.inputs)
    for op in g.ops:
        if op.kind in LITERALS or (op.inputs and op.kind not in OPAQUE and op.output not in inputs
                                   and all(t in out for t in op.inputs)):
            out.add(op.output)
    return out


def _invariant(g: Graph, groups: list[list[int]]) -> set[int]:
    """Tensors equal on the members of each group: results of all-reduces and all-gathers
    over exactly these groups, literals (not the rank), and local ops reading only such
    tensors."""
    out: set[int] = set()
    for op in g.ops:
        if KINDS[op.kind].collective is not None:
            if op.kind in COLLECTIVE_OUTPUTS and op.params.get("groups") == groups:
                out.add(op.output)
        elif op.kind in ("constant", "iota") or (op.inputs and op.kind not in OPAQUE
                                                 and all(t in out for t in op.inputs)):
            out.add(op.output)
    return out


def _round_trip_region(producer: dict[int, Op], end: Op, source: int,
                       rank_only: set[int]) -> list[Op] | None:
    """The ops computing `end` from `source` by data movement, with the rank-only values
    they read (None when another tensor feeds them)."""
    ops: dict[int, Op] = {end.id: end}
    stack = list(end.inputs)
    while stack:
        t = stack.pop()
        op = producer.get(t)
        if t == source or op is None and t in rank_only:
            continue
        if op is None or len(ops) > MAX_REGION \
                or (op.kind not in ROUND_TRIP_MOVES and t not in rank_only):
            return None
        if op.id not in ops:
            ops[op.id] = op
            stack.extend(op.inputs)
    return list(ops.values())


def _round_trip_candidates(g: Graph, producer: dict[int, Op], end: Op, invariant: set[int]) -> list[int]:
    """Tensors above the gather, through data movement, of its shape and the same on
    every member of its groups, nearest first."""
    shape = g.tensors[end.output].shape
    out, seen, frontier = [], set(), list(end.inputs)
    while frontier and len(seen) < MAX_REGION:
        t = frontier.pop(0)
        if t in seen:
            continue
        seen.add(t)
        if t in invariant and g.tensors[t].shape == shape:
            out.append(t)
        op = producer.get(t)
        if op is not None and op.kind in ROUND_TRIP_MOVES:
            frontier.extend(op.inputs)
    return out


def _group_tags(shape: tuple[int, ...], groups: list[list[int]], ranks: int, base: int) -> list[np.ndarray]:
    size = int(np.prod(shape))
    index = {r: q for q, grp in enumerate(groups) for r in grp}
    return [np.arange(base + index[r] * size, base + (index[r] + 1) * size,
                      dtype=np.float64).reshape(shape) for r in range(ranks)]


def _returns_source(g: Graph, region: list[Op], x: int, groups: list[list[int]], ranks: int) -> bool:
    """Whether the region's end equals x on every rank, for every x equal on the members
    of each group: run on tags, twice, from two bases, so that no element the region
    writes itself (a pad's value, a permute's zeros) passes for a tag in both runs."""
    order = {op.id: i for i, op in enumerate(g.ops)}
    ops = sorted(region, key=lambda o: order.get(o.id, len(order)))   # (a new end: last)
    sub = Graph("round trip", tensors=g.tensors, inputs=[x], ops=ops)
    for base in (1, 1 + ranks * MAX_TAGGED):
        tags = _group_tags(g.tensors[x].shape, groups, ranks, base)
        try:
            got = Interpreter(sub, ranks, lambda r, a: r).run([tags])[ops[-1].output]
        except NotExecutable:
            return False
        if not all(np.array_equal(a, b) for a, b in zip(got, tags)):
            return False
    return True


def _round_trip_source(g: Graph, producer: dict[int, Op], end: Op, groups: list[list[int]],
                       inv: set[int], rank_only: set[int], ranks: int) -> int | None:
    """The value the gather `end` (perhaps not in g yet) returns, when it is a round trip."""
    for x in _round_trip_candidates(g, producer, end, inv):
        if int(np.prod(g.tensors[x].shape)) > MAX_TAGGED:
            return None
        region = _round_trip_region(producer, end, x, rank_only)
        if region is not None and _returns_source(g, region, x, groups, ranks):
            return x
    return None


def undo_round_trips(g: Graph, ids: IdAllocator, ranks: int) -> bool:
    """Read every all-gather over a partition of the ranks that ends a round trip of a
    value the members of each group hold alike as that value. A gather of a
    concatenation along another dim is the concatenation of its pieces' gathers (each
    member's pieces land at the same offsets either way, rewrites.py): a piece's gather
    may be such a round trip. Returns whether anything changed."""
    producer = {op.output: op for op in g.ops}
    rank_only = _rank_only(g)
    invariant: dict[str, set[int]] = {}
    renamed: dict[int, int] = {}
    replaced: dict[int, list[Op]] = {}
    for end in g.ops:
        groups = end.params.get("groups") if end.kind == "all_gather" else None
        if not groups or sorted(r for grp in groups for r in grp) != list(range(ranks)):
            continue
        key = repr(groups)
        if key not in invariant:
            invariant[key] = _invariant(g, groups)
        inv = invariant[key]
        x = _round_trip_source(g, producer, end, groups, inv, rank_only, ranks)
        if x is not None and end.output not in g.outputs:
            renamed[end.output] = x
            continue
        cat = producer.get(end.inputs[0])
        d = end.params["dimension"]
        if cat is None or cat.kind != "concatenate" or cat.params["dimension"] == d:
            continue
        n = len(groups[0])
        scratch = Graph("pieces", tensors=g.tensors)
        b = GraphBuilder(scratch, ids)
        pieces, found = [], False
        for t in cat.inputs:
            shape = tuple(s * n if i == d else s for i, s in enumerate(g.tensors[t].shape))
            gathered = b.op("all_gather", [t], shape, g.tensors[t].dtype, dict(end.params), end.loc,
                            f"{end.name}.piece")
            src = _round_trip_source(g, producer, scratch.ops[-1], groups, inv, rank_only, ranks)
            if src is not None:
                scratch.ops.pop()
                found = True
            pieces.append(gathered if src is None else src)
        if found:
            b.op("concatenate", pieces, g.tensors[end.output].shape, g.tensors[end.output].dtype,
                 dict(cat.params), cat.loc, cat.name, output=end.output)
            replaced[end.id] = scratch.ops
    if not renamed and not replaced:
        return False
    def final(t: int) -> int:
        while t in renamed:
            t = renamed[t]
        return t
    g.ops = [new for op in g.ops for new in replaced.get(op.id, [op])]
    for op in g.ops:
        op.inputs = [final(t) for t in op.inputs]
    return True


__all__ = ["rewrite_reshardings", "hoist_layouts", "undo_round_trips"]
