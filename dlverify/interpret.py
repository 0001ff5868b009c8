"""A numpy interpreter of the IR: runs a graph on concrete inputs, every rank in
lockstep with collectives emulated. Used for numeric witnesses and for the
soundness tests that check derived views against real values.
"""
from __future__ import annotations

import string
from typing import Any, Callable

import numpy as np
from scipy import special

from dlverify.ir import Graph, Op


class NotExecutable(Exception):
    """The graph cannot be run: an unknown constant value or an op without semantics here."""


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative, "exp": np.exp, "exp2": np.exp2, "log": np.log, "log1p": np.log1p,
    "expm1": np.expm1, "tanh": np.tanh, "logistic": special.expit, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "cbrt": np.cbrt, "abs": np.abs, "sign": np.sign,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "erf": special.erf, "erfc": special.erfc,
    "erf_inv": special.erfinv, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "not": np.logical_not, "is_finite": np.isfinite, "square": np.square,
    "reciprocal": np.reciprocal, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "convert_to_int": lambda x: np.trunc(x).astype(np.int64),
    "convert_to_bool": lambda x: x != 0,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
    "min": np.minimum, "pow": np.power, "atan2": np.arctan2, "rem": np.fmod,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor, "eq": np.equal,
    "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "nextafter": np.nextafter,
}


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return np.trunc(a / b).astype(np.result_type(a, b))
    return np.true_divide(a, b)


def _dot(op: Op, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    p = op.params
    letters = iter(string.ascii_letters)
    la = [next(letters) for _ in range(a.ndim)]
    lb = [""] * b.ndim
    for i, j in zip(p["lhs_batch"], p["rhs_batch"]):
        lb[j] = la[i]
    for i, j in zip(p["lhs_contract"], p["rhs_contract"]):
        lb[j] = la[i]
    for j in range(b.ndim):
        if not lb[j]:
            lb[j] = next(letters)
    out = [la[i] for i in p["lhs_batch"]]
    out += [la[i] for i in range(a.ndim) if i not in p["lhs_batch"] and i not in p["lhs_contract"]]
    out += [lb[j] for j in range(b.ndim) if j not in p["rhs_batch"] and j not in p["rhs_contract"]]
    return np.einsum(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", a, b, optimize=True)


def _gather(op: Op, x: np.ndarray, idx: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    """XLA gather (no batching dims): start indices clamped so every slice fits."""
    p = op.params
    if p.get("operand_batching_dims") or p.get("start_indices_batching_dims"):
        raise NotExecutable("gather with batching dims")
    smap, collapsed, sizes = p["start_index_map"], p["collapsed_slice_dims"], p["slice_sizes"]
    ivd = p["index_vector_dim"]
    idx = np.asarray(idx).astype(np.int64)
    idx = idx[..., None] if ivd is None or ivd == idx.ndim else np.moveaxis(idx, ivd, -1)
    if idx.shape[-1] != len(smap):
        raise NotExecutable(f"gather index vectors of size {idx.shape[-1]} for {len(smap)} "
                            f"indexed dims")
    kept = [i for i in range(x.ndim) if i not in collapsed]
    batch_out = [j for j in range(len(out_shape)) if j not in p["offset_dims"]]
    out = np.empty(out_shape, dtype=x.dtype)
    for b in np.ndindex(*idx.shape[:-1]):
        start = [0] * x.ndim
        for k, d in enumerate(smap):
            start[d] = int(np.clip(idx[b][k], 0, x.shape[d] - sizes[d]))
        piece = x[tuple(slice(a, a + n) for a, n in zip(start, sizes))]
        at: list[Any] = [slice(None)] * len(out_shape)
        for j, v in zip(batch_out, b):
            at[j] = v
        out[tuple(at)] = piece.reshape([sizes[i] for i in kept])
    return out


def _reduce(kind: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    fn = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min,
          "reduce_prod": np.prod, "reduce_and": np.all, "reduce_or": np.any}[kind]
    return fn(x, axis=tuple(axes))


class Interpreter:
    """Runs `graph` on `ranks` ranks at once; `values[t][r]` is tensor t on rank r."""

    def __init__(self, graph: Graph, ranks: int = 1, axis_coords: Callable[[int, str], int] | None = None):
        self.g = graph
        self.ranks = ranks
        self.coords = axis_coords

    def run(self, inputs: list[list[np.ndarray]]) -> dict[int, list[np.ndarray]]:
        """`inputs[i][r]`: input i on rank r."""
        vals: dict[int, list[np.ndarray]] = {}
        for t, per_rank in zip(self.g.inputs, inputs):
            vals[t] = [np.asarray(v) for v in per_rank]
        for op in self.g.ops:
            ins = [vals[i] for i in op.inputs]
            out_t = self.g.tensors[op.output]
            res = self.op(op, ins)
            vals[op.output] = [np.asarray(v).reshape(out_t.shape) for v in res]
        return vals

    def op(self, op: Op, ins: list[list[np.ndarray]]) -> list[np.ndarray]:
        k, p, R = op.kind, op.params, range(self.ranks)
        shape = self.g.tensors[op.output].shape
        if k in _UNARY:
            return [_UNARY[k](ins[0][r]) for r in R]
        if k in _BINARY:
            return [_BINARY[k](ins[0][r], ins[1][r]) for r in R]
        if k == "div":
            return [_div(ins[0][r], ins[1][r]) for r in R]
        if k == "integer_pow":
            return [np.power(ins[0][r], p["y"]) for r in R]
        if k == "select_n":
            return [np.choose(ins[0][r].astype(np.int64), [c[r] for c in ins[1:]]) for r in R]
        if k == "clamp":
            return [np.clip(ins[1][r], ins[0][r], ins[2][r]) for r in R]
        if k == "constant":
            if p.get("value") is None:
                raise NotExecutable(f"constant {op.name or op.output} has an elided value")
            return [np.asarray(p["value"]) for _ in R]
        if k == "iota":
            idx = np.arange(shape[p["dimension"]])
            sh = [1] * len(shape)
            sh[p["dimension"]] = -1
            return [np.broadcast_to(idx.reshape(sh), shape) for _ in R]
        if k == "axis_index":
            if self.coords is None:
                raise NotExecutable("axis_index outside a distributed program")
            return [np.asarray(self.coords(r, p["axis"])) for r in R]
        if k == "broadcast_in_dim":
            out = []
            for r in R:
                x = ins[0][r]
                sh = [1] * len(shape)
                for i, d in enumerate(p["broadcast_dimensions"]):
                    sh[d] = x.shape[i]
                out.append(np.broadcast_to(x.reshape(sh), shape))
            return out
        if k == "reshape":
            return [ins[0][r].reshape(shape) for r in R]
        if k == "transpose":
            return [np.transpose(ins[0][r], p["permutation"]) for r in R]
        if k == "rev":
            return [np.flip(ins[0][r], axis=tuple(p["dimensions"])) for r in R]
        if k == "slice":
            st = p.get("strides") or (1,) * len(shape)
            sl = tuple(slice(a, b, s) for a, b, s in zip(p["start_indices"], p["limit_indices"], st))
            return [ins[0][r][sl] for r in R]
        if k == "dynamic_slice":
            out = []
            for r in R:
                x = ins[0][r]
                starts = [int(np.clip(int(np.asarray(s[r]).reshape(-1)[0]), 0, x.shape[i] - shape[i]))
                          for i, s in enumerate(ins[1:])]
                out.append(x[tuple(slice(a, a + n) for a, n in zip(starts, shape))])
            return out
        if k == "dynamic_update_slice":
            out = []
            for r in R:
                x = ins[0][r].copy()
                u = ins[1][r]
                starts = [int(np.clip(int(np.asarray(s[r]).reshape(-1)[0]), 0, x.shape[i] - u.shape[i]))
                          for i, s in enumerate(ins[2:])]
                x[tuple(slice(a, a + n) for a, n in zip(starts, u.shape))] = u
                out.append(x)
            return out
        if k == "concatenate":
            return [np.concatenate([x[r] for x in ins], axis=p["dimension"]) for r in R]
        if k == "pad":
            out = []
            for r in R:
                x, pv = ins[0][r], ins[1][r]
                cfg = p["padding_config"]
                if any(c[2] for c in cfg) or any(c[0] < 0 or c[1] < 0 for c in cfg):
                    raise NotExecutable("pad with interior or negative padding")
                out.append(np.pad(x, [(c[0], c[1]) for c in cfg], constant_values=pv.item()))
            return out
        if k == "dot_general":
            return [_dot(op, ins[0][r], ins[1][r]) for r in R]
        if k == "gather":
            return [_gather(op, ins[0][r], ins[1][r], shape) for r in R]
        if k in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or"):
            return [_reduce(k, ins[0][r], p["axes"]) for r in R]
        if k in ("argmax", "argmin"):
            fn = np.argmax if k == "argmax" else np.argmin
            (ax,) = p["axes"]
            return [fn(ins[0][r], axis=ax) for r in R]
        if k in ("cumsum", "cumprod", "cummax", "cummin"):
            fn = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.maximum.accumulate,
                  "cummin": np.minimum.accumulate}[k]
            out = []
            for r in R:
                x = np.flip(ins[0][r], p["axis"]) if p["reverse"] else ins[0][r]
                y = fn(x, axis=p["axis"])
                out.append(np.flip(y, p["axis"]) if p["reverse"] else y)
            return out
        if k == "all_reduce":
            fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[p["reducer"]]
            out: list[np.ndarray | None] = [None] * self.ranks
            for grp in p["groups"]:
                acc = ins[0][grp[0]]
                for m in grp[1:]:
                    acc = fn(acc, ins[0][m])
                for m in grp:
                    out[m] = acc
            return self._fill(out, shape, ins[0])
        if k == "all_gather":
            out = [None] * self.ranks
            for grp in p["groups"]:
                cat = np.concatenate([ins[0][m] for m in grp], axis=p["dimension"])
                for m in grp:
                    out[m] = cat
            return self._fill(out, shape, ins[0])
        if k == "reduce_scatter":
            out = [None] * self.ranks
            d = p["dimension"]
            for grp in p["groups"]:
                acc = sum(ins[0][m] for m in grp)
                for q, m in enumerate(grp):
                    out[m] = np.split(acc, len(grp), axis=d)[q]
            return self._fill(out, shape, ins[0])
        if k == "all_to_all":
            out = [None] * self.ranks
            a, b = p["split_dimension"], p["concat_dimension"]
            for grp in p["groups"]:
                chunks = {m: np.split(ins[0][m], len(grp), axis=a) for m in grp}
                for q, m in enumerate(grp):
                    out[m] = np.concatenate([chunks[src][q] for src in grp], axis=b)
            return self._fill(out, shape, ins[0])
        if k == "collective_permute":
            out = [np.zeros(shape, dtype=ins[0][0].dtype) for _ in R]
            for src, dst in p["pairs"]:
                out[dst] = ins[0][src]
            return out
        raise NotExecutable(f"no numeric semantics for op kind {k!r}")

    def _fill(self, out: list, shape: tuple[int, ...], like: list[np.ndarray]) -> list[np.ndarray]:
        """Ranks outside every group keep their operand (XLA leaves them alone)."""
        return [o if o is not None else like[r] for r, o in enumerate(out)]
