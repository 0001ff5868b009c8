"""A gather's size-1 offset dim as a batching dim (both graphs).

JAX specialises `take_along_axis` on the shapes it sees: when a dim both the values
and the indices have is of size 1 (one sequence per rank under data parallelism), it
squeezes it from the indices and slices the operand whole along it, an offset dim;
the sequential program, with the dim of size 4, pairs it as a batching dim. The two
gathers then have different dimension numbers and the rules (datalog/gather.dl),
which pair gathers of equal dimension numbers, never meet.

Reading an operand dim of size 1 whole, or at the position of an index dim of size
1 (always 0), is the same: so the gather is rewritten with the dim as a batching
dim, paired with a new size-1 dim of the indices (a reshape of them), placed where
the output dim sits among the batch dims. The output is unchanged, element for
element. A reshape feeding the indices and read by nothing else is folded into the
new one (reshape of a reshape is one reshape).
"""
from __future__ import annotations

from collections import Counter

from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op
from dlverify.op_pass import PassState, to_fixpoint


def _unit_offset_dim(op: Op, operand: tuple[int, ...], indices: tuple[int, ...]) -> int | None:
    """An operand dim of size 1 the gather slices whole as an offset dim, when the index
    vector dim is the indices' last (or implicit); else None."""
    p = op.params
    ivd = p["index_vector_dim"]
    if ivd is not None and ivd != len(indices) - 1 and ivd != len(indices):
        return None
    obd = tuple(p.get("operand_batching_dims") or ())
    for i, n in enumerate(operand):
        if n == 1 and p["slice_sizes"][i] == 1 and i not in p["start_index_map"] \
                and i not in p["collapsed_slice_dims"] and i not in obd:
            return i
    return None


def _rewrite(g: Graph, op: Op, i: int, builder: GraphBuilder, producer: dict[int, Op],
             uses: Counter) -> bool:
    """Make operand dim i of gather `op` a batching dim (see the module doc); False when
    the gather's shapes do not add up (left as it is)."""
    p = dict(op.params)
    operand, idx = op.inputs[:2]
    o_shape, i_shape = g.tensors[operand].shape, g.tensors[idx].shape
    obd = list(p.get("operand_batching_dims") or ())
    sbd = list(p.get("start_indices_batching_dims") or ())
    explicit = p["index_vector_dim"] is not None and p["index_vector_dim"] < len(i_shape)
    kept = [d for d in range(len(o_shape)) if d not in p["collapsed_slice_dims"] and d not in obd]
    j = p["offset_dims"][kept.index(i)]                 # the output dim it gives
    offset_dims = tuple(o for o in p["offset_dims"] if o != j)
    out_rank = len(g.tensors[op.output].shape)
    pos = sum(1 for o in range(j) if o not in offset_dims)   # its place among the batch dims
    batch_dims = list(i_shape[:-1] if explicit else i_shape)
    new_shape = tuple(batch_dims[:pos] + [1] + batch_dims[pos:]) + ((i_shape[-1],) if explicit else ())
    if out_rank != len(offset_dims) + len(new_shape) - explicit:
        return False
    src = idx
    inner = producer.get(idx)
    if inner is not None and inner.kind == "reshape" and uses[idx] == 1 and idx not in g.outputs:
        src = inner.inputs[0]                          # reshape of a reshape: one reshape
    new_idx = builder.op("reshape", [src], new_shape, g.tensors[idx].dtype, {}, op.loc, op.name)
    pairs = sorted([(b, s + (s >= pos)) for b, s in zip(obd, sbd)] + [(i, pos)])
    p.update(offset_dims=offset_dims, operand_batching_dims=tuple(b for b, _ in pairs),
             start_indices_batching_dims=tuple(s for _, s in pairs),
             index_vector_dim=len(new_shape) - 1 if explicit else len(new_shape))
    t = g.tensors[op.output]
    builder.op("gather", [operand, new_idx] + list(op.inputs[2:]), t.shape, t.dtype, p, op.loc,
               op.name, output=op.output)
    return True


def _batch_one(st: PassState, op: Op) -> bool:
    """Rewrite `op` when it is a gather with a size-1 offset dim (one dim per pass)."""
    if op.kind != "gather" or len(op.inputs) < 2:
        return False
    i = _unit_offset_dim(op, st.g.tensors[op.inputs[0]].shape, st.g.tensors[op.inputs[1]].shape)
    return i is not None and _rewrite(st.g, op, i, st.builder, st.producer, st.uses)


def batch_unit_offset_dims(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite every gather of g with a size-1 offset dim (to a fixpoint: one dim per
    pass). Returns whether anything changed; reshapes left unread are for the caller
    to drop."""
    return to_fixpoint(g, ids, _batch_one)
