"""The frontend-neutral graph every importer produces and the exporter reads.

A `Graph` is a list of single-output `Op`s in topological order over `Tensor`s.
Op kinds and their params are the canonical vocabulary listed in `OPS`: jaxpr
primitives and HLO instructions are translated into it, so one rule set serves
both frontends. Distributed programs are SPMD: one graph run by every rank of a
`Mesh`; rank-dependent values come only from `axis_index` ops (and the collective
ops' groups), which later passes instantiate per rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Frame:
    """One user source frame: where an op was written, or one of its callers."""

    file: str
    line: int
    function: str = ""


@dataclass(frozen=True)
class SourceLoc:
    """Source of an op: `frames[0]` is the innermost user frame."""

    frames: tuple[Frame, ...] = ()
    op_name: str = ""

    @property
    def file(self) -> str:
        return self.frames[0].file if self.frames else ""

    @property
    def line(self) -> int:
        return self.frames[0].line if self.frames else 0


@dataclass
class Tensor:
    id: int
    shape: tuple[int, ...]
    dtype: str
    name: str = ""

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Op:
    """One op with a single output tensor. `params` hold the kind's attributes
    (see `OPS`); `inputs` are tensor ids in operand order."""

    id: int
    kind: str
    inputs: list[int]
    output: int
    params: dict[str, Any] = field(default_factory=dict)
    loc: SourceLoc = field(default_factory=SourceLoc)
    name: str = ""


@dataclass(frozen=True)
class Mesh:
    """Logical device mesh of an SPMD program. Rank r is the row-major position
    of a device in the mesh (axis 0 major)."""

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.axis_sizes)) if self.axis_sizes else 1

    def coords(self, rank: int) -> dict[str, int]:
        idx = np.unravel_index(rank, self.axis_sizes) if self.axis_sizes else ()
        return {a: int(i) for a, i in zip(self.axis_names, idx)}

    def rank_of(self, coords: dict[str, int]) -> int:
        return int(np.ravel_multi_index(tuple(coords[a] for a in self.axis_names), self.axis_sizes))

    def axis_size(self, name: str) -> int:
        return self.axis_sizes[self.axis_names.index(name)]

    def groups(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Rank groups of a collective over `axes`: ranks that agree on every other
        axis, ordered row-major over `axes` in the given order."""
        others = [a for a in self.axis_names if a not in axes]
        other_sizes = [self.axis_size(a) for a in others]
        inner_sizes = [self.axis_size(a) for a in axes]
        out = []
        for oi in np.ndindex(*other_sizes):
            grp = []
            for ii in np.ndindex(*inner_sizes):
                c = dict(zip(others, oi)) | dict(zip(axes, ii))
                grp.append(self.rank_of({k: int(v) for k, v in c.items()}))
            out.append(grp)
        return out


@dataclass
class Graph:
    """One program. `inputs`/`outputs` are tensor ids in signature order."""

    name: str
    tensors: dict[int, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)

    def producer(self) -> dict[int, Op]:
        return {op.output: op for op in self.ops}


def is_float_dtype(dtype: object) -> bool:
    """Floating (or complex) element type, by name: covers bfloat16 and the float8
    types, which numpy does not count as np.floating."""
    return str(dtype).startswith(("float", "bfloat", "complex"))


class IdAllocator:
    """Hands out the global integer ids of tensors and ops. Sequential and
    distributed graphs share one allocator so their ids never collide."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self) -> int:
        self._next += 1
        return self._next


# The canonical op vocabulary: kind -> params it carries. Frontends must map every
# op they accept onto one of these; anything else is an UnknownOpError.
ELEMENTWISE_NONLINEAR_UNARY = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "cbrt",
    "abs", "sign", "sin", "cos", "tan", "erf", "erfc", "erf_inv", "floor", "ceil", "round",
    "not", "is_finite", "integer_pow", "square", "reciprocal", "asin", "acos", "atan",
    "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma", "convert_to_int",
    "convert_to_bool", "population_count", "clz", "imag", "real", "conj",
})
ELEMENTWISE_LINEAR_UNARY = frozenset({"neg"})
ELEMENTWISE_NONLINEAR_BINARY = frozenset({
    "max", "min", "pow", "atan2", "rem", "and", "or", "xor", "eq", "ne", "lt", "le", "gt",
    "ge", "nextafter", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "complex",
})
ELEMENTWISE_ADDSUB = frozenset({"add", "sub"})
ELEMENTWISE_NARY = frozenset({"select_n", "clamp"})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                        "reduce_and", "reduce_or", "reduce_xor", "argmax", "argmin"})
COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                         "collective_permute"})
LAYOUT = frozenset({"broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice",
                    "concatenate", "pad", "rev", "dynamic_update_slice", "gather", "scatter_add",
                    "scatter", "iota"})
OTHER = frozenset({"dot_general", "constant", "axis_index", "mul", "div",
                   "cumsum", "cumprod", "cummax", "cummin", "sort", "rng_bit_generator",
                   "custom_call"})
OPS = (ELEMENTWISE_NONLINEAR_UNARY | ELEMENTWISE_LINEAR_UNARY | ELEMENTWISE_NONLINEAR_BINARY
       | ELEMENTWISE_ADDSUB | ELEMENTWISE_NARY | REDUCTIONS | COLLECTIVES | LAYOUT | OTHER)


class GraphBuilder:
    """Appends ops to a graph; the one way frontends and passes create tensors."""

    def __init__(self, graph: Graph, ids: IdAllocator) -> None:
        self.graph = graph
        self.ids = ids

    def tensor(self, shape: tuple[int, ...], dtype: str, name: str = "") -> int:
        tid = self.ids()
        self.graph.tensors[tid] = Tensor(tid, tuple(int(s) for s in shape), dtype, name)
        return tid

    def op(self, kind: str, inputs: list[int], shape: tuple[int, ...], dtype: str,
           params: dict[str, Any] | None = None, loc: SourceLoc | None = None,
           name: str = "") -> int:
        assert kind in OPS, kind
        out = self.tensor(shape, dtype, name)
        self.graph.ops.append(Op(self.ids(), kind, list(inputs), out, dict(params or {}),
                                 loc or SourceLoc(), name))
        return out

    def constant(self, value: np.ndarray | None, shape: tuple[int, ...], dtype: str,
                 loc: SourceLoc | None = None, name: str = "") -> int:
        """`value` None means the value is unknown (elided in the file)."""
        return self.op("constant", [], shape, dtype, {"value": value}, loc, name)
