"""Graph passes run before export: sharing of identical constants, and folding
of values known before run time (constants and the rank coordinates that
`axis_index` reads), per rank.

Folding is plain evaluation of the program on known values, so it is exact:
rank-dependent scalars (dynamic-slice starts, position offsets) become per-rank
integers, and tensors holding one value everywhere ("splats") are recorded with
that value so the rules can match constants without enumerating elements.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dlverify.ir import Graph, Mesh

SMALL = 64  # arrays up to this many elements are folded in full


def share_nullary(graph: Graph) -> None:
    """Merge constants with identical value and iotas with identical params, so
    every distinct constant is one tensor (keeps constant matching linear)."""
    seen: dict[tuple, int] = {}
    alias: dict[int, int] = {}
    kept = []
    for op in graph.ops:
        key = None
        t = graph.tensors[op.output]
        if op.kind == "constant" and op.params.get("value") is not None:
            v = np.asarray(op.params["value"])
            if v.size <= 1 << 16:
                key = ("c", t.shape, t.dtype, v.tobytes())
        elif op.kind == "iota":
            key = ("i", t.shape, t.dtype, op.params["dimension"])
        if key is not None and key in seen:
            alias[op.output] = seen[key]
            continue
        if key is not None:
            seen[key] = op.output
        op.inputs = [alias.get(i, i) for i in op.inputs]
        kept.append(op)
    graph.ops = kept
    graph.outputs = [alias.get(o, o) for o in graph.outputs]


@dataclass
class Folded:
    """Values known before run time. `small[t][r]` is the full array of tensor t
    on rank r; `splat[t][r]` the single value t holds everywhere on rank r.
    Sequential graphs have one "rank", 0."""

    ranks: int
    small: dict[int, list[np.ndarray]] = field(default_factory=dict)
    splat: dict[int, list[float]] = field(default_factory=dict)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.trunc(np.asarray(a, dtype=np.float64) / np.asarray(b, dtype=np.float64))
    return q.astype(np.result_type(a, b))


_ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative,
    "max": np.maximum, "min": np.minimum, "abs": np.abs, "sign": np.sign,
    "floor": np.floor, "ceil": np.ceil, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "and": np.logical_and,
    "or": np.logical_or, "not": np.logical_not, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "square": np.square,
    "convert_to_int": lambda x: np.trunc(x).astype(np.int64),
    "convert_to_bool": lambda x: x != 0,
}


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.asarray(a).dtype, np.integer) and np.issubdtype(np.asarray(b).dtype, np.integer):
        return _int_div(a, b)
    return np.true_divide(a, b)


def _rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.fmod(a, b)  # C semantics, like XLA


_ELEMENTWISE["div"] = _div
_ELEMENTWISE["rem"] = _rem


def _evaluate(kind: str, params: dict, ins: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray | None:
    """Value of one op on known operand arrays, or None when not folded."""
    with np.errstate(all="ignore"):
        if kind in _ELEMENTWISE:
            return np.broadcast_to(_ELEMENTWISE[kind](*ins), out_shape)
        if kind == "integer_pow":
            return np.power(ins[0], params["y"])
        if kind == "select_n":
            return np.choose(np.asarray(ins[0]).astype(np.int64), ins[1:])
        if kind == "clamp":
            return np.clip(ins[1], ins[0], ins[2])
        if kind == "broadcast_in_dim":
            shape = [1] * len(out_shape)
            for i, d in enumerate(params["broadcast_dimensions"]):
                shape[d] = ins[0].shape[i]
            return np.broadcast_to(ins[0].reshape(shape), out_shape)
        if kind == "reshape":
            return ins[0].reshape(out_shape)
        if kind == "transpose":
            return np.transpose(ins[0], params["permutation"])
        if kind == "slice":
            st = params.get("strides") or (1,) * ins[0].ndim
            return ins[0][tuple(slice(a, b, s) for a, b, s in
                                zip(params["start_indices"], params["limit_indices"], st))]
        if kind == "concatenate":
            return np.concatenate(ins, axis=params["dimension"])
        if kind == "dynamic_slice":
            x = np.asarray(ins[0])
            # XLA clamps each start so that the slice stays in bounds
            starts = [min(max(int(np.asarray(s).reshape(-1)[0]), 0), n - m)
                      for s, n, m in zip(ins[1:], x.shape, out_shape)]
            return x[tuple(slice(a, a + m) for a, m in zip(starts, out_shape))]
        if kind == "iota":
            idx = np.arange(out_shape[params["dimension"]])
            shape = [1] * len(out_shape)
            shape[params["dimension"]] = -1
            return np.broadcast_to(idx.reshape(shape), out_shape)
        if kind == "reduce_sum":
            return np.sum(ins[0], axis=tuple(params["axes"]))
        if kind == "reduce_max":
            return np.max(ins[0], axis=tuple(params["axes"]))
        if kind == "reduce_min":
            return np.min(ins[0], axis=tuple(params["axes"]))
    return None


_SPLAT_PRESERVING = {"broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice", "rev"}


def fold(graph: Graph, mesh: Mesh | None) -> Folded:
    ranks = mesh.size if mesh is not None else 1
    res = Folded(ranks)
    small, splat = res.small, res.splat
    for op in graph.ops:
        out = graph.tensors[op.output]
        size = int(np.prod(out.shape)) if out.shape else 1
        if op.kind == "constant":
            v = op.params.get("value")
            if v is None:
                continue
            v = np.asarray(v)
            if v.size and np.all(v == v.flat[0]):
                splat[op.output] = [v.flat[0].item()] * ranks
            if v.size <= SMALL:
                small[op.output] = [v] * ranks
            continue
        if op.kind == "axis_index":
            assert mesh is not None
            vals = [np.asarray(mesh.coords(r)[op.params["axis"]], dtype=out.dtype) for r in range(ranks)]
            small[op.output] = vals
            splat[op.output] = [v.item() for v in vals]
            continue
        if op.kind == "iota" and size <= SMALL:
            v = _evaluate("iota", op.params, [], out.shape)
            small[op.output] = [np.asarray(v)] * ranks
            continue
        if op.inputs and all(i in small for i in op.inputs) and size <= SMALL:
            vals = []
            for r in range(ranks):
                v = _evaluate(op.kind, op.params, [small[i][r] for i in op.inputs], out.shape)
                if v is None:
                    break
                vals.append(np.asarray(v))
            if len(vals) == ranks:
                small[op.output] = vals
                if size and all(np.all(v == v.flat[0]) for v in vals):
                    splat[op.output] = [v.flat[0].item() for v in vals]
                continue
        # Large tensors: follow one-value tensors through shape changes and
        # elementwise ops on one-value operands.
        if op.kind in _SPLAT_PRESERVING and op.inputs and op.inputs[0] in splat:
            splat[op.output] = list(splat[op.inputs[0]])
        elif op.kind in _ELEMENTWISE and op.inputs and all(i in splat for i in op.inputs):
            vals = []
            for r in range(ranks):
                v = _evaluate(op.kind, op.params, [np.asarray(splat[i][r]) for i in op.inputs], ())
                vals.append(np.asarray(v).item())
            splat[op.output] = vals
    return res
