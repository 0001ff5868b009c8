"""examples/gspmd_jit.py as XLA compiles it: a dot contracting dims both operands
merged, whose merged runs differ only in size-1 dims, is the dot contracting the runs'
sized dims pairwise (dlverify/simplify.py, split_contraction): a size-1 dim of a
contracted run sums over one index. XLA's weight gradient of a scanned layer contracts
[1, b, s] (the layer's slice of the stack) flattened against [b, s] flattened; its
output projection after dot_product_attention merges [h, 1, k] (one query group per KV
head, the size-1 dim moved by the reshape) against the weight's [h, k]. Checked with
the shared evaluator (the outputs unchanged) and where it must not fire; the compiled
scanned-layers example verifies."""
import copy

import numpy as np
import pytest
from hlo_pairs import compiled_pair, example_module, verify_texts
from test_simplify import _graph, _run

from dlverify.simplify import simplify_graph


def _dot(b, x, y, shape, lc, rc):
    return b.op("dot_general", [x, y], shape, "float32",
                {"lhs_contract": lc, "rhs_contract": rc, "lhs_batch": (), "rhs_batch": ()})


def _simplified(build, shapes):
    """Simplify; the output agrees with the original's on random inputs."""
    g, ids = _graph(build, shapes)
    before = copy.deepcopy(g)
    changed = simplify_graph(g, ids)
    rng = np.random.default_rng(4)
    for _ in range(3):
        ins = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        np.testing.assert_allclose(_run(before, ins)[0], _run(g, ins)[0], rtol=1e-5, atol=1e-5)
    return g, changed


def _contracted_shapes(g):
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    p = dot.params
    shapes = [g.tensors[t].shape for t in dot.inputs]
    return ([shapes[0][d] for d in p["lhs_contract"]], [shapes[1][d] for d in p["rhs_contract"]])


def test_a_layers_slice_of_a_stack_contracted_flattened_contracts_batch_and_sequence():
    # dW = transpose(reshape(x [1, b, s, n] -> [b*s, n])) @ reshape(dy [b, s, m] -> [b*s, m])
    def build(b, x, dy):
        xt = b.op("transpose", [b.op("reshape", [x], (6, 5), "float32")], (5, 6), "float32",
                  {"permutation": (1, 0)})
        return _dot(b, xt, b.op("reshape", [dy], (6, 7), "float32"), (5, 7), (1,), (0,))
    g, changed = _simplified(build, [(1, 2, 3, 5), (2, 3, 7)])
    assert changed
    assert _contracted_shapes(g) == ([2, 3], [2, 3])
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert dot.inputs[1] == g.inputs[1]


def test_heads_and_a_moved_query_group_merged_contract_heads_and_head_dim():
    # out = reshape(a [b, s, h, 1, k] -> [b, s, 1, h*k]) @ reshape(w [h, k, d] -> [h*k, d])
    def build(b, a, w):
        fa = b.op("reshape", [a], (4, 3, 1, 8), "float32")
        fw = b.op("reshape", [w], (8, 5), "float32")
        return _dot(b, fa, fw, (4, 3, 1, 5), (3,), (0,))
    g, changed = _simplified(build, [(4, 3, 2, 1, 4), (2, 4, 5)])
    assert changed
    assert _contracted_shapes(g) == ([2, 4], [2, 4])


@pytest.mark.parametrize("x_shape, w_shape", [
    ((4, 3, 1, 2, 4), (4, 2, 5)),       # the sized dims in another order: [2, 4] vs [4, 2]
    ((4, 3, 8, 1, 1), (2, 4, 5)),       # one side not split at all
])
def test_runs_whose_sized_dims_differ_stay_merged(x_shape, w_shape):
    def build(b, a, w):
        fa = b.op("reshape", [a], (4, 3, 1, 8), "float32")
        fw = b.op("reshape", [w], (8, 5), "float32")
        return _dot(b, fa, fw, (4, 3, 1, 5), (3,), (0,))
    g, _ = _simplified(build, [x_shape, w_shape])
    assert _contracted_shapes(g) == ([8], [8])


def test_compiled_scanned_layers_verify(tmp_path):
    # the weight gradients of lax.scan's layers: XLA's [1, b, s] slices of the stacked
    # activations flattened against the cotangents' [b, s]
    gj = example_module("gspmd_jit")
    res = verify_texts(tmp_path, *compiled_pair(gj.gspmd_scanned_layers_tp_train()))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
