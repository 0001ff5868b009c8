"""A sequence the distributed program permutes before sharding it: the sequential
program rewritten to compute in the permuted order.

Load-balanced context parallelism (Megatron-LM's CP, ring-flash-attention's zigzag,
MaxText's `context_parallel_load_balance`) reorders the sequence before sharding it
(rank r holds chunks r and 2*CP-1-r) and restores the order of the outputs after.
No rank then holds a box of the sequential tensors: its rows are two chunks apart.
In the permuted order they are one box. So the sequential program S is rewritten
into the same program on the permuted inputs, S' = pi^-1 . S~ . pi, where

* pi is the distributed program's own permutation of an input, read from its ops
  (reshapes, gathers, selects, slices, concatenations of the replicated input and
  of constants: pure data movement, the permutation evaluated by the shared
  evaluator on two probes of distinct values); both programs then compute it by
  one gather of constant indices (the distributed ops replaced by the value they
  were proved to compute), so that the rules meet the same op on both sides. A
  pick of rows that depends on the rank (Megatron's get_batch_on_this_cp_rank:
  each rank takes its chunks of the replicated sequence) is read the same way,
  evaluated on every rank: when rank r's rows are, for every r, the block at its
  coordinate along a mesh axis of one permutation, the pick becomes that gather
  and a dynamic_slice at coordinate * rows;
* S~ is every op of S on permuted operands, with its output permuted along the
  dims that carry the permuted one (the dims linked to it through the ops: one
  class per permuted input dim, a union-find over (tensor, dim));
* pi^-1 is appended to every output with a permuted dim, as a gather too (where
  the distributed program's un-permute of that output evaluates to pi^-1, that is
  replaced by the same gather; otherwise the appended one is located at the
  distributed output, where the un-permute is missing or wrong).

S' = S for every input because every op of S~ is equivariant under the
permutation of its linked dims: elementwise ops and selects act position by
position; broadcast_in_dim, transpose and reshapes that keep the dim whole move
it; a dot_general contracting two linked dims sums the same products in another
order (sum_k a[p(k)] b[p(k)] = sum_k a[k] b[k]), its free and batch dims move; a
sum, max, min, product, and or xor over a linked dim is order-free. A source that
varies along a linked dim (an iota: the positions of a causal mask; a constant
array) is permuted explicitly (slices of its runs, concatenated). Any other op on a
linked dim (a slice, a cumsum, an argmax, a gather, a reshape that merges the dim
...) leaves the program as it is: the rewrite is all or nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlverify.interpret import Interpreter, NotExecutable
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op, Tensor
from dlverify.layout_algebra import reshape_chain
from dlverify.ops import KINDS, Family, exact_dtype
from dlverify.problem import Problem

# reductions whose value does not depend on the order of the reduced elements
_ORDER_FREE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
               "reduce_or", "reduce_xor"}
# data movement the permutation of an input may be built from (operand 0 the data;
# the other operands, indices and masks, must not depend on any input)
_MOVES = {"reshape", "gather", "select_n", "slice", "concatenate", "transpose", "rev",
          "broadcast_in_dim"}
_REWRITTEN = "the sequential program was rewritten to compute in the order the distributed program"
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


# ---------------------------------------------------------------- reading a permutation

def _input_free(g: Graph, rank: bool = False) -> set[int]:
    """Tensors of g computed from no input (and, unless `rank`, no rank coordinate)."""
    free: set[int] = set()
    sources = ("custom_call", "rng_bit_generator") + (() if rank else ("axis_index",))
    for op in g.ops:
        if op.kind not in sources and \
                KINDS[op.kind].family is not Family.COLLECTIVE and all(i in free for i in op.inputs):
            if op.kind != "constant" or op.params.get("value") is not None:
                free.add(op.output)
    return free


def _moved_from(g: Graph, roots: set[int], free: set[int]) -> dict[int, int]:
    """For each tensor that is data movement of one root alone, that root: the data
    operands moved from it (or input-free), every other operand input-free, so where
    each element lands depends on no input's values. One pass over the ops."""
    root = {t: t for t in roots}
    for op in g.ops:
        if op.kind not in _MOVES or not op.inputs:
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


def _slice_ops(g: Graph, src: int, out: int, moved: dict[int, Op]) -> list[Op]:
    """The ops computing `out` from `src` and input-free values, in program order."""
    producer = g.producer()
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
    the last tensor of the replica's movement that is a permutation of one dim."""
    g, free = problem.dist, _input_free(problem.dist)
    pairs = [(s, d) for s, d, rel in zip(problem.seq.inputs, g.inputs, problem.inputs)
             if rel.is_replicated() and not any(any(o) for o in rel.offsets)
             and int(np.prod(g.tensors[d].shape)) <= PROBE_LIMIT]
    root = _moved_from(g, {d for _, d in pairs}, free)
    by_root: dict[int, dict[int, Op]] = {d: {} for _, d in pairs}
    for op in g.ops:
        if op.output in root and root[op.output] != op.output:
            by_root[root[op.output]][op.output] = op      # (in program order)
    out: dict[int, Chain] = {}
    for s, d in pairs:
        shape = g.tensors[d].shape
        moved = by_root[d]
        for t in reversed(list(moved)):
            if g.tensors[t].shape != shape:
                continue
            ops = _slice_ops(g, d, t, moved)
            found = ops and _as_permutation(shape, g.tensors[d].dtype,
                                             lambda p: _evaluate(g, d, t, ops, p))
            if found:
                out[s] = Chain(d, t, found[0], found[1], ops)
                break
    known = _input_free(g, rank=True)
    rest = [(s, d) for s, d in pairs if s not in out]
    root = _moved_from(g, {d for _, d in rest}, known)
    picked: dict[int, dict[int, Op]] = {d: {} for _, d in rest}
    for op in g.ops:
        if op.output in root and root[op.output] != op.output:
            picked[root[op.output]][op.output] = op
    for s, d in rest:
        for t in reversed(list(picked[d])):
            ops = _slice_ops(g, d, t, picked[d])
            found = ops and _rank_pick(problem, d, t, ops)
            if found:
                dim, perm, axis, rows = found
                out[s] = Chain(d, t, dim, perm, ops, (axis, rows))
                break
    return out


def output_chain(g: Graph, out: int) -> Chain | None:
    """The distributed program's permutation of one dim just before output `out`:
    the earliest tensor of out's shape among out's data-movement ancestors (the
    gathered sequence) whose movement into out is such a permutation."""
    free, producer = _input_free(g), g.producer()
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
        ops = _slice_ops(g, t, out, moved)
        found = ops and _as_permutation(shape, g.tensors[t].dtype,
                                         lambda p, t=t, ops=ops: _evaluate(g, t, out, ops, p))
        if found:
            return Chain(t, out, found[0], found[1], ops)
    return None


# ---------------------------------------------------------------- the dims a permutation reaches

class _Dims:
    """Union-find over (tensor, dim): dims an op ties together, so that permuting
    one permutes the others; `blocked` dims are read by an op that is not
    equivariant in them."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.blocked: dict[tuple[int, int], Op] = {}

    def find(self, x: tuple[int, int]) -> tuple[int, int]:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def link(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

    def block(self, op: Op, t: int, shape: tuple[int, ...], dims=None) -> None:
        for j in (range(len(shape)) if dims is None else dims):
            if shape[j] > 1:
                self.blocked.setdefault((t, j), op)


def _link_op(u: _Dims, g: Graph, op: Op) -> None:
    """Tie the dims `op` moves position for position; block the ones it mixes."""
    shape = lambda t: g.tensors[t].shape   # noqa: E731
    out, oshape, p = op.output, shape(op.output), op.params
    family = KINDS[op.kind].family
    if family is Family.ELEMENTWISE:
        for t in op.inputs:
            if shape(t) == oshape:
                for j in range(len(oshape)):
                    u.link((t, j), (out, j))
            elif shape(t):           # (a scalar operand has no dim to tie)
                u.block(op, t, shape(t))
                u.block(op, out, oshape)
    elif op.kind == "broadcast_in_dim":
        for i, j in enumerate(p["broadcast_dimensions"]):
            if shape(op.inputs[0])[i] == oshape[j]:
                u.link((op.inputs[0], i), (out, j))
    elif op.kind == "transpose":
        for j, i in enumerate(p["permutation"]):
            u.link((op.inputs[0], i), (out, j))
    elif op.kind == "reshape":
        src = shape(op.inputs[0])
        groups = reshape_chain(src, oshape)
        if groups is None:
            u.block(op, op.inputs[0], src)
            u.block(op, out, oshape)
            return
        for gr in groups:
            big_i = [i for i in range(gr.i0, gr.i1) if src[i] > 1]
            big_j = [j for j in range(gr.j0, gr.j1) if oshape[j] > 1]
            if len(big_i) == 1 and len(big_j) == 1 and src[big_i[0]] == oshape[big_j[0]]:
                u.link((op.inputs[0], big_i[0]), (out, big_j[0]))
            else:
                u.block(op, op.inputs[0], src, big_i)
                u.block(op, out, oshape, big_j)
    elif op.kind in _ORDER_FREE and len(op.inputs) == 1:
        kept = [i for i in range(len(shape(op.inputs[0]))) if i not in p["axes"]]
        for j, i in enumerate(kept):
            u.link((op.inputs[0], i), (out, j))
    elif op.kind == "dot_general":
        lhs, rhs = op.inputs
        for a, b in zip(p["lhs_contract"], p["rhs_contract"]):
            u.link((lhs, a), (rhs, b))
        j = 0
        for a, b in zip(p["lhs_batch"], p["rhs_batch"]):
            u.link((lhs, a), (out, j))
            u.link((rhs, b), (out, j))
            j += 1
        for t, skip in ((lhs, set(p["lhs_contract"]) | set(p["lhs_batch"])),
                        (rhs, set(p["rhs_contract"]) | set(p["rhs_batch"]))):
            for i in range(len(shape(t))):
                if i not in skip:
                    u.link((t, i), (out, j))
                    j += 1
    elif op.kind in ("iota", "constant"):
        pass            # a source: permuted explicitly when it varies along a permuted dim
    else:
        for t in op.inputs:
            u.block(op, t, shape(t))
        u.block(op, out, oshape)


def _runs(perm: tuple[int, ...]) -> list[tuple[int, int]]:
    """perm as maximal runs [a, b) of consecutive indices, in order."""
    runs = [[perm[0], perm[0] + 1]]
    for i in perm[1:]:
        if i == runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([i, i + 1])
    return [(a, b) for a, b in runs]


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, j in enumerate(perm):
        inv[j] = i
    return tuple(inv)


class _Builder:
    """Appends the rewritten sequential ops."""

    def __init__(self, g: Graph, ids: IdAllocator) -> None:
        self.g = g
        self.ops: list[Op] = []
        self.b = GraphBuilder(Graph(g.name, tensors=g.tensors, ops=self.ops), ids)

    def permute(self, t: int, dim: int, perm: tuple[int, ...], like: Op) -> int:
        """take(t, perm, axis=dim) as slices of perm's runs and a concatenate."""
        shape, dtype = self.g.tensors[t].shape, self.g.tensors[t].dtype
        pieces = []
        for a, b in _runs(perm):
            start = [0] * len(shape)
            limit = list(shape)
            start[dim], limit[dim] = a, b
            piece = tuple(limit[j] - start[j] for j in range(len(shape)))
            pieces.append(self.b.op("slice", [t], piece, dtype,
                                    {"start_indices": tuple(start), "limit_indices": tuple(limit),
                                     "strides": (1,) * len(shape)}, like.loc, like.name))
        if len(pieces) == 1:
            return pieces[0]
        return self.b.op("concatenate", pieces, shape, dtype, {"dimension": dim}, like.loc, like.name)

    def gather(self, t: int, dim: int, perm: tuple[int, ...], like: Op) -> int:
        """take(t, perm, axis=dim) as one gather of constant indices."""
        return take_ops(self.b, self.g.tensors[t], dim, perm, like)


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


# ---------------------------------------------------------------- the rewrite

def permute_sequence(problem: Problem) -> bool:
    """Rewrite problem.seq into the same function computed in the order the
    distributed program permutes its inputs into (module docstring). Returns
    whether it did; it does nothing unless every op on a permuted dim is
    equivariant and every input with a permuted dim has the distributed
    program's permutation (a note says why not, when the distributed program
    reorders an input)."""
    seq = problem.seq
    if any(n.startswith(_REWRITTEN) for n in problem.notes):
        return False      # done already (its gathers would now read as a reorder of their own)
    if problem.scans:
        return False      # a scan verified by induction reads its body's seeds as they are
    produced = set(seq.inputs) | {op.output for op in seq.ops}
    if any(t not in produced for op in seq.ops for t in op.inputs):
        return False      # a value no op computes here (a scan summary's placeholder)
    chains = input_chains(problem)
    if not chains:
        return False
    u = _Dims()
    for op in seq.ops:
        _link_op(u, seq, op)
    names = dict(zip(seq.inputs, seq.input_names))
    perm_of: dict[tuple[int, int], tuple[int, ...]] = {}
    for s, ch in chains.items():
        root = u.find((s, ch.dim))
        if perm_of.setdefault(root, ch.perm) != ch.perm:
            return _refuse(problem, chains, f"{names.get(s, s)} is reordered unlike an input "
                                            f"whose dim meets its dim {ch.dim}")
    permuted = lambda t, j: perm_of.get(u.find((t, j)))   # noqa: E731
    for (t, j), op in u.blocked.items():
        if permuted(t, j) is not None:
            return _refuse(problem, chains, f"the sequential {op.kind} at {op.loc.file}:"
                                            f"{op.loc.line} depends on the order of a reordered dim")
    for s in seq.inputs:
        for j in range(len(seq.tensors[s].shape)):
            if permuted(s, j) is not None and (s not in chains or chains[s].dim != j):
                return _refuse(problem, chains, f"{names.get(s, s)} dim {j} meets a reordered "
                                                f"dim but the distributed program does not reorder it")
    for op in seq.ops:
        if op.kind == "constant" and op.params.get("value") is None and \
                any(permuted(op.output, j) for j in range(len(seq.tensors[op.output].shape))):
            return _refuse(problem, chains, f"the constant at {op.loc.file}:{op.loc.line}, "
                                            f"along a reordered dim, has no known value")
    return _rebuild(problem, chains, permuted)


def _refuse(problem: Problem, chains: dict[int, Chain], why: str) -> bool:
    names = dict(zip(problem.seq.inputs, problem.seq.input_names))
    problem.notes.append(
        "the distributed program reorders " + ", ".join(f"{names.get(s, s)} dim {ch.dim}"
                                                        for s, ch in chains.items()) +
        f", but the sequential program was not rewritten into that order: {why}")
    return False


def _rebuild(problem: Problem, chains: dict[int, Chain], permuted) -> bool:
    seq, dist = problem.seq, problem.dist
    b = _Builder(seq, problem.ids)
    env: dict[int, int] = {}
    for s, ch in chains.items():
        env[s] = b.gather(s, ch.dim, ch.perm, ch.ops[-1])
        _canonical(dist, ch, problem.ids)
    for op in seq.ops:
        shape = seq.tensors[op.output].shape
        dims = [(j, permuted(op.output, j)) for j in range(len(shape))]
        dims = [(j, pm) for j, pm in dims if pm is not None]
        inputs = [env.get(i, i) for i in op.inputs]
        if not dims:                      # its value is unchanged: the op reads the new operands
            op.inputs = inputs
            b.ops.append(op)
            continue
        if op.kind in ("iota", "constant"):
            b.ops.append(op)
            t = op.output
            for j, pm in dims:
                if _varies_along(op, j):
                    t = b.permute(t, j, pm, op)
            env[op.output] = t
            continue
        env[op.output] = b.b.op(op.kind, inputs, shape, seq.tensors[op.output].dtype,
                                dict(op.params), op.loc, op.name)
    outputs = []
    dist_prod = dist.producer()
    restored = False
    for i, o in enumerate(seq.outputs):
        t = env.get(o, o)
        for j in range(len(seq.tensors[o].shape)):
            pm = permuted(o, j)
            if pm is None:
                continue
            restored = True
            back = output_chain(dist, dist.outputs[i]) if i < len(dist.outputs) else None
            if back is not None and back.dim == j and back.perm == _inverse(pm):
                t = b.gather(t, j, back.perm, back.ops[-1])
                _canonical(dist, back, problem.ids)
            else:   # located where the distributed program returns the output: the
                # un-permute it lacks (or gets wrong) belongs there
                at = dist_prod.get(dist.outputs[i]) if i < len(dist.outputs) else None
                t = b.gather(t, j, _inverse(pm), at or _producer_or_any(seq, o))
        outputs.append(t)
    seq.ops[:] = b.ops
    seq.outputs[:] = outputs
    names = dict(zip(seq.inputs, seq.input_names))
    problem.notes.append(
        _REWRITTEN + " reorders its inputs into (" + ", ".join(f"{names.get(s, s)} dim {ch.dim}"
                                                 for s, ch in chains.items()) + ")" +
        (", its outputs put back in the natural order" if restored else "") +
        " (dlverify/sequence_permutation.py)")
    return True


def _canonical(g: Graph, chain: Chain, ids: IdAllocator) -> None:
    """The distributed chain's result computed by the one gather the sequential
    program now has (the same value: the chain is that permutation; for a per-rank
    pick, the rank's block of it, by a dynamic_slice at coordinate * rows), so that
    the two sides hold the same op; the chain's other ops are left dead."""
    at = next(i for i, op in enumerate(g.ops) if op.output == chain.out)
    like = g.ops[at]
    new: list[Op] = []
    b = GraphBuilder(Graph(g.name, tensors=g.tensors, ops=new), ids)
    x = g.tensors[chain.src]
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


def _varies_along(op: Op, j: int) -> bool:
    """Whether source op's value (an iota, a known constant) may differ along dim j."""
    if op.kind == "iota":
        return op.params["dimension"] == j
    value = np.asarray(op.params["value"])
    return value.ndim > j and value.shape[j] > 1 and bool(np.any(np.diff(value, axis=j) != 0))


def _producer_or_any(g: Graph, t: int) -> Op:
    """An op to take a source location from for ops appended at output t."""
    prod = g.producer().get(t)
    return prod if prod is not None else g.ops[-1]
