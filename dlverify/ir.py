"""The frontend-neutral graph every importer produces and the exporter reads.

A `Graph` is a list of single-output `Op`s in topological order over `Tensor`s.
Op kinds and their params are the canonical vocabulary listed in `OPS` (the
op-kind table, dlverify/ops/table.py): jaxpr primitives and HLO instructions
are translated into it, so one rule set serves both frontends. Distributed programs are SPMD: one graph run by every rank of a
`Mesh`; rank-dependent values come only from `axis_index` ops (and the collective
ops' groups), which later passes instantiate per rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlverify.ops.dtypes import is_float_dtype  # noqa: F401 - part of the IR's interface
from dlverify.ops.table import BINARY, KINDS, UNARY, Algebra, Family, kinds


@dataclass(frozen=True)
class Frame:
    """One user source frame: where an op was written, or one of its callers."""

    file: str
    line: int
    function: str = ""


@dataclass(frozen=True)
class SourceLoc:
    """Source of an op: `frames[0]` is the innermost user frame; `frames[primary]`
    is the one the op is reported at (a frontend may prefer a caller's frame to
    a thin helper's, see frontends/jaxpr/frames.py)."""

    frames: tuple[Frame, ...] = ()
    op_name: str = ""
    primary: int = 0

    @property
    def file(self) -> str:
        return self.frames[self.primary].file if self.frames else ""

    @property
    def line(self) -> int:
        return self.frames[self.primary].line if self.frames else 0


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


@dataclass(frozen=True)
class FoldedOp:
    """An op an exact rewrite removed because tensor `value` already holds its
    result (a slice of a concatenate that is one of its operands): kept so that
    diagnosis can still find the op by its source (dlverify/correspondence.py)."""

    kind: str
    loc: SourceLoc
    value: int


# reductions that over size-1 dims move no element (also reduce_squeeze.dl's reducers)
CHAIN_REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min")
CHAIN_DEPTH = 4   # ops that move no element followed upwards from each op (layout_algebra.py)


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
    folded: list[FoldedOp] = field(default_factory=list)

    def producer(self) -> dict[int, Op]:
        return {op.output: op for op in self.ops}

    def moves_no_element(self, op: Op) -> bool:
        """op's output is a row-major reshape of its operand 0 (a reshape; a
        broadcast_in_dim that only inserts size-1 dims; a reduction over size-1 dims
        only, which combines one element; a transpose that keeps the order of the dims
        with more than one element): a step of a chain (dlverify/layout_algebra.py)."""
        if not op.inputs:
            return False
        src, dst = self.tensors[op.inputs[0]].shape, self.tensors[op.output].shape
        if op.kind == "reshape":
            return True
        if op.kind == "broadcast_in_dim":
            bd = tuple(op.params["broadcast_dimensions"])
            return all(src[i] == dst[j] for i, j in enumerate(bd)) and \
                all(dst[j] == 1 for j in range(len(dst)) if j not in bd)
        if op.kind in CHAIN_REDUCTIONS and len(op.inputs) == 1:
            return all(src[a] == 1 for a in op.params["axes"])
        if op.kind == "transpose":
            big = [i for i in op.params["permutation"] if src[i] > 1]
            return big == sorted(big)
        return False

    def consumers(self) -> dict[int, list[Op]]:
        """The ops reading each tensor, in op order (an op reading it twice, twice)."""
        out: dict[int, list[Op]] = {}
        for op in self.ops:
            for t in op.inputs:
                out.setdefault(t, []).append(op)
        return out


def literal_value(producer: dict[int, Op], t: int,
                  through: tuple[str, ...] = ()) -> np.ndarray | None:
    """The value of the constant tensor t is, or that t repeats through ops of the
    kinds `through` (broadcasts and reshapes: every element of t is one of the
    constant's); None when t comes from no constant of known value."""
    op = producer.get(t)
    while op is not None and op.kind in through:
        op = producer.get(op.inputs[0])
    if op is None or op.kind != "constant" or op.params.get("value") is None:
        return None
    return np.asarray(op.params["value"])


class IdAllocator:
    """Hands out the global integer ids of tensors and ops. Sequential and
    distributed graphs share one allocator so their ids never collide."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self) -> int:
        self._next += 1
        return self._next


# The canonical op vocabulary, declared once in the op-kind table
# (dlverify/ops/table.py): frontends must map every op they accept onto one of
# these kinds; anything else is an UnknownOpError. The sets below name the
# table's families and algebraic classes the rules and reports group kinds by.
ELEMENTWISE_NONLINEAR_UNARY = kinds(Family.ELEMENTWISE, Algebra.NONLINEAR, UNARY)
ELEMENTWISE_LINEAR_UNARY = kinds(Family.ELEMENTWISE, Algebra.LINEAR, UNARY)
ELEMENTWISE_NONLINEAR_BINARY = kinds(Family.ELEMENTWISE, Algebra.NONLINEAR, BINARY)
ELEMENTWISE_ADDSUB = kinds(Family.ELEMENTWISE, Algebra.LINEAR, BINARY)
ELEMENTWISE_NARY = (kinds(Family.ELEMENTWISE) - kinds(Family.ELEMENTWISE, arity=UNARY)
                    - kinds(Family.ELEMENTWISE, arity=BINARY))
REDUCTIONS = kinds(Family.REDUCTION)
COLLECTIVES = kinds(Family.COLLECTIVE)
LAYOUT = kinds(Family.LAYOUT)
OPS = frozenset(KINDS)
OTHER = OPS - (ELEMENTWISE_NONLINEAR_UNARY | ELEMENTWISE_LINEAR_UNARY | ELEMENTWISE_NONLINEAR_BINARY
               | ELEMENTWISE_ADDSUB | ELEMENTWISE_NARY | REDUCTIONS | COLLECTIVES | LAYOUT)


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
           name: str = "", output: int | None = None) -> int:
        """Append an op; its result is a new tensor of `shape` and `dtype`, or the
        existing tensor `output` (of that shape and dtype: an op rewritten in place)."""
        assert kind in OPS, kind
        if output is None:
            out = self.tensor(shape, dtype, name)
        else:
            out = output
            t = self.graph.tensors[out]
            assert (t.shape, t.dtype) == (tuple(shape), dtype), (t, shape, dtype)
        self.graph.ops.append(Op(self.ids(), kind, list(inputs), out, dict(params or {}),
                                 loc or SourceLoc(), name))
        return out

    def constant(self, value: np.ndarray | None, shape: tuple[int, ...], dtype: str,
                 loc: SourceLoc | None = None, name: str = "") -> int:
        """`value` None means the value is unknown (elided in the file)."""
        return self.op("constant", [], shape, dtype, {"value": value}, loc, name)
