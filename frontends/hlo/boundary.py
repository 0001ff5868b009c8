"""Boundary relations that are not one block per rank, stated exactly as ops.

A relation the `BlockRelation` vocabulary cannot state is written into the
graphs themselves, so the rules see ordinary ops and nothing new has to be
trusted:

* a segmented split: the parameter is the concatenation of one input per
  segment, in both graphs (each pair of segments then an even split);
* `rank0_only`: the distributed parameter is `select(rank == 0, b, 0)` of a
  replicated input b (rank 0 holds the value, every other rank zeros);
* a padded split: the distributed parameter is `dynamic_slice(pad(b, 0),
  rank * k)` of a replicated input b, as XLA's partitioner writes it, or with
  padding of unknown values `dynamic_slice(concatenate(b, junk), rank * k)`,
  junk being each rank's block of a fresh input no other op reads;
* a reshaped parameter: the distributed parameter is the row-major `reshape`
  of a fresh input holding the block (or the whole value);
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

from dlverify.ir import Graph, GraphBuilder, IdAllocator, SourceLoc


def _builder(graph: Graph, ids: IdAllocator) -> GraphBuilder:
    """A builder of new ops for `graph`: they go to a list of their own, which the
    caller puts in front of the graph's ops (or after them); tensors go to the
    graph's table at once."""
    return GraphBuilder(Graph(graph.name, tensors=graph.tensors), ids)


def segment_input(graph: Graph, ids: IdAllocator, pos: int, dim: int,
                  piece_shapes: list[tuple[int, ...]], name: str, loc: SourceLoc) -> None:
    """Replace input `pos` of `graph` by one fresh input per piece and make the
    old input tensor their concatenation along `dim`."""
    t = graph.inputs[pos]
    dtype = graph.tensors[t].dtype
    b = _builder(graph, ids)
    pieces = [b.tensor(shp, dtype, f"{name}.seg{i}") for i, shp in enumerate(piece_shapes)]
    b.op("concatenate", pieces, graph.tensors[t].shape, dtype, {"dimension": dim}, loc, name,
         output=t)
    graph.ops[0:0] = b.graph.ops
    graph.inputs[pos:pos + 1] = pieces
    graph.input_names[pos:pos + 1] = [f"{name}.seg{i}" for i in range(len(pieces))]


def rank0_only_input(graph: Graph, ids: IdAllocator, tensor: int, name: str,
                     loc: SourceLoc) -> int:
    """Make `tensor` (an input of the distributed graph) `select(rank == 0, b,
    zeros)` of a fresh input b of the same shape, which takes its place among
    the inputs; returns b."""
    t = graph.tensors[tensor]
    b = _builder(graph, ids)
    held = b.tensor(t.shape, t.dtype, f"{name}.rank0")
    rank = b.op("axis_index", [], (), "int32", {"axis": FLAT_AXIS}, loc, f"{name}.rank")
    zero_i = b.op("constant", [], (), "int32", {"value": np.int32(0)}, loc, f"{name}.zero_rank")
    is0 = b.op("eq", [rank, zero_i], (), "bool", {}, loc, f"{name}.is_rank0")
    pred = b.op("broadcast_in_dim", [is0], t.shape, "bool", {"broadcast_dimensions": ()}, loc,
                f"{name}.is_rank0_b")
    zeros = b.op("constant", [], t.shape, t.dtype,
                 {"value": np.zeros(t.shape, dtype=np_dtype(t.dtype))}, loc, f"{name}.zeros")
    b.op("select_n", [pred, zeros, held], t.shape, t.dtype, {}, loc, name, output=tensor)
    graph.ops[0:0] = b.graph.ops
    graph.inputs[graph.inputs.index(tensor)] = held
    return held


def rank_id_value(graph: Graph, ids: IdAllocator, tensor: int, name: str, loc: SourceLoc) -> None:
    """Make `tensor` (a distributed-only parameter, no longer an input) the rank."""
    t = graph.tensors[tensor]
    b = _builder(graph, ids)
    if t.shape == ():
        b.op("axis_index", [], (), t.dtype, {"axis": FLAT_AXIS}, loc, name, output=tensor)
    else:
        r = b.op("axis_index", [], (), t.dtype, {"axis": FLAT_AXIS}, loc, f"{name}.rank")
        b.op("broadcast_in_dim", [r], t.shape, t.dtype, {"broadcast_dimensions": ()}, loc, name,
             output=tensor)
    graph.ops[0:0] = b.graph.ops


def constant_value(graph: Graph, ids: IdAllocator, tensor: int, value: float, name: str,
                   loc: SourceLoc) -> None:
    """Make `tensor` (a distributed-only parameter) the constant `value` everywhere."""
    t = graph.tensors[tensor]
    b = _builder(graph, ids)
    b.op("constant", [], t.shape, t.dtype,
         {"value": np.full(t.shape, value, dtype=np_dtype(t.dtype))}, loc, name, output=tensor)
    graph.ops[0:0] = b.graph.ops


def opaque_value(graph: Graph, ids: IdAllocator, tensor: int, name: str, loc: SourceLoc) -> None:
    """Make `tensor` (a distributed-only parameter declared unused) a value no
    rule relates to anything: a constant of unknown value, like an elided one
    with no twin."""
    t = graph.tensors[tensor]
    b = _builder(graph, ids)
    b.op("constant", [], t.shape, t.dtype, {"value": None}, loc, name, output=tensor)
    graph.ops[0:0] = b.graph.ops


def reduce_output(graph: Graph, ids: IdAllocator, pos: int, ranks: int, mean: bool,
                  name: str, loc: SourceLoc) -> None:
    """Output `pos` of `graph` becomes the sum over every rank of what it was
    (divided by `ranks` for a mean): the ops go after the graph's own."""
    t = graph.outputs[pos]
    out = graph.tensors[t]
    b = GraphBuilder(graph, ids)
    total = b.op("all_reduce", [t], out.shape, out.dtype,
                 {"reducer": "sum", "groups": [list(range(ranks))]}, loc, f"{name}.sum")
    if mean:
        n = b.op("constant", [], out.shape, out.dtype,
                 {"value": np.full(out.shape, ranks, dtype=np_dtype(out.dtype))}, loc,
                 f"{name}.ranks")
        total = b.op("div", [total, n], out.shape, out.dtype, {}, loc, f"{name}.mean")
    graph.outputs[pos] = total


def reshaped_input(graph: Graph, ids: IdAllocator, tensor: int, block_shape: tuple[int, ...],
                   name: str, loc: SourceLoc) -> int:
    """Make `tensor` (an input of the distributed graph) the row-major reshape of a
    fresh input of `block_shape` (the same number of elements), which takes its place
    among the inputs; returns the fresh input."""
    t = graph.tensors[tensor]
    b = _builder(graph, ids)
    block = b.tensor(block_shape, t.dtype, f"{name}.block")
    b.op("reshape", [block], t.shape, t.dtype, {}, loc, name, output=tensor)
    graph.ops[0:0] = b.graph.ops
    graph.inputs[graph.inputs.index(tensor)] = block
    return block


__all__ = ["segment_input", "reshaped_input", "reduce_output", "rank0_only_input", "rank_id_value", "constant_value",
           "opaque_value"]


def padded_split_input(graph: Graph, ids: IdAllocator, tensor: int, dim: int, full: int,
                       ranks: int, junk: int | None, name: str, loc: SourceLoc) -> int:
    """Make `tensor` (an input of the distributed graph, `k` along `dim`) rank r's
    block `[r k, r k + k)` of a fresh replicated input b (`full` along `dim`) padded
    past its end to `ranks * k`: with zeros when `junk` is None, else with the
    tensor `junk` (a fresh input of the padding's shape). b takes the input's place;
    returns b."""
    t = graph.tensors[tensor]
    k = t.shape[dim]
    b = _builder(graph, ids)
    shape = t.shape[:dim] + (full,) + t.shape[dim + 1:]
    padded_shape = t.shape[:dim] + (ranks * k,) + t.shape[dim + 1:]
    held = b.tensor(shape, t.dtype, f"{name}.full")
    if junk is None:
        zero = b.op("constant", [], (), t.dtype, {"value": np.zeros((), dtype=np_dtype(t.dtype))},
                    loc, f"{name}.zero")
        cfg = tuple((0, ranks * k - full if i == dim else 0, 0) for i in range(len(shape)))
        padded = b.op("pad", [held, zero], padded_shape, t.dtype, {"padding_config": cfg}, loc,
                      f"{name}.padded")
    else:
        padded = b.op("concatenate", [held, junk], padded_shape, t.dtype, {"dimension": dim}, loc,
                      f"{name}.padded")
    rank = b.op("axis_index", [], (), "int32", {"axis": FLAT_AXIS}, loc, f"{name}.rank")
    size = b.op("constant", [], (), "int32", {"value": np.int32(k)}, loc, f"{name}.block")
    start = b.op("mul", [rank, size], (), "int32", {}, loc, f"{name}.start")
    zero_i = b.op("constant", [], (), "int32", {"value": np.int32(0)}, loc, f"{name}.zero_start")
    starts = [start if i == dim else zero_i for i in range(len(shape))]
    b.op("dynamic_slice", [padded, *starts], t.shape, t.dtype, {"slice_sizes": t.shape}, loc, name,
         output=tensor)
    graph.ops[0:0] = b.graph.ops
    graph.inputs[graph.inputs.index(tensor)] = held
    return held
