"""A sequence the distributed program permutes before sharding it: the sequential
program rewritten to compute in the permuted order.

Load-balanced context parallelism (Megatron-LM's CP, ring-flash-attention's zigzag,
MaxText's `context_parallel_load_balance`) reorders the sequence before sharding it
(rank r holds chunks r and 2*CP-1-r) and restores the order of the outputs after.
No rank then holds a box of the sequential tensors: its rows are two chunks apart.
In the permuted order they are one box. So the sequential program S is rewritten
into the same program on the permuted inputs, S' = pi^-1 . S~ . pi, where

* pi is the distributed program's own permutation of an input, read from its ops
  by dlverify/reorders.py (pure data movement of the replicated input, evaluated
  exactly; or a pick of its rows by each rank that is the rank's block of one
  permutation; or, for an input held in blocks, their movement across ranks into
  each rank's block of one permutation); both programs then compute it by one
  gather of constant indices
  (the distributed ops replaced by the value they were proved to compute, with a
  dynamic_slice of the rank's block for a pick), so that the rules meet the same
  op on both sides;
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
array; an input-free value another op makes, such as a linspace's concatenate) is
permuted explicitly (slices of its runs, concatenated). Any other op on a
linked dim (a slice, a cumsum, an argmax, a gather, a reshape that merges the dim
...) leaves the program as it is: the rewrite is all or nothing.
"""
from __future__ import annotations

import numpy as np

from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op
from dlverify.layout_algebra import reshape_chain
from dlverify.ops import KINDS, Family
from dlverify.problem import Problem
from dlverify.reorders import (Chain, canonical, gathered_output_chain, input_chains, input_free,
                               inverse, output_chain, take_ops)

# reductions whose value does not depend on the order of the reduced elements
_ORDER_FREE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
               "reduce_or", "reduce_xor"}
_REWRITTEN = "the sequential program was rewritten to compute in the order the distributed program"
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


def _is_source(g: Graph, op: Op, free: set[int]) -> bool:
    """An op whose value is permuted explicitly where a permuted dim needs it: an
    iota, a constant, or an input-free value made by an op other than an
    elementwise one, a broadcast, a transpose or a reshape that keeps its dims
    (a linspace's concatenate); the ops before it keep their order. (Positions
    permuted once, at their iota, reach a rotary table and a causal mask as one
    tensor, as the distributed program's reach both.)"""
    return op.kind in ("iota", "constant") or op.output in free and not (
        KINDS[op.kind].family is Family.ELEMENTWISE or op.kind in ("broadcast_in_dim", "transpose")
        or op.kind == "reshape" and _keeps_dims(g.tensors[op.inputs[0]].shape, g.tensors[op.output].shape))


def _keeps_dims(src: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """A reshape from src to out only inserts or drops size-1 dims."""
    return [n for n in src if n != 1] == [n for n in out if n != 1]


def _link_op(u: _Dims, g: Graph, op: Op, free: set[int]) -> None:
    """Tie the dims `op` moves position for position; block the ones it mixes."""
    shape = lambda t: g.tensors[t].shape   # noqa: E731
    out, oshape, p = op.output, shape(op.output), op.params
    family = KINDS[op.kind].family
    if _is_source(g, op, free):
        return            # permuted explicitly where a permuted dim needs it
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
    elif op.kind in ("slice", "rev", "pad", "concatenate"):
        # data movement along some dims copies the others whole, index for index
        for j in _untouched(op, shape(op.inputs[0]), oshape):
            for t in op.inputs[:1] if op.kind == "pad" else op.inputs:
                u.link((t, j), (out, j))
        moved = [j for j in range(len(oshape)) if j not in _untouched(op, shape(op.inputs[0]), oshape)]
        for t in op.inputs[:1] if op.kind == "pad" else op.inputs:
            u.block(op, t, shape(t), moved)
        u.block(op, out, oshape, moved)
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
    else:
        for t in op.inputs:
            u.block(op, t, shape(t))
        u.block(op, out, oshape)


def _untouched(op: Op, src: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    """The dims a slice, rev, pad or concatenate copies whole and in order."""
    p = op.params
    if op.kind == "slice":
        strides = p.get("strides") or (1,) * len(src)
        return [j for j in range(len(src)) if p["start_indices"][j] == 0
                and p["limit_indices"][j] == src[j] and strides[j] == 1]
    if op.kind == "rev":
        return [j for j in range(len(src)) if j not in p["dimensions"]]
    if op.kind == "pad":
        return [j for j, c in enumerate(p["padding_config"]) if tuple(c) == (0, 0, 0)]
    return [j for j in range(len(out)) if j != p["dimension"]]


def _runs(perm: tuple[int, ...]) -> list[tuple[int, int]]:
    """perm as maximal runs [a, b) of consecutive indices, in order."""
    runs = [[perm[0], perm[0] + 1]]
    for i in perm[1:]:
        if i == runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([i, i + 1])
    return [(a, b) for a, b in runs]


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

    def permute_iota(self, op: Op, perm: tuple[int, ...]) -> int:
        """An iota permuted along the dim it counts along, d: the permuted 1-D iota of
        that dim's length, broadcast along d (iota(shape, d) is that broadcast, and a
        broadcast moves its operand's dim to d). The form a program that broadcasts
        its positions has, whose 1-D positions the distributed program permutes too;
        an optimiser builds the multi-dim iota directly (a causal mask's)."""
        shape, dtype = self.g.tensors[op.output].shape, self.g.tensors[op.output].dtype
        d = op.params["dimension"]
        line = self.b.op("iota", [], (shape[d],), dtype, {"dimension": 0}, op.loc, op.name)
        line = self.permute(line, 0, perm, op)
        if len(shape) == 1:
            return line
        return self.b.op("broadcast_in_dim", [line], shape, dtype, {"broadcast_dimensions": (d,)},
                         op.loc, op.name)

    def gather(self, t: int, dim: int, perm: tuple[int, ...], like: Op) -> int:
        """take(t, perm, axis=dim) as one gather of constant indices."""
        return take_ops(self.b, self.g.tensors[t], dim, perm, like)


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
    u, free = _Dims(), input_free(seq)
    for op in seq.ops:
        _link_op(u, seq, op, free)
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
    return _rebuild(problem, chains, permuted, free)


def _refuse(problem: Problem, chains: dict[int, Chain], why: str) -> bool:
    names = dict(zip(problem.seq.inputs, problem.seq.input_names))
    problem.notes.append(
        "the distributed program reorders " + ", ".join(f"{names.get(s, s)} dim {ch.dim}"
                                                        for s, ch in chains.items()) +
        f", but the sequential program was not rewritten into that order: {why}")
    return False


def _rebuild(problem: Problem, chains: dict[int, Chain], permuted, free: set[int]) -> bool:
    seq, dist = problem.seq, problem.dist
    b = _Builder(seq, problem.ids)
    env: dict[int, int] = {}
    for s, ch in chains.items():
        env[s] = b.gather(s, ch.dim, ch.perm, ch.ops[-1])
        canonical(dist, ch, problem.ids)
    for op in seq.ops:
        shape = seq.tensors[op.output].shape
        dims = [(j, permuted(op.output, j)) for j in range(len(shape))]
        dims = [(j, pm) for j, pm in dims if pm is not None]
        if op.output in free:             # its own value stays, in the natural order
            b.ops.append(op)
        if not dims:                      # its value is unchanged: the op reads the new operands
            if op.output not in free:
                op.inputs = [env.get(i, i) for i in op.inputs]
                b.ops.append(op)
            continue
        if _is_source(seq, op, free):
            t = op.output
            for j, pm in dims:
                if _varies_along(op, j):
                    t = b.permute_iota(op, pm) if op.kind == "iota" else b.permute(t, j, pm, op)
            env[op.output] = t
            continue
        env[op.output] = b.b.op(op.kind, [env.get(i, i) for i in op.inputs], shape,
                                seq.tensors[op.output].dtype, dict(op.params), op.loc, op.name)
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
            back = None if i >= len(dist.outputs) else \
                output_chain(dist, dist.outputs[i]) or \
                gathered_output_chain(problem, dist.outputs[i], (j, inverse(pm)))
            if back is not None and back.dim == j and back.perm == inverse(pm):
                t = b.gather(t, j, back.perm, back.ops[-1])
                canonical(dist, back, problem.ids)
            else:   # located where the distributed program returns the output: the
                # un-permute it lacks (or gets wrong) belongs there
                at = dist_prod.get(dist.outputs[i]) if i < len(dist.outputs) else None
                t = b.gather(t, j, inverse(pm), at or _producer_or_any(seq, o))
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


def _varies_along(op: Op, j: int) -> bool:
    """Whether source op's value (an iota, a known constant, another input-free
    value) may differ along dim j."""
    if op.kind == "iota":
        return op.params["dimension"] == j
    if op.kind != "constant":
        return True
    value = np.asarray(op.params["value"])
    return value.ndim > j and value.shape[j] > 1 and bool(np.any(np.diff(value, axis=j) != 0))


def _producer_or_any(g: Graph, t: int) -> Op:
    """An op to take a source location from for ops appended at output t."""
    prod = g.producer().get(t)
    return prod if prod is not None else g.ops[-1]
