"""Sums re-associated: the sequential sum trees (dlverify/sum_trees.py,
datalog/sum_trees.dl) and the split of a psum of an add (dlverify/collective_sums.py).

Every view the rules derive on the tiny programs is checked numerically (rulekit);
the rewrite is checked by running the graph before and after it on random data with
the shared evaluator; a distributed sum that counts a leaf twice, misses one or adds
a leaf of another tree has no view; JAX programs (Megatron's parallel residual,
forward and gradients) verify and their buggy twins are located."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from jax.sharding import Mesh as JMesh, PartitionSpec as P
from rulekit import Tiny

from dlverify.api import verify_jax
from dlverify.collective_sums import split_summed_adds
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.sum_trees import sum_parts

UNIT = (0, 0, 0, 0)
DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


# ---------------------------------------------------------------- the trees

def test_sum_parts_lists_every_node_of_a_tree_with_the_mask_of_its_leaves():
    g = Graph("sequential")
    b = GraphBuilder(g, IdAllocator())
    x, a, c, m, d = (b.tensor((3,), "float32") for _ in range(5))
    g.inputs += [x, a, c, m, d]
    ac = b.op("add", [a, c], (3,), "float32")
    xac = b.op("add", [x, ac], (3,), "float32")
    md = b.op("add", [m, d], (3,), "float32")
    out = b.op("add", [xac, md], (3,), "float32")
    g.outputs.append(out)
    root = g.ops[-1].id
    parts = {(t, mask, n) for r, t, mask, n in sum_parts(g) if r == root}
    assert parts == {(x, 1, 1), (a, 2, 1), (c, 4, 1), (ac, 6, 2), (xac, 7, 3), (m, 8, 1),
                     (d, 16, 1), (md, 24, 2), (out, 31, 5)}
    assert {r for r, *_ in sum_parts(g)} == {root}


def test_a_sum_read_elsewhere_is_a_leaf_and_two_leaves_are_no_tree():
    g = Graph("sequential")
    b = GraphBuilder(g, IdAllocator())
    x, a, c = (b.tensor((3,), "float32") for _ in range(3))
    g.inputs += [x, a, c]
    xa = b.op("add", [x, a], (3,), "float32")        # read twice: its own tree's root
    y = b.op("add", [xa, c], (3,), "float32")
    z = b.op("mul", [xa, y], (3,), "float32")
    g.outputs.append(z)
    assert sum_parts(g) == []    # both trees have two leaves


# ---------------------------------------------------------------- the rules

def parallel_residual(t: Tiny, order: str):
    """seq out = (x + (A + b1)) + (M + b2); A and M reductions of x split over "x" (2 ranks).
    The distributed program adds the same terms in another order (`order`), or adds a
    wrong set of them."""
    xs, xd = t.input((4, 6), (None, "x"))
    ws, wd = t.input((6, 4), ("x", None))
    vs, vd = t.input((6, 4), ("x", None))
    bs1, bd1 = t.input((4, 4))
    bs2, bd2 = t.input((4, 4))
    rs, rd = t.input((4, 4))
    a_s = t.sop("dot_general", [xs, ws], (4, 4), **DOT)
    m_s = t.sop("dot_general", [xs, vs], (4, 4), **DOT)
    attn = t.sop("add", [a_s, bs1], (4, 4))
    res = t.sop("add", [rs, attn], (4, 4))
    mlp = t.sop("add", [m_s, bs2], (4, 4))
    out_s = t.sop("add", [res, mlp], (4, 4))
    a_d = t.dop("dot_general", [xd, wd], (4, 4), **DOT)
    m_d = t.dop("dot_general", [xd, vd], (4, 4), **DOT)
    psum = lambda v: t.dop("all_reduce", [v], (4, 4), reducer="sum", groups=[[0, 1]])
    full_a, full_m = psum(a_d), psum(m_d)
    add = lambda u, v: t.dop("add", [u, v], (4, 4))
    if order == "biases_last":     # ((r + A) + M) + b2) + b1
        out_d = add(add(add(add(rd, full_a), full_m), bd2), bd1)
    elif order == "biases_first":  # ((b1 + b2) + (M + A)) + r
        out_d = add(add(add(bd1, bd2), add(full_m, full_a)), rd)
    elif order == "bias_twice":    # b1 counted twice, b2 never
        out_d = add(add(add(add(rd, full_a), full_m), bd1), bd1)
    elif order == "mlp_missing":
        out_d = add(add(add(rd, full_a), bd1), bd2)
    elif order == "residual_twice":
        out_d = add(add(add(add(add(rd, full_a), full_m), bd1), bd2), rd)
    else:
        raise ValueError(order)
    return out_s, out_d


@pytest.mark.parametrize("order", ["biases_last", "biases_first"])
def test_a_distributed_sum_of_the_leaves_in_another_order_equals_the_tree(order):
    t = Tiny()
    out_s, out_d = parallel_residual(t, order)
    out = t.run()
    for r in range(2):
        assert {(v.offsets, v.partial, v.scale) for v in out.views(out_s, out_d, r)} == \
            {((0, 0), None, UNIT)}


@pytest.mark.parametrize("order", ["bias_twice", "mlp_missing", "residual_twice"])
def test_a_sum_that_repeats_or_misses_a_leaf_has_no_view(order):
    t = Tiny()
    out_s, out_d = parallel_residual(t, order)
    out = t.run()
    assert out.views(out_s, out_d) == []


def test_leaves_of_another_tree_do_not_count():
    """Two sequential trees (x + a + c) and (x + a + e) with c and e equal on no rank:
    the distributed (x + a) + e is the second tree, never the first."""
    t = Tiny()
    xs, xd = t.input((3,))
    as_, ad = t.input((3,))
    cs, cd = t.input((3,))
    es, ed = t.input((3,))
    t1 = t.sop("add", [t.sop("add", [xs, as_], (3,)), cs], (3,))
    t2 = t.sop("add", [t.sop("add", [xs, as_], (3,)), es], (3,))
    t.sop("mul", [t1, t2], (3,))
    y = t.dop("add", [t.dop("add", [ad, xd], (3,)), ed], (3,))
    out = t.run()
    assert out.views(t1, y) == []
    assert {v.offsets for v in out.views(t2, y)} == {(0,)}


# ---------------------------------------------------------------- the rewrite

def run(g: Graph, inputs, ranks):
    vals = Interpreter(g, ranks).run(inputs)
    return [vals[t] for t in g.outputs]


def psum_of_adds(kinds=("dot_general", "dot_general"), extra_reader=False):
    """psum((x @ w) + (x @ v)) on 2 ranks (or with the add's operands as `kinds` says)."""
    ids = IdAllocator()
    g = Graph("distributed")
    b = GraphBuilder(g, ids)
    x, w, v = b.tensor((4, 3), "float64"), b.tensor((3, 5), "float64"), b.tensor((3, 5), "float64")
    g.inputs += [x, w, v]
    ops = []
    for kind, m in zip(kinds, (w, v)):
        if kind == "dot_general":
            ops.append(b.op("dot_general", [x, m], (4, 5), "float64", DOT))
        else:   # a value that is no reduction (a bias on every rank)
            ops.append(b.op("exp", [b.op("slice", [m], (1, 5), "float64", dict(
                start_indices=(0, 0), limit_indices=(1, 5), strides=None))], (1, 5), "float64"))
            ops[-1] = b.op("broadcast_in_dim", [ops[-1]], (4, 5), "float64",
                           dict(broadcast_dimensions=(0, 1)))
    s = b.op("add", ops, (4, 5), "float64")
    out = b.op("all_reduce", [s], (4, 5), "float64", dict(reducer="sum", groups=[[0, 1]]))
    g.outputs.append(out)
    if extra_reader:
        g.outputs.append(ops[0])
    return g, ids


def test_a_psum_of_an_add_of_reductions_is_split_and_computes_the_same():
    g, ids = psum_of_adds()
    rng = np.random.default_rng(0)
    inputs = [[rng.standard_normal(g.tensors[t].shape) for _ in range(2)] for t in g.inputs]
    before = run(g, inputs, 2)
    h = copy.deepcopy(g)
    assert split_summed_adds(h, ids)
    assert [op.kind for op in h.ops].count("all_reduce") == 2
    for a, b in zip(before, run(h, inputs, 2)):
        for r in range(2):
            np.testing.assert_allclose(a[r], b[r], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["bias", "read_elsewhere"])
def test_a_psum_of_a_bias_plus_partial_or_of_a_term_read_elsewhere_is_kept(variant):
    g, ids = psum_of_adds(("dot_general", "bias") if variant == "bias" else
                          ("dot_general", "dot_general"), extra_reader=variant == "read_elsewhere")
    assert not split_summed_adds(g, ids)


# ---------------------------------------------------------------- JAX programs

B, D, F, H = 2, 8, 16, 4


def _mesh():
    return JMesh(np.array(jax.devices()[:2]), ("tp",))


def _block(x, wa, wo, w1, w2, bo, b2):
    a = jnp.tanh(x @ wa) @ wo
    m = jax.nn.gelu(x @ w1) @ w2
    return x + (a + bo) + (m + b2)


def _block_local(x, wa, wo, w1, w2, bo, b2):
    a = jnp.tanh(x @ wa) @ wo
    m = jax.nn.gelu(x @ w1) @ w2
    return x + jax.lax.psum(a + m, "tp") + bo + b2


def _block_local_bias_inside(x, wa, wo, w1, w2, bo, b2):
    a = jnp.tanh(x @ wa) @ wo
    m = jax.nn.gelu(x @ w1) @ w2
    return x + jax.lax.psum(a + m + bo, "tp") + b2  # BUG: bias inside the psum (counted twice)


def _block_local_mlp_unreduced(x, wa, wo, w1, w2, bo, b2):
    a = jnp.tanh(x @ wa) @ wo
    m = jax.nn.gelu(x @ w1) @ w2
    return x + jax.lax.psum(a, "tp") + m + bo + b2  # BUG: the MLP partial never reduced


SPECS = (P(), P(None, "tp"), P("tp"), P(None, "tp"), P("tp"), P(), P())
ARGS = tuple(jax.ShapeDtypeStruct(s, jnp.float32)
             for s in ((B, D), (D, F), (F, D), (D, F), (F, D), (D,), (D,)))


def _dist(fn, grad=False):
    """The shard_map program; gradients with JAX's replication checks on (without them
    the transpose of psum is a psum and the gradients are wrong: dlverify says so)."""
    if grad:
        fn = jax.grad(lambda *a, f=fn: (f(*a) ** 2).sum(), argnums=tuple(range(7)))
    return jax.jit(jax.shard_map(fn, mesh=_mesh(), in_specs=SPECS,
                                 out_specs=SPECS if grad else P(), check_vma=grad))


def test_parallel_residual_forward_and_gradients_verify():
    assert verify_jax(_block, _dist(_block_local), *ARGS).verified
    seq_grad = jax.grad(lambda *a: (_block(*a) ** 2).sum(), argnums=tuple(range(7)))
    assert verify_jax(seq_grad, _dist(_block_local, grad=True), *ARGS).verified


@pytest.mark.parametrize("local", [_block_local_bias_inside, _block_local_mlp_unreduced])
def test_parallel_residual_buggy_twin_is_not_verified_and_is_located(local):
    res = verify_jax(_block, _dist(local), *ARGS)
    assert not res.verified
    assert res.failures[0].line == bug_line(local)
