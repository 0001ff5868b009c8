"""dlverify/resharding.py on compiled modules: XLA's tuple all-to-all (slice the
block per peer, exchange, concatenate what arrives) is a region of data
movement, not a chain; elementwise ops between the exchange and the layout ops
that finish the resharding are moved below them; the region's end may merge
dims (an all-gather, a slice, then a reshape).

Each rewrite keeps the value (the graph runs the same before and after, on
random data; 4 and 8 peers); the examples' all-to-all reshardings and Ulysses attention,
compiled by XLA, verify from their HLO, and the twins do not, located at their
`# BUG` line."""
import copy

import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, example_module

from dlverify.frontends.hlo.model import FLAT_AXIS
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.problem import Problem
from dlverify.resharding import hoist_layouts, rewrite_reshardings
GROUPS = [[0, 1, 2, 3]]


def _tuple_exchange_then_tanh(n=4):
    """Rows (4, 16 n) -> columns (4 n, 16) over n ranks as XLA compiles it: n column
    slices, each given a leading dim, concatenated, exchanged, split again,
    concatenated along the columns, tanh(2x + 1), then reshape, transpose, reshape."""
    ids = IdAllocator()
    g = Graph("dist")
    b = GraphBuilder(g, ids)
    x = b.tensor((4, 16 * n), "float32", "x")
    g.inputs = [x]
    pieces = [b.op("reshape", [b.op("slice", [x], (4, 16), "float32",
                                    {"start_indices": (0, 16 * j), "limit_indices": (4, 16 * j + 16),
                                     "strides": None})], (1, 4, 16), "float32") for j in range(n)]
    cat = b.op("concatenate", pieces, (n, 4, 16), "float32", {"dimension": 0})
    a2a = b.op("all_to_all", [cat], (n, 4, 16), "float32",
               {"split_dimension": 0, "concat_dimension": 0, "groups": [list(range(n))]})
    got = [b.op("slice", [a2a], (1, 4, 16), "float32",
                {"start_indices": (j, 0, 0), "limit_indices": (j + 1, 4, 16), "strides": None})
           for j in range(n)]
    shape = (1, 4, 16 * n)
    row = b.op("concatenate", got, shape, "float32", {"dimension": 2})
    two = b.op("broadcast_in_dim", [b.constant(np.float32(2), (), "float32")], shape, "float32",
               {"broadcast_dimensions": ()})
    one = b.op("broadcast_in_dim", [b.constant(np.float32(1), (), "float32")], shape, "float32",
               {"broadcast_dimensions": ()})
    y = b.op("add", [b.op("mul", [b.op("tanh", [row], shape, "float32"), two], shape, "float32"), one],
             shape, "float32")
    r = b.op("reshape", [y], (4, n, 16), "float32")
    t = b.op("transpose", [r], (n, 4, 16), "float32", {"permutation": (1, 0, 2)})
    g.outputs = [b.op("reshape", [t], (4 * n, 16), "float32")]
    return Problem(Graph("seq"), g, Mesh((FLAT_AXIS,), (n,)), [], [None], ids)


def _outputs(g, xs):
    return Interpreter(g, len(xs), lambda r, a: r).run([xs])[g.outputs[0]]


@pytest.mark.parametrize("n", [4, 8])
def test_tuple_exchange_with_elementwise_ops_becomes_a_gather_and_a_slice(n):
    p = _tuple_exchange_then_tanh(n)
    before = copy.deepcopy(p.dist)
    assert rewrite_reshardings(p)
    kinds = [op.kind for op in p.dist.ops]
    assert "all_gather" in kinds and kinds.index("all_gather") < kinds.index("tanh")
    xs = [np.random.default_rng(r).standard_normal((4, 16 * n)).astype(np.float32) for r in range(n)]
    for got, want in zip(_outputs(p.dist, xs), _outputs(before, xs)):
        np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_hoisting_keeps_values_and_stops_at_values_read_twice():
    p = _tuple_exchange_then_tanh()
    g = p.dist
    before = copy.deepcopy(g)
    assert hoist_layouts(g, p.ids)
    assert [op.kind for op in g.ops][-1] == "add"   # the layouts now run before tanh
    xs = [np.random.default_rng(r).standard_normal((4, 64)).astype(np.float32) for r in range(4)]
    for got, want in zip(_outputs(g, xs), _outputs(before, xs)):
        np.testing.assert_allclose(got, want, rtol=0, atol=0)
    # tanh read by a second op too: it stays where it is
    p = _tuple_exchange_then_tanh()
    tanh = next(op for op in p.dist.ops if op.kind == "tanh")
    b = GraphBuilder(p.dist, p.ids)
    p.dist.outputs.append(b.op("neg", [tanh.output], (1, 4, 64), "float32"))
    hoist_layouts(p.dist, p.ids)
    assert any(op.kind == "tanh" and op.output == tanh.output for op in p.dist.ops)


@pytest.mark.parametrize("example,correct,twin", [
    ("all_to_all_reshard", "all_to_all_heads", "all_to_all_heads_bug_split_head_dim"),
    ("ulysses_attention", "ulysses_causal_attention", "ulysses_bug_back_all_to_all_wrong_concat_axis"),
])
def test_compiled_all_to_all_programs_verify_and_twins_are_located(tmp_path, example, correct, twin):
    m = example_module(example)
    assert_compiled_case_and_twin(tmp_path, getattr(m, correct)(), getattr(m, twin)())
