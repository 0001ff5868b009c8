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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlverify.interpret import Interpreter, NotExecutable
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op, Tensor
from dlverify.ops import KINDS, Family, exact_dtype
from dlverify.problem import Problem

# data movement the permutation of an input may be built from (operand 0 the data;
# the other operands, indices and masks, must not depend on any input)
_MOVES = {"reshape", "gather", "select_n", "slice", "concatenate", "transpose", "rev",
          "broadcast_in_dim"}
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
    sources = ("custom_call", "rng_bit_generator") + (() if rank else ("axis_index",))
    for op in g.ops:
        if op.kind not in sources and \
                KINDS[op.kind].family is not Family.COLLECTIVE and all(i in free for i in op.inputs):
            if op.kind != "constant" or op.params.get("value") is not None:
                free.add(op.output)
    return free


def _moved_from(g: Graph, roots: set[int], free: set[int], sums: bool = False) -> dict[int, int]:
    """For each tensor that is data movement of one root alone, that root: the data
    operands moved from it (or input-free), every other operand input-free, so where
    each element lands depends on no input's values. One pass over the ops. With
    `sums`, an all_reduce sum counts too: it is movement where each element has one
    nonzero term, which the caller checks (gathered_output_chain)."""
    root = {t: t for t in roots}
    for op in g.ops:
        if not op.inputs or op.kind not in _MOVES and not (
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
    return out


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


def gathered_output_chain(problem: Problem, out: int) -> Chain | None:
    """The un-permute of output `out` as XLA partitions a take along a sharded dim:
    each rank places its block (the rows at its coordinate along a mesh axis) where
    the permutation sends them, zeros elsewhere, and an all_reduce sums the
    placements. Evaluated on every rank at once, each rank given its block of two
    probes. Movement yields constants or elements x[j], and no probe element is 0,
    so when every element of an all_reduce's operand is nonzero on one member of its
    group at most, the sum is movement too; `out` is then on every rank the take of
    the blocks' concatenation that the probes show. The groups must be the axis's, so
    ranks that share the coordinate (given one block) are never summed together."""
    g, mesh = problem.dist, problem.mesh
    free, producer = input_free(g, rank=True), g.producer()
    region, stack = [], [out]
    while stack and len(region) < 256:
        t = stack.pop()
        op = producer.get(t)
        if op is None or t in region or op.kind not in _MOVES and op.kind != "all_reduce":
            continue
        region.append(t)
        stack.extend(i for i in op.inputs if i not in free)
    shape, dtype = g.tensors[out].shape, g.tensors[out].dtype
    probes = _probes(shape, dtype)
    if probes is None or int(np.prod(shape)) > PROBE_LIMIT or \
            not any(producer[t].kind == "all_reduce" for t in region):
        return None
    candidates = {i for t in region for i in producer[t].inputs if i not in free}
    for t in [op.output for op in g.ops if op.output in candidates]:
        got = g.tensors[t].shape
        if not _block_shaped(got, shape, mesh.axis_sizes):
            continue
        root = _moved_from(g, {t}, free, sums=True)
        moved = {op.output: op for op in g.ops if op.output != t and root.get(op.output) == t}
        ops = _slice_ops(g, t, out, moved, producer) if out in moved else []
        dim = next(j for j, (a, b) in enumerate(zip(got, shape)) if a != b)
        for axis, n in zip(mesh.axis_names, mesh.axis_sizes):
            if ops and n * got[dim] == shape[dim]:
                perm = _gathered_selection(problem, t, out, ops, probes, dim, axis)
                if perm is not None:
                    return Chain(t, out, dim, perm, ops, (axis, got[dim]), mesh.groups((axis,)))
    return None


def _gathered_selection(problem: Problem, t: int, out: int, ops: list[Op], probes: list[np.ndarray],
                        dim: int, axis: str) -> tuple[int, ...] | None:
    """perm when `out` is, on every rank, take(concatenated blocks, perm, axis=dim) for
    rank-held blocks `t` (gathered_output_chain), no identity; else None."""
    g, mesh = problem.dist, problem.mesh
    rows = g.tensors[t].shape[dim]
    groups = {frozenset(grp) for grp in mesh.groups((axis,))}
    if any(op.kind == "all_reduce" and {frozenset(grp) for grp in op.params["groups"]} != groups
           for op in ops):
        return None
    sub = Graph("probe", tensors=g.tensors, ops=ops, inputs=[t], outputs=[out])
    coord = lambda r: mesh.coords(r)[axis]   # noqa: E731
    try:
        runs = [Interpreter(sub, mesh.size, lambda r, a: mesh.coords(r)[a]).run(
            [[np.take(p, range(coord(r) * rows, (coord(r) + 1) * rows), axis=dim)
              for r in range(mesh.size)]]) for p in probes]
    except (NotExecutable, KeyError):
        return None
    for op in ops:
        if op.kind != "all_reduce":
            continue
        x = op.inputs[0]
        for grp in groups:     # one nonzero term per element, on either probe
            if np.any(sum((runs[0][x][m] != 0) | (runs[1][x][m] != 0) for m in grp) > 1):
                return None
    sels = {_selection(probes, [run[out][r] for run in runs], dim) for r in range(mesh.size)}
    sel = sels.pop() if len(sels) == 1 else None
    if sel is None or sorted(sel) != list(range(len(sel))) or sel == tuple(range(len(sel))):
        return None
    return sel


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
    ranks' blocks put back in order, the gather of their all_gather), so that the two
    sides hold the same op; the chain's other ops are left dead."""
    at = next(i for i, op in enumerate(g.ops) if op.output == chain.out)
    like = g.ops[at]
    new: list[Op] = []
    b = GraphBuilder(Graph(g.name, tensors=g.tensors, ops=new), ids)
    x = g.tensors[chain.src]
    if chain.gathered is not None:     # the blocks concatenated, then the take
        whole = b.op("all_gather", [x.id], g.tensors[chain.out].shape, x.dtype,
                     {"dimension": chain.dim, "groups": chain.gathered}, like.loc, like.name)
        take_ops(b, g.tensors[whole], chain.dim, chain.perm, like, chain.out)
    elif chain.block is None:
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
