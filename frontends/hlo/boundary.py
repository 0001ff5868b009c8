"""Boundary relations that are not one block per rank, stated exactly as ops.

A relation the `BlockRelation` vocabulary cannot state is written into the
graphs themselves, so the rules see ordinary ops and nothing new has to be
trusted:

* a segmented split: the parameter is the concatenation of one input per
  segment, in both graphs (each pair of segments then an even split);
* `rank0_only`: the distributed parameter is `select(rank == 0, b, 0)` of a
  replicated input b (rank 0 holds the value, every other rank zeros);
* a rank-id parameter: the distributed parameter is the rank (`axis_index`);
* a scalar stated by value: the distributed parameter is that constant;
* an output that is the sum (mean) of the ranks' outputs: an all-reduce (and a
  division by the rank count) appended to the distributed output;
* a parameter declared unused: a constant of unknown value, so anything that
  does read it has no view (sound: never assumed equal to anything).

Every new op is put at the front of the graph (before any reader) and is
located at the parameter's line.
"""
from __future__ import annotations

import numpy as np

from dlverify.frontends.hlo.model import FLAT_AXIS, np_dtype
from dlverify.ir import Graph, IdAllocator, Op, SourceLoc, Tensor


class _Prelude:
    """Ops to put before the graph's own, in order."""

    def __init__(self, graph: Graph, ids: IdAllocator, loc: SourceLoc, name: str) -> None:
        self.graph, self.ids, self.loc, self.name = graph, ids, loc, name
        self.ops: list[Op] = []

    def tensor(self, shape: tuple[int, ...], dtype: str, suffix: str) -> int:
        tid = self.ids()
        self.graph.tensors[tid] = Tensor(tid, tuple(shape), dtype, f"{self.name}.{suffix}")
        return tid

    def op(self, kind: str, inputs: list[int], out: int, params: dict) -> int:
        self.ops.append(Op(self.ids(), kind, inputs, out, params, self.loc, self.name))
        return out

    def new(self, kind: str, inputs: list[int], shape: tuple[int, ...], dtype: str,
            params: dict, suffix: str) -> int:
        return self.op(kind, inputs, self.tensor(shape, dtype, suffix), params)

    def commit(self) -> None:
        self.graph.ops[0:0] = self.ops


def segment_input(graph: Graph, ids: IdAllocator, pos: int, dim: int,
                  piece_shapes: list[tuple[int, ...]], name: str, loc: SourceLoc) -> None:
    """Replace input `pos` of `graph` by one fresh input per piece and make the
    old input tensor their concatenation along `dim`."""
    t = graph.inputs[pos]
    dtype = graph.tensors[t].dtype
    pre = _Prelude(graph, ids, loc, name)
    pieces = [pre.tensor(shp, dtype, f"seg{i}") for i, shp in enumerate(piece_shapes)]
    pre.op("concatenate", pieces, t, {"dimension": dim})
    pre.commit()
    graph.inputs[pos:pos + 1] = pieces
    graph.input_names[pos:pos + 1] = [f"{name}.seg{i}" for i in range(len(pieces))]


def rank0_only_input(graph: Graph, ids: IdAllocator, tensor: int, name: str,
                     loc: SourceLoc) -> int:
    """Make `tensor` (an input of the distributed graph) `select(rank == 0, b,
    zeros)` of a fresh input b of the same shape, which takes its place among
    the inputs; returns b."""
    t = graph.tensors[tensor]
    pre = _Prelude(graph, ids, loc, name)
    b = pre.tensor(t.shape, t.dtype, "rank0")
    rank = pre.new("axis_index", [], (), "int32", {"axis": FLAT_AXIS}, "rank")
    zero_i = pre.new("constant", [], (), "int32", {"value": np.int32(0)}, "zero_rank")
    is0 = pre.new("eq", [rank, zero_i], (), "bool", {}, "is_rank0")
    pred = pre.new("broadcast_in_dim", [is0], t.shape, "bool",
                   {"broadcast_dimensions": ()}, "is_rank0_b")
    zeros = pre.new("constant", [], t.shape, t.dtype,
                    {"value": np.zeros(t.shape, dtype=np_dtype(t.dtype))}, "zeros")
    pre.op("select_n", [pred, zeros, b], tensor, {})
    pre.commit()
    graph.inputs[graph.inputs.index(tensor)] = b
    return b


def rank_id_value(graph: Graph, ids: IdAllocator, tensor: int, name: str, loc: SourceLoc) -> None:
    """Make `tensor` (a distributed-only parameter, no longer an input) the rank."""
    t = graph.tensors[tensor]
    pre = _Prelude(graph, ids, loc, name)
    if t.shape == ():
        pre.op("axis_index", [], tensor, {"axis": FLAT_AXIS})
    else:
        r = pre.new("axis_index", [], (), t.dtype, {"axis": FLAT_AXIS}, "rank")
        pre.op("broadcast_in_dim", [r], tensor, {"broadcast_dimensions": ()})
    pre.commit()


def constant_value(graph: Graph, ids: IdAllocator, tensor: int, value: float, name: str,
                   loc: SourceLoc) -> None:
    """Make `tensor` (a distributed-only parameter) the constant `value` everywhere."""
    t = graph.tensors[tensor]
    pre = _Prelude(graph, ids, loc, name)
    pre.op("constant", [], tensor,
           {"value": np.full(t.shape, value, dtype=np_dtype(t.dtype))})
    pre.commit()


def opaque_value(graph: Graph, ids: IdAllocator, tensor: int, name: str, loc: SourceLoc) -> None:
    """Make `tensor` (a distributed-only parameter declared unused) a value no
    rule relates to anything: a constant of unknown value, like an elided one
    with no twin."""
    pre = _Prelude(graph, ids, loc, name)
    pre.op("constant", [], tensor, {"value": None})
    pre.commit()


def reduce_output(graph: Graph, ids: IdAllocator, pos: int, ranks: int, mean: bool,
                  name: str, loc: SourceLoc) -> None:
    """Output `pos` of `graph` becomes the sum over every rank of what it was
    (divided by `ranks` for a mean): the ops go after the graph's own."""
    t = graph.outputs[pos]
    out = graph.tensors[t]
    ops: list[Op] = []

    def new(kind: str, inputs: list[int], params: dict, suffix: str) -> int:
        tid = ids()
        graph.tensors[tid] = Tensor(tid, out.shape, out.dtype, f"{name}.{suffix}")
        ops.append(Op(ids(), kind, inputs, tid, params, loc, name))
        return tid
    total = new("all_reduce", [t], {"reducer": "sum", "groups": [list(range(ranks))]}, "sum")
    if mean:
        n = new("constant", [], {"value": np.full(out.shape, ranks, dtype=np_dtype(out.dtype))},
                "ranks")
        total = new("div", [total, n], {}, "mean")
    graph.ops.extend(ops)
    graph.outputs[pos] = total


__all__ = ["segment_input", "reduce_output", "rank0_only_input", "rank_id_value", "constant_value", "opaque_value"]
