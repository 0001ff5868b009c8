"""Gathers with batching dims (take_along_axis) in datalog/gather.dl, and a size-1
offset dim rewritten as a batching dim (dlverify/gather_batching.py).

The rule's views are checked numerically on the tiny programs (rulekit); the rewrite
is checked by running the graph before and after it on random data with the shared
evaluator; a batch block of the operand at another offset than the indices' has no
view; JAX's take_along_axis under data parallelism (two and one sequence per rank)
verifies, and a twin reading the labels of another rank is located."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from jax.sharding import Mesh as JMesh, PartitionSpec as P
from rulekit import Tiny

from dlverify.api import verify_jax
from dlverify.gather_batching import batch_unit_offset_dims
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator

UNIT = (0, 0, 0, 0)
# take_along_axis on (B, S, V) values with (B, S, 1, 1) indices: B and S batching dims
TAKE = dict(offset_dims=(), collapsed_slice_dims=(2,), start_index_map=(2,), index_vector_dim=3,
            operand_batching_dims=(0, 1), start_indices_batching_dims=(0, 1), slice_sizes=(1, 1, 1),
            indices_are_sorted=False)


def _take_along(t: Tiny, idx_moved: bool = False):
    """values (4, 3, 5) and int indices (4, 3, 1, 1), both split on dim 0 over "x"."""
    vs, vd = t.input((4, 3, 5), ("x", None, None))
    is_, id_ = t.input((4, 3, 1, 1), ("x", None, None, None), dtype="int32")
    if idx_moved:   # the other rank's indices
        id_ = t.D.op("collective_permute", [id_], (2, 3, 1, 1), "int32", dict(pairs=[(0, 1), (1, 0)]))
    ys = t.sop("gather", [vs, is_], (4, 3, 1), **TAKE)
    yd = t.dop("gather", [vd, id_], (2, 3, 1), **TAKE)
    return ys, yd


def test_a_gather_with_batching_dims_keeps_the_batch_block():
    t = Tiny()
    ys, yd = _take_along(t)
    out = t.run()
    for r in range(2):
        assert {(v.offsets, v.partial, v.scale) for v in out.views(ys, yd, r)} == \
            {((2 * r, 0, 0), None, UNIT)}


def test_indices_of_another_batch_block_give_no_view():
    t = Tiny()
    ys, yd = _take_along(t, idx_moved=True)
    out = t.run()
    assert out.views(ys, yd) == []


# ---------------------------------------------------------------- the rewrite

def _squeezed_take():
    """JAX's take_along_axis on a batch of one: values (1, 4, 6), indices (1, 4, 1)
    reshaped to (4, 1, 1), operand dim 0 an offset dim."""
    ids = IdAllocator()
    g = Graph("distributed")
    b = GraphBuilder(g, ids)
    x, i = b.tensor((1, 4, 6), "float64"), b.tensor((1, 4, 1), "int32")
    g.inputs += [x, i]
    r = b.op("reshape", [i], (4, 1, 1), "int32", {})
    y = b.op("gather", [x, r], (1, 4, 1), "float64", dict(
        offset_dims=(0,), collapsed_slice_dims=(2,), start_index_map=(2,), index_vector_dim=2,
        operand_batching_dims=(1,), start_indices_batching_dims=(0,), slice_sizes=(1, 1, 1),
        indices_are_sorted=False))
    g.outputs.append(y)
    return g, ids


def test_a_size_one_offset_dim_becomes_a_batching_dim_and_computes_the_same():
    g, ids = _squeezed_take()
    rng = np.random.default_rng(0)
    inputs = [[rng.standard_normal((1, 4, 6))], [rng.integers(-2, 8, (1, 4, 1)).astype(np.int32)]]
    before = Interpreter(g, 1).run(inputs)[g.outputs[0]][0]
    h = copy.deepcopy(g)
    assert batch_unit_offset_dims(h, ids)
    gather = next(op for op in h.ops if op.kind == "gather")
    assert gather.params["operand_batching_dims"] == (0, 1)
    assert gather.params["start_indices_batching_dims"] == (0, 1)
    assert gather.params["offset_dims"] == () and gather.params["index_vector_dim"] == 3
    reshape = next(op for op in h.ops if op.output == gather.inputs[1])
    assert reshape.inputs == [g.inputs[1]]   # the two reshapes are one
    after = Interpreter(h, 1).run(inputs)[h.outputs[0]][0]
    np.testing.assert_array_equal(before, after)


def test_a_gather_without_size_one_offset_dims_is_kept():
    g, ids = _squeezed_take()
    g.ops[-1].params = dict(g.ops[-1].params, slice_sizes=(1, 1, 1))
    x = g.inputs[0]
    g.tensors[x].shape = (2, 4, 6)   # dim 0 of size 2: sliced to one element, not whole
    assert not batch_unit_offset_dims(g, ids)


# ---------------------------------------------------------------- JAX programs

B, S, V = 4, 8, 16


def _nll_seq(logits, labels):
    lp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(lp, labels[..., None], -1, mode="clip")[..., 0]


def _nll_other_rank(logits, labels):
    lp = jax.nn.log_softmax(logits, -1)
    labels = jax.lax.ppermute(labels, "dp", [(r, (r + 1) % 2) for r in range(2)])
    return -jnp.take_along_axis(lp, labels[..., None], -1, mode="clip")[..., 0]  # BUG: labels of another rank


def _dp(fn, n):
    mesh = JMesh(np.array(jax.devices()[:n]), ("dp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("dp"), P("dp")), out_specs=P("dp")))


ARGS = (jax.ShapeDtypeStruct((B, S, V), jnp.float32), jax.ShapeDtypeStruct((B, S), jnp.int32))


@pytest.mark.parametrize("ranks", [2, 4])   # 4: one sequence per rank, JAX squeezes the batch
def test_take_along_axis_under_data_parallelism_verifies(ranks):
    res = verify_jax(_nll_seq, _dp(_nll_seq, ranks), *ARGS)
    assert res.verified, [f.message for f in res.failures]


def test_labels_of_another_rank_are_located():
    res = verify_jax(_nll_seq, _dp(_nll_other_rank, 2), *ARGS)
    assert not res.verified
    assert res.failures[0].line == bug_line(_nll_other_rank)
