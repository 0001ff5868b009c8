"""Size-1 dims as the SPMD partitioner leaves them (`bench/xla_examples.py --dist spmd`: the
rank's module before XLA's algebraic simplifier deletes them), from
examples/gqa_replicated_kv.py and examples/parallel_residual.py:

* a distributed reduction over size-1 axes that the sequential program reduces nowhere
  (no reduction with that reducer over an operand of that rank and that axis) is the
  reshape deleting them (unit_placement.unit_reduction_as_reshape, reduced_axes): JAX's
  transpose of a broadcast sums the softmax gradient's row term over the rank's one KV
  head as well, which the program, holding two, keeps;
* a dot operand reshape [b, s, 1, 1, e] -> [b, s, 1, e] (a rank's q: its slot of the fused
  [q | k | v] and its one head) is not taken as a contraction over (head, e): which size-1
  dim the reshape keeps is open, and the program batches over the head
  (simplify_reshapes._units_only_ambiguous); a contracted run whose size-1 dim has no
  size-1 neighbour is still split.

Each rewrite is checked with the shared evaluator on random inputs, and where it must not
fire; the examples' pairs verify with every derived view holding on random data, and buggy
twins (one written here at TP=4) are not verified and are located at their `# BUG` line."""
from __future__ import annotations

import copy
import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest
from conftest import bug_line
from hlo_pairs import example_module, verify_texts
from rulekit import assert_views_hold
from test_simplify import _dot, _graph
from test_unit_layouts import _dots, _same_values

from dlverify.frontends.jax_compiled import dumped_after_spmd
from dlverify.simplify import simplify_graph

F32 = "float32"


# ------------------------------------------------------------------ reductions over size-1 axes

def _row_term(kind):
    """A rank's row term [b, 1, q] summed over its one KV head, negated, broadcast back
    along the keys ([b, 1, q] -> [b, q] -> [b, 1, q, k])."""
    def build(b, t):
        r = b.op(kind, [t], (2, 3), F32, {"axes": (1,)})
        n = b.op("neg", [r], (2, 3), F32)
        return b.op("broadcast_in_dim", [n], (2, 1, 3, 4), F32, {"broadcast_dimensions": (0, 2)})
    return build


def _reducing(kind, axis):
    """A sequential program reducing [2, 2, 3] over one axis."""
    def build(b, t):
        shape = tuple(n for d, n in enumerate((2, 2, 3)) if d != axis)
        return b.op(kind, [t], shape, F32, {"axes": (axis,)})
    return build


@pytest.mark.parametrize("kind", ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
def test_a_distributed_unit_reduction_the_program_never_makes_is_a_reshape(kind):
    partner, _ = _graph(_reducing(kind, 2), [(2, 2, 3)])    # (the program sums another axis)
    shapes = [(2, 1, 3)]
    g, ids = _graph(_row_term(kind), shapes)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids, partner=partner)
    _same_values(before, g, shapes)
    assert {op.kind for op in g.ops} == {"neg", "broadcast_in_dim"}    # (the reshape sank in)
    assert not simplify_graph(g, ids, partner=partner)                 # a fixpoint


@pytest.mark.parametrize("kind", ["reduce_sum", "reduce_max"])
def test_a_distributed_unit_reduction_stays_where_the_program_reduces_that_axis(kind):
    # the rule's twin: the program reduces an operand of that rank over that axis (a rank's
    # block of one element of a sized dim: a partial term, read as a reduction)
    partner, _ = _graph(_reducing(kind, 1), [(2, 2, 3)])
    g, ids = _graph(_row_term(kind), [(2, 1, 3)])
    simplify_graph(g, ids, partner=partner)
    assert kind in {op.kind for op in g.ops}


# ------------------------------------------------------------------ size-1 dims beside a contraction

def _unit_slot_scores(b, qkv):
    """A rank's scores q k^T from its fused projection [b, s, 3, 1, e]: q and k sliced out of
    their slots and reshaped to [b, s, 1, e], batched over (b, head), contracting e."""
    picked = []
    for slot in (0, 1):
        t = b.op("slice", [qkv], (2, 8, 1, 1, 4), F32,
                 {"start_indices": (0, 0, slot, 0, 0), "limit_indices": (2, 8, slot + 1, 1, 4),
                  "strides": None})
        picked.append(b.op("reshape", [t], (2, 8, 1, 4), F32))
    return _dot(b, *picked, (2, 1, 8, 8), (3,), (3,), (0, 2), (0, 2))


def test_a_units_only_contracted_run_beside_a_unit_dim_is_not_split():
    shapes = [(2, 8, 3, 1, 4)]
    g, ids = _graph(_unit_slot_scores, shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)
    assert len(dot.params["lhs_contract"]) == 1 and len(dot.params["lhs_batch"]) == 2


def _flattened_projection(b, o, w):
    """o [4, 1, 6] and w [1, 6, 5] flattened to [4, 6] x [6, 5]: the size-1 dim of the
    contracted run has no size-1 neighbour, so the runs are contracted pairwise (the
    size-1 pair then batched, as every size-1 pair of a dot is)."""
    lhs = b.op("reshape", [o], (4, 6), F32)
    rhs = b.op("reshape", [w], (6, 5), F32)
    return _dot(b, lhs, rhs, (4, 5), (1,), (0,))


def test_a_units_contracted_run_without_a_unit_neighbour_is_still_split():
    shapes = [(4, 1, 6), (1, 6, 5)]
    g, ids = _graph(_flattened_projection, shapes)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)   # (the size-1 pair split out, then batched: unit_dims_batched)
    assert [len(g.tensors[t].shape) for t in dot.inputs] == [3, 3]
    assert len(dot.params["lhs_contract"]) + len(dot.params["lhs_batch"]) == 2


# ------------------------------------------------------------------ the examples, partitioned

def _spmd_pair(case) -> tuple[str, str]:
    seq = jax.jit(case.seq).lower(*case.args).as_text(dialect="hlo")
    return seq, dumped_after_spmd(case.dist.lower(*case.args))


def _assert_verifies(tmp_path, case) -> None:
    res = verify_texts(tmp_path, *_spmd_pair(case))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)


def _assert_located(tmp_path, case) -> None:
    res = verify_texts(tmp_path, *_spmd_pair(case))
    assert not res.verified
    assert bug_line(case.dist) in {fr.line for fr in res.failures[0].frames}, \
        [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]


@pytest.mark.parametrize("name", ["gqa_two_kv_heads_tp4_train", "mqa_one_kv_head_tp4_train"])
def test_the_gqa_training_steps_verify_as_partitioned(tmp_path, name):
    _assert_verifies(tmp_path, getattr(example_module("gqa_replicated_kv"), name)())


def test_the_gqa_twin_averaging_the_k_gradient_is_located_as_partitioned(tmp_path):
    gqa = example_module("gqa_replicated_kv")
    _assert_located(tmp_path, gqa.gqa_bug_k_grad_averaged_over_replicas())


def test_the_parallel_residual_block_at_tp4_verifies_as_partitioned(tmp_path):
    _assert_verifies(tmp_path, example_module("parallel_residual").parallel_residual_tp4())


def test_a_tp4_block_reading_the_query_slot_as_the_key_is_located(tmp_path):
    pr = example_module("parallel_residual")

    def block_local_query_as_key(x, g1, b1, g2, b2, wqkv, wo, bo, w1, bb1, w2, bb2):
        qkv = jnp.einsum("bsd,dthe->bsthe", pr.layer_norm(x, g1, b1), wqkv)
        s = jnp.einsum("bqhe,bkhe->bhqk", qkv[:, :, 0], qkv[:, :, 0]) / math.sqrt(pr.DH)  # BUG
        s = jnp.where(jnp.tril(jnp.ones((pr.S, pr.S), bool)), s, -1e9)
        o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, -1), qkv[:, :, 2])
        a = jnp.einsum("bqhe,hed->bqd", o, wo)
        m = pr.mlp(pr.layer_norm(x, g2, b2), w1, bb1, w2)
        return x + jax.lax.psum(a + m, "tp") + bo + bb2
    twin = dataclasses.replace(pr.parallel_residual_tp4(), expect="bug",
                               dist=pr._dist(block_local_query_as_key, 4))
    _assert_located(tmp_path, twin)
