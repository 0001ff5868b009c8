"""The distributed program's reorders of a sequence: read from its ops, and
computed by one gather (dlverify/sequence_permutation.py rewrites the sequential
program into the order they give).

A reorder is pure data movement of a replicated input (reshapes, gathers, selects,
slices, concatenations, whose indices and masks depend on no input), so each
element of its result is a constant or the input's element at a position fixed
before run time. Evaluated by the shared evaluator on two probes of distinct
values that differ at every position, an element equal to probe[j] on both is
the input's element j: two runs read the permutation exactly. A pick that
depends on the rank (Megatron's get_batch_on_this_cp_rank: each rank takes its
chunks of the replicated sequence) is evaluated on every rank; when rank r's rows
are, for every r, the block at its coordinate along a mesh axis of one
permutation, it is that gather followed by a dynamic_slice at coordinate * rows.

An input the ranks hold in blocks along one mesh axis may be reordered across the
ranks (XLA partitions a take along a sharded dim into slices, collective_permutes
and all_to_alls of rows): the first tensor of that movement a computation reads is
read as the block at the rank's coordinate of one permutation of the blocks'
concatenation, by the same two probes given to every rank as the blocks it holds.
Whatever a reading finds, the chain is used only when its canonical form (the
gather of an all_gather, the rank's block cut by a dynamic_slice) computes, by the
shared evaluator, what the ops compute on every rank on both probes: both are
movement, each element a constant or one probe element at a place fixed before
run time, so agreeing on two probes that differ everywhere they agree everywhere.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from dlverify.interpret import Interpreter, NotExecutable
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op, Tensor
from dlverify.ops import KINDS, RANK_OPAQUE, Family, exact_dtype
from dlverify.problem import Problem

# data movement the permutation of an input may be built from (operand 0 the data;
# the other operands, indices and masks, must not depend on any input)
_MOVES = {"reshape", "gather", "select_n", "slice", "concatenate", "transpose", "rev",
          "broadcast_in_dim"}
# data movement across ranks (a sharded input reordered): where each element lands
# depends on the rank, never on an input's values (dynamic_slice's starts input-free)
_CROSS = {"collective_permute", "all_to_all", "dynamic_slice"}
# the largest tensor whose reorder is read (evaluated twice on a probe of its size);
# a larger one is left as written, and the program unrewritten
PROBE_LIMIT = 1 << 22


@dataclass
class Chain:
    """Ops of the distributed program that compute `out` = `perm` applied along dim
    `dim` of `src` (pure data movement of src and of input-independent values)."""

    src: int
    out: int
    dim: int
    perm: tuple[int, ...]
    ops: list[Op]
    # (axis, rows): `out` is on each rank the block of `rows` rows at its coordinate
    # along mesh axis `axis` (a per-rank pick of chunks, Megatron's
    # get_batch_on_this_cp_rank), not the whole permuted tensor
    block: tuple[str, int] | None = None
    # when set, `src` is each rank's block (at its coordinate along block's axis) and
    # `out` the permutation of their concatenation over these rank groups: the
    # un-permute of an output as XLA partitions it (each rank places its rows, an
    # all_reduce sums the placements)
    gathered: list[list[int]] | None = None


def input_free(g: Graph, rank: bool = False) -> set[int]:
    """Tensors of g computed from no input (and, unless `rank`, no rank coordinate)."""
    free: set[int] = set()
    sources = RANK_OPAQUE | (frozenset() if rank else {"axis_index"})
    for op in g.ops:
        if op.kind not in sources and \
                KINDS[op.kind].family is not Family.COLLECTIVE and all(i in free for i in op.inputs):
            if op.kind != "constant" or op.params.get("value") is not None:
                free.add(op.output)
    return free


def _moved_from(g: Graph, roots: set[int], free: set[int], sums: bool = False,
                cross: bool = False) -> dict[int, int]:
    """For each tensor that is data movement of one root alone, that root: the data
    operands moved from it (or input-free), every other operand input-free, so where
    each element lands depends on no input's values. One pass over the ops. With
    `sums`, an all_reduce sum counts too: it is movement where each element has one
    nonzero term, which the caller checks (gathered_output_chain). With `cross`,
    movement across ranks counts too (_CROSS)."""
    root = {t: t for t in roots}
    kinds = _MOVES | _CROSS if cross else _MOVES
    for op in g.ops:
        if not op.inputs or op.kind not in kinds and not (
                sums and op.kind == "all_reduce" and op.params.get("reducer") == "sum"):
            continue
        data = range(1, len(op.inputs)) if op.kind == "select_n" else \
            range(len(op.inputs)) if op.kind == "concatenate" else range(1)
        if any(op.inputs[i] not in free for i in range(len(op.inputs)) if i not in data):
            continue
        srcs = {root.get(op.inputs[i], -1) for i in data if op.inputs[i] not in free}
        if len(srcs) == 1 and -1 not in srcs:
            root[op.output] = srcs.pop()
    return root


def _movement_of(g: Graph, src: int, free: set[int]) -> dict[int, Op]:
    """The ops whose output is data movement of `src` alone (_moved_from)."""
    root = _moved_from(g, {src}, free)
    return {op.output: op for op in g.ops if op.output != src and root.get(op.output) == src}


def _slice_ops(g: Graph, src: int, out: int, moved: dict[int, Op],
               producer: dict[int, Op]) -> list[Op]:
    """The ops computing `out` from `src` and input-free values, in program order."""
    need, stack = set(), [out]
    while stack:
        t = stack.pop()
        if t == src or t in need:
            continue
        op = moved.get(t) or producer.get(t)
        if op is None:
            return []
        need.add(t)
        stack.extend(op.inputs)
    return [op for op in g.ops if op.output in need]


def _evaluate(g: Graph, src: int, out: int, ops: list[Op], probe: np.ndarray) -> np.ndarray | None:
    sub = Graph("probe", tensors=g.tensors, ops=ops, inputs=[src], outputs=[out])
    try:
        return Interpreter(sub).run([[probe]])[out][0]
    except (NotExecutable, KeyError):
        return None


def _probes(shape: tuple[int, ...], dtype: str) -> list[np.ndarray] | None:
    """Two probes of distinct values that differ at every position. Each element of
    a movement's result is a constant or x[i] for an i fixed by input-free values;
    an element equal to probe[j] on both is x[j] (a constant cannot take both values)."""
    size = int(np.prod(shape))
    exact = exact_dtype(dtype)
    if exact is not None and (np.dtype(exact).kind not in "iu" or np.iinfo(exact).max < 2 * size):
        return None
    first = np.arange(1, size + 1, dtype=np.int64 if exact is not None else np.float64).reshape(shape)
    return [first, first + size]


def _selection(probes: list[np.ndarray], results: list[np.ndarray | None],
               dim: int) -> tuple[int, ...] | None:
    """The rows sel of the probes along `dim` with result == take(probe, sel, axis=dim)
    on both probes (the other dims equal), or None."""
    shape = probes[0].shape
    out = results[0].shape if results[0] is not None else None
    if out is None or any(r is None or r.shape != out for r in results) or len(out) != len(shape) \
            or any(a != b for j, (a, b) in enumerate(zip(out, shape)) if j != dim):
        return None
    n, stride = shape[dim], int(np.prod(shape[dim + 1:]))
    lead = np.asarray(np.moveaxis(results[0], dim, 0).reshape(out[dim], -1)[:, 0], np.float64)
    if not np.all(np.isfinite(lead)) or np.any(lead != np.round(lead)) or np.any(lead < 1):
        return None
    sel = tuple(int((v - 1) // stride) % n for v in lead)
    if all(np.array_equal(r, np.take(p, sel, axis=dim)) for r, p in zip(results, probes)):
        return sel
    return None


def _as_permutation(shape: tuple[int, ...], dtype: str, ops_eval) -> tuple[int, tuple[int, ...]] | None:
    """(dim, perm) when the evaluated movement is `take(x, perm, axis=dim)`, perm a
    permutation and no identity."""
    probes = _probes(shape, dtype)
    if probes is None:
        return None
    results = [ops_eval(p) for p in probes]
    for dim, n in enumerate(shape):
        sel = _selection(probes, results, dim) if n > 1 else None
        if sel is not None and sorted(sel) == list(range(n)) and sel != tuple(range(n)):
            return dim, sel
    return None


def _rank_pick(problem: Problem, d: int, t: int, ops: list[Op]) -> tuple[int, tuple[int, ...], str, int] | None:
    """(dim, perm, axis, rows) when tensor t is on every rank the block of `rows` rows
    of take(d, perm, axis=dim) at the rank's coordinate along mesh `axis`, perm no
    identity: evaluated on every rank at once."""
    g, mesh = problem.dist, problem.mesh
    shape, out = g.tensors[d].shape, g.tensors[t].shape
    dims = [j for j in range(len(shape)) if len(out) == len(shape) and out[j] != shape[j]]
    probes = _probes(shape, g.tensors[d].dtype)
    if len(dims) != 1 or probes is None:
        return None
    dim = dims[0]
    sub = Graph("probe", tensors=g.tensors, ops=ops, inputs=[d], outputs=[t])
    try:
        runs = [Interpreter(sub, mesh.size, lambda r, a: mesh.coords(r)[a]).run(
            [[p] * mesh.size])[t] for p in probes]
    except (NotExecutable, KeyError):
        return None
    sels = [_selection(probes, [run[r] for run in runs], dim) for r in range(mesh.size)]
    if any(sel is None for sel in sels):
        return None
    for axis, n in zip(mesh.axis_names, mesh.axis_sizes):
        if n * out[dim] != shape[dim]:
            continue
        by_coord = {}
        for r, sel in enumerate(sels):
            by_coord.setdefault(mesh.coords(r)[axis], set()).add(sel)
        if any(len(v) != 1 for v in by_coord.values()):
            continue                      # the pick depends on another coordinate too
        perm = tuple(i for c in range(n) for i in next(iter(by_coord[c])))
        if sorted(perm) == list(range(shape[dim])) and perm != tuple(range(shape[dim])):
            return dim, perm, axis, out[dim]
    return None


def input_chains(problem: Problem) -> dict[int, Chain]:
    """Per sequential input: the distributed program's permutation of its replica,
    the last tensor of the replica's movement that is a permutation of one dim; else
    the last that is, on every rank, its block of one (a per-rank pick)."""
    g, mesh, producer = problem.dist, problem.mesh, problem.dist.producer()
    pairs = [(s, d) for s, d, rel in zip(problem.seq.inputs, g.inputs, problem.inputs)
             if rel.is_replicated() and not any(any(o) for o in rel.offsets)
             and int(np.prod(g.tensors[d].shape)) <= PROBE_LIMIT]
    out: dict[int, Chain] = {}
    for rank in (False, True):      # input-free movement first, then rank-dependent picks
        rest = [(s, d) for s, d in pairs if s not in out]
        root = _moved_from(g, {d for _, d in rest}, input_free(g, rank))
        moved: dict[int, dict[int, Op]] = {d: {} for _, d in rest}
        for op in g.ops:
            if op.output in root and root[op.output] != op.output:
                moved[root[op.output]][op.output] = op      # (in program order)
        for s, d in rest:
            shape = g.tensors[d].shape
            for t in reversed(list(moved[d])):
                got = g.tensors[t].shape
                if not _block_shaped(got, shape, mesh.axis_sizes) if rank else got != shape:
                    continue
                ops = _slice_ops(g, d, t, moved[d], producer)
                if not ops:
                    continue
                if rank:
                    found = _rank_pick(problem, d, t, ops)
                    chain = found and Chain(d, t, found[0], found[1], ops, found[2:])
                else:
                    found = _as_permutation(shape, g.tensors[d].dtype,
                                            lambda p: _evaluate(g, d, t, ops, p))
                    chain = found and Chain(d, t, found[0], found[1], ops)
                if chain:
                    out[s] = chain
                    break
    out.update(_sharded_input_chains(problem))
    return out


def _sharded_layout(problem: Problem, rel) -> tuple[int, str, int] | None:
    """(dim, axis, rows) when input relation `rel` gives every rank the block of `rows`
    rows of dim `dim` at its coordinate along mesh axis `axis`, the other dims whole."""
    mesh = problem.mesh
    cut = [j for j, (a, b) in enumerate(zip(rel.seq_shape, rel.dist_shape)) if a != b]
    if len(rel.seq_shape) != len(rel.dist_shape) or len(cut) != 1:
        return None
    dim, rows = cut[0], rel.dist_shape[cut[0]]
    for axis, n in zip(mesh.axis_names, mesh.axis_sizes):
        if n * rows == rel.seq_shape[dim] and all(
                tuple(off) == tuple(mesh.coords(r)[axis] * rows if j == dim else 0 for j in range(len(off)))
                for r, off in enumerate(rel.offsets)):
            return dim, axis, rows
    return None


def _sharded_input_chains(problem: Problem) -> dict[int, Chain]:
    """Per sequential input held in blocks along one mesh axis: the permutation the
    distributed program's movement across ranks puts it in. The tensor read is the
    first of that movement (the input itself included) that an op other than movement
    reads: a ring then passes on a block already reordered (a passed-on block is a
    block of another permutation, a rotation, and must not be taken for the reorder)."""
    g, mesh = problem.dist, problem.mesh
    free, producer = input_free(g, rank=True), g.producer()
    readers: dict[int, list[Op]] = {}
    for op in g.ops:
        for i in op.inputs:
            readers.setdefault(i, []).append(op)
    layouts = {d: _sharded_layout(problem, rel) for d, rel in zip(g.inputs, problem.inputs)
               if int(np.prod(rel.seq_shape)) <= PROBE_LIMIT}
    layouts = {d: lay for d, lay in layouts.items() if lay is not None}
    root = _moved_from(g, set(layouts), free, cross=True)
    movement: dict[int, dict[int, Op]] = {d: {} for d in layouts}
    for op in g.ops:
        if op.output in root and root[op.output] != op.output:
            movement[root[op.output]][op.output] = op      # (in program order)
    out: dict[int, Chain] = {}
    for s, d, rel in zip(problem.seq.inputs, g.inputs, problem.inputs):
        probes = _probes(rel.seq_shape, g.tensors[d].dtype)
        if d not in layouts or probes is None:
            continue
        dim, axis, _ = layouts[d]
        moved = movement[d]
        read = next((t for t in [d, *moved] if any(op.output not in moved for op in readers.get(t, ()))),
                    None)
        if read is None or read == d or g.tensors[read].shape != g.tensors[d].shape:
            continue
        ops = _slice_ops(g, d, read, moved, producer)
        blocks = [[p[tuple(slice(o, o + n) for o, n in zip(off, rel.dist_shape))] for off in rel.offsets]
                  for p in probes]
        chain = ops and _cross_rank_chain(problem, d, read, ops, blocks, [probes] * mesh.size, dim, axis)
        if chain:
            out[s] = chain
    return out


def _cross_rank_chain(problem: Problem, src: int, out: int, ops: list[Op], given: list[list[np.ndarray]],
                      wholes: list[list[np.ndarray]], dim: int, axis: str) -> Chain | None:
    """The chain (gathered over `axis`'s groups, and a block when `out` is) when `ops`
    move the ranks' `src` blocks into `out` = the take of their concatenation along
    `dim` (on each rank the block at its coordinate, when out has its blocks' shape)
    by one permutation, no identity. `given[p][r]`: what rank r holds of probe p;
    `wholes[r][p]`: probe p's concatenation as rank r's group holds it. Returned only
    when its canonical form computes what `ops` compute on every rank on both
    probes; an all_reduce among `ops` must have one nonzero term per element
    (movement then: no probe element is 0)."""
    g, mesh = problem.dist, problem.mesh
    sub = Graph("probe", tensors=g.tensors, ops=ops, inputs=[src], outputs=[out])
    coords = lambda r, a: mesh.coords(r)[a]   # noqa: E731
    try:
        runs = [Interpreter(sub, mesh.size, coords).run([blocks]) for blocks in given]
    except (NotExecutable, KeyError):
        return None
    for op in ops:
        if op.kind == "all_reduce" and any(
                np.any(sum((runs[0][op.inputs[0]][m] != 0) | (runs[1][op.inputs[0]][m] != 0)
                           for m in grp) > 1) for grp in op.params["groups"]):
            return None
    sels = [_selection(wholes[r], [run[out][r] for run in runs], dim) for r in range(mesh.size)]
    if any(sel is None for sel in sels):
        return None
    n, rows = wholes[0][0].shape[dim], g.tensors[out].shape[dim]
    if rows == n and len(set(sels)) == 1:
        perm, block = sels[0], None
    else:
        by_coord: dict[int, set] = {}
        for r, sel in enumerate(sels):
            by_coord.setdefault(mesh.coords(r)[axis], set()).add(sel)
        if any(len(v) != 1 for v in by_coord.values()) or len(by_coord) * rows != n:
            return None
        perm, block = tuple(i for c in sorted(by_coord) for i in next(iter(by_coord[c]))), (axis, rows)
    if sorted(perm) != list(range(n)) or perm == tuple(range(n)):
        return None
    chain = Chain(src, out, dim, perm, ops, block, mesh.groups((axis,)))
    check = Graph("canonical", tensors=dict(g.tensors), ops=list(ops), inputs=[src], outputs=[out])
    canonical(check, chain, copy.copy(problem.ids))   # (ids past the problem's: none taken)
    try:
        again = [Interpreter(check, mesh.size, coords).run([blocks])[out] for blocks in given]
    except (NotExecutable, KeyError):
        return None
    same = all(np.array_equal(a[r], run[out][r]) for a, run in zip(again, runs) for r in range(mesh.size))
    return chain if same else None


def _block_shaped(got: tuple[int, ...], shape: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """got is shape with one dim divided by a mesh axis's size (a rank's block)."""
    cut = [j for j, (a, b) in enumerate(zip(got, shape)) if a != b]
    return len(got) == len(shape) and len(cut) == 1 and \
        any(n * got[cut[0]] == shape[cut[0]] for n in sizes)


def output_chain(g: Graph, out: int) -> Chain | None:
    """The distributed program's permutation of one dim just before output `out`:
    the earliest tensor of out's shape among out's data-movement ancestors (the
    gathered sequence) whose movement into out is such a permutation."""
    free, producer = input_free(g), g.producer()
    region, stack = [], [out]
    while stack and len(region) < 256:
        t = stack.pop()
        op = producer.get(t)
        if op is None or op.kind not in _MOVES or t in region:
            continue
        region.append(t)
        stack.extend(i for i in op.inputs if i not in free)
    shape = g.tensors[out].shape
    if int(np.prod(shape)) > PROBE_LIMIT:
        return None
    candidates = {i for t in region for i in producer[t].inputs if i not in free}
    for t in [op.output for op in g.ops if op.output in candidates] + \
            [i for i in g.inputs if i in candidates]:
        if g.tensors[t].shape != shape:
            continue
        moved = _movement_of(g, t, free)
        if out not in moved:
            continue
        ops = _slice_ops(g, t, out, moved, producer)
        found = ops and _as_permutation(shape, g.tensors[t].dtype,
                                         lambda p, t=t, ops=ops: _evaluate(g, t, out, ops, p))
        if found:
            return Chain(t, out, found[0], found[1], ops)
    return None


def gathered_output_chain(problem: Problem, out: int,
                          want: tuple[int, tuple[int, ...]] | None = None) -> Chain | None:
    """The un-permute of output `out` as XLA partitions a take along a sharded dim:
    the ranks' blocks (the rows at their coordinate along a mesh axis) moved across
    ranks into place, by collective_permutes and all_to_alls of rows, or each rank
    placing its block where the permutation sends it, zeros elsewhere, and an
    all_reduce summing the placements. `out` is then on every rank the take of the
    blocks' concatenation, or its block at the rank's coordinate when out has the
    blocks' shape (_cross_rank_chain). Evaluated on every rank at once, each rank
    given its own block of two probes (ranks that share a coordinate too: a rank
    reading a block its group does not hold is not read). With `want` (dim, perm),
    only a chain of that permutation: a ring's last pass moves blocks across ranks
    too, and a chain read from before it is another permutation (rotated)."""
    g, mesh = problem.dist, problem.mesh
    free, producer = input_free(g, rank=True), g.producer()
    region, stack = [], [out]
    while stack and len(region) < 256:
        t = stack.pop()
        op = producer.get(t)
        if op is None or t in region or op.kind not in _MOVES | _CROSS and op.kind != "all_reduce":
            continue
        region.append(t)
        stack.extend(i for i in op.inputs if i not in free)
    shape, dtype = g.tensors[out].shape, g.tensors[out].dtype
    if int(np.prod(shape)) * mesh.size > PROBE_LIMIT or \
            not any(producer[t].kind in _CROSS | {"all_reduce"} for t in region):
        return None
    candidates = {i for t in region for i in producer[t].inputs if i not in free}
    for t in [op.output for op in g.ops if op.output in candidates]:
        got = g.tensors[t].shape
        if got != shape and not _block_shaped(got, shape, mesh.axis_sizes):
            continue
        root = _moved_from(g, {t}, free, sums=True, cross=True)
        moved = {op.output: op for op in g.ops if op.output != t and root.get(op.output) == t}
        ops = _slice_ops(g, t, out, moved, producer) if out in moved else []
        cut = [j for j, (a, b) in enumerate(zip(got, shape)) if a != b]
        for dim in cut or range(len(shape)):
            for axis, n in zip(mesh.axis_names, mesh.axis_sizes):
                if not ops or n * got[dim] != (shape[dim] if cut else n * shape[dim]):
                    continue
                whole = tuple(mesh.size * k if j == dim else k for j, k in enumerate(got))
                probes = _probes(whole, dtype)
                if probes is None:
                    continue
                rows = got[dim]
                block = lambda p, m: np.take(p, range(m * rows, (m + 1) * rows), axis=dim)  # noqa: E731
                given = [[block(p, m) for m in range(mesh.size)] for p in probes]
                group = {m: grp for grp in mesh.groups((axis,)) for m in grp}
                wholes = [[np.concatenate([block(p, m) for m in group[r]], axis=dim) for p in probes]
                          for r in range(mesh.size)]
                chain = _cross_rank_chain(problem, t, out, ops, given, wholes, dim, axis)
                if chain is not None and (want is None or (chain.dim, chain.perm) == want):
                    return chain
    return None


def inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, j in enumerate(perm):
        inv[j] = i
    return tuple(inv)


def take_ops(b: GraphBuilder, x: Tensor, dim: int, perm: tuple[int, ...], like: Op,
             output: int | None = None) -> int:
    """Append `take(x, perm, axis=dim)`: a constant (n, 1) index array and an XLA
    gather of one row of dim `dim` per index (all in range: no fill)."""
    idx = b.constant(np.asarray(perm, np.int32).reshape(-1, 1), (len(perm), 1), "int32",
                     like.loc, like.name)
    sizes = tuple(1 if j == dim else n for j, n in enumerate(x.shape))
    params = {"offset_dims": tuple(j for j in range(len(x.shape)) if j != dim),
              "collapsed_slice_dims": (dim,), "start_index_map": (dim,),
              "operand_batching_dims": (), "start_indices_batching_dims": (),
              "index_vector_dim": 1, "slice_sizes": sizes, "indices_are_sorted": False}
    return b.op("gather", [x.id, idx], x.shape, x.dtype, params, like.loc, like.name, output)


def canonical(g: Graph, chain: Chain, ids: IdAllocator) -> None:
    """The distributed chain's result computed by the one gather the sequential
    program now has (the same value: the chain is that permutation; for a per-rank
    pick, the rank's block of it, by a dynamic_slice at coordinate * rows; for the
    ranks' blocks put in order, the gather of their all_gather, then the rank's block
    of it when the chain's result is one), so that the two sides hold the same op;
    the chain's other ops are left dead."""
    at = next(i for i, op in enumerate(g.ops) if op.output == chain.out)
    like = g.ops[at]
    new: list[Op] = []
    b = GraphBuilder(Graph(g.name, tensors=g.tensors, ops=new), ids)
    x = g.tensors[chain.src]
    if chain.gathered is not None:     # the blocks concatenated, then the take
        shape = tuple(n * len(chain.gathered[0]) if j == chain.dim else n for j, n in enumerate(x.shape))
        x = g.tensors[b.op("all_gather", [x.id], shape, x.dtype,
                           {"dimension": chain.dim, "groups": chain.gathered}, like.loc, like.name)]
    if chain.block is None:
        take_ops(b, x, chain.dim, chain.perm, like, chain.out)
    else:
        axis, rows = chain.block
        whole = take_ops(b, x, chain.dim, chain.perm, like)
        coord = b.op("axis_index", [], (), "int32", {"axis": axis}, like.loc, "axis_index")
        step = b.constant(np.asarray(rows, np.int32), (), "int32", like.loc)
        zero = b.constant(np.asarray(0, np.int32), (), "int32", like.loc)
        start = b.op("mul", [coord, step], (), "int32", {}, like.loc, like.name)
        starts = [start if j == chain.dim else zero for j in range(len(x.shape))]
        out = g.tensors[chain.out]
        b.op("dynamic_slice", [whole] + starts, out.shape, out.dtype,
             {"slice_sizes": out.shape}, like.loc, like.name, chain.out)
    g.ops[at:at + 1] = new
