"""A reshape that only inserts size-1 dims into a broadcast_in_dim is the broadcast to
the reshape's shape (dlverify/simplify_layouts.py, broadcast_under_unit_insertion).
jax.nn.dot_product_attention broadcasts its causal mask to [b, h, q, k] and reshapes it
to [1, b, h, q, k] beside its scores; XLA broadcasts it there directly. Checked with the
shared evaluator (outputs unchanged), where it must not fire, on a hand-written pair
with its twin (the mask q <= k instead of q >= k), and on the compiled example. Also:
an HLO broadcast whose dimensions are out of order transposes its operand."""
import copy

import numpy as np
import pytest
from hlo_pairs import compiled_pair, example_module, verify_texts
from test_simplify import _graph, _run

from dlverify.simplify import simplify_graph


def _simplified(build, shapes):
    g, ids = _graph(build, shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    rng = np.random.default_rng(3)
    for _ in range(3):
        ins = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        np.testing.assert_array_equal(_run(before, ins)[0], _run(g, ins)[0])
    return g


def test_a_unit_insertion_into_a_broadcast_is_the_broadcast():
    def build(b, x, m):
        mask = b.op("broadcast_in_dim", [m], (4, 2, 8, 8), "float32", {"broadcast_dimensions": (2, 3)})
        wide = b.op("reshape", [mask], (1, 4, 2, 8, 8), "float32", {})
        return b.op("mul", [wide, b.op("reshape", [x], (1, 4, 2, 8, 8), "float32", {})],
                    (1, 4, 2, 8, 8), "float32", {})
    g = _simplified(build, [(4, 2, 8, 8), (8, 8)])
    (mask,) = [op for op in g.ops if op.kind == "broadcast_in_dim"]
    assert g.tensors[mask.output].shape == (1, 4, 2, 8, 8)
    assert mask.params["broadcast_dimensions"] == (3, 4)


@pytest.mark.parametrize("m_shape, shape, dims, out_shape", [
    ((16,), (8, 1, 16), (2,), (8, 16)),      # the reshape deletes a size-1 dim
    ((8,), (4, 8), (1,), (8, 4)),            # it regroups sized dims
])
def test_it_does_not_fire_on_other_reshapes(m_shape, shape, dims, out_shape):
    def build(b, x, m):
        w = b.op("broadcast_in_dim", [m], shape, "float32", {"broadcast_dimensions": dims})
        r = b.op("reshape", [w], out_shape, "float32", {})
        return b.op("mul", [r, x], out_shape, "float32", {})
    g = _simplified(build, [out_shape, m_shape])
    assert [g.tensors[op.output].shape for op in g.ops if op.kind == "broadcast_in_dim"] == [shape]


# the program's where: mask and scores reshaped to [1, ...] before the select
SEQ = """HloModule seq

ENTRY %main (s: f32[4,8,8]) -> f32[1,4,8,8] {
  %s = f32[4,8,8]{2,1,0} parameter(0)
  %i = s32[8,8]{1,0} iota(), iota_dimension=0
  %j = s32[8,8]{1,0} iota(), iota_dimension=1
  %causal = pred[8,8]{1,0} compare(%i, %j), direction=GE
  %mask = pred[4,8,8]{2,1,0} broadcast(%causal), dimensions={1,2}
  %wide = pred[1,4,8,8]{3,2,1,0} reshape(%mask)
  %r = f32[1,4,8,8]{3,2,1,0} reshape(%s)
  %low = f32[] constant(-1e+09)
  %fill = f32[1,4,8,8]{3,2,1,0} broadcast(%low), dimensions={}
  ROOT %sel = f32[1,4,8,8]{3,2,1,0} select(%wide, %r, %fill)
}
"""

# heads split over 2 ranks; the mask broadcast straight to the reshaped scores' shape
DIST = """HloModule dist, num_partitions=2

ENTRY %main (s: f32[2,8,8]) -> f32[1,2,8,8] {
  %s = f32[2,8,8]{2,1,0} parameter(0), sharding={devices=[2,1,1]<=[2]}
  %i = s32[8,8]{1,0} iota(), iota_dimension=0
  %j = s32[8,8]{1,0} iota(), iota_dimension=1
  %causal = pred[8,8]{1,0} compare(%i, %j), direction=GE
  %mask = pred[1,2,8,8]{3,2,1,0} broadcast(%causal), dimensions={2,3}
  %r = f32[1,2,8,8]{3,2,1,0} reshape(%s)
  %low = f32[] constant(-1e+09)
  %fill = f32[1,2,8,8]{3,2,1,0} broadcast(%low), dimensions={}
  ROOT %sel = f32[1,2,8,8]{3,2,1,0} select(%mask, %r, %fill), sharding={devices=[1,2,1,1]<=[2]}
}
"""


def test_the_mask_beside_reshaped_scores_verifies_and_the_reversed_mask_does_not(tmp_path):
    res = verify_texts(tmp_path, SEQ, DIST)
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert res.outputs == ["out0 = concat(r0.out0, r1.out0; dim 1)"]
    twin = DIST.replace("direction=GE", "direction=LE")
    assert not verify_texts(tmp_path, SEQ, twin).verified


def test_compiled_dot_product_attention_verifies(tmp_path):
    case = example_module("gspmd_jit").gspmd_dot_product_attention_forward()
    res = verify_texts(tmp_path, *compiled_pair(case))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]


# ------------------------------------------------ an HLO broadcast that transposes

TRANSPOSING = """HloModule t

ENTRY %main (x: f32[3,4]) -> f32[4,2,3] {
  %x = f32[3,4]{1,0} parameter(0)
  ROOT %b = f32[4,2,3]{2,1,0} broadcast(%x), dimensions={2,0}
}
"""


def test_an_hlo_broadcast_with_dims_out_of_order_transposes_its_operand():
    """HLO lets broadcast dimensions be out of order (operand dim i lands on result dim
    dimensions[i]); the frontend transposes the operand first, so the IR's
    broadcast_in_dim keeps its dims in order, and the shared evaluator computes the
    HLO semantics: out[a, b, c] = x[c, a]."""
    from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module
    from dlverify.interpret import Interpreter
    from dlverify.ir import IdAllocator
    g, _ = hlo_to_graph(parse_hlo_module(TRANSPOSING, "t.hlo"), IdAllocator(), "g")
    (b,) = [op for op in g.ops if op.kind == "broadcast_in_dim"]
    assert list(b.params["broadcast_dimensions"]) == sorted(b.params["broadcast_dimensions"])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = Interpreter(g, 1).run([[x]])[g.outputs[0]][0]
    np.testing.assert_array_equal(out, np.broadcast_to(x.T[:, None, :], (4, 2, 3)))


def test_a_transposed_causal_mask_is_not_verified(tmp_path):
    """The mask broadcast with its dims swapped (k >= q) is not the program's (q >= k):
    read as an in-order broadcast it verified."""
    dist = """HloModule dist, num_partitions=2

ENTRY %main (s: f32[2,8,8]) -> f32[2,8,8] {
  %s = f32[2,8,8]{2,1,0} parameter(0), sharding={devices=[2,1,1]<=[2]}
  %i = s32[8,8]{1,0} iota(), iota_dimension=0
  %j = s32[8,8]{1,0} iota(), iota_dimension=1
  %causal = pred[8,8]{1,0} compare(%i, %j), direction=GE
  %mask = pred[2,8,8]{2,1,0} broadcast(%causal), dimensions={1,2}
  %low = f32[] constant(-1e+09)
  %fill = f32[2,8,8]{2,1,0} broadcast(%low), dimensions={}
  ROOT %sel = f32[2,8,8]{2,1,0} select(%mask, %s, %fill), sharding={devices=[2,1,1]<=[2]}
}
"""
    seq = dist.replace("HloModule dist, num_partitions=2", "HloModule seq").replace("[2,8,8]", "[4,8,8]") \
              .replace(", sharding={devices=[2,1,1]<=[2]}", "")
    assert verify_texts(tmp_path, seq, dist).verified
    assert not verify_texts(tmp_path, seq, dist.replace("dimensions={1,2}", "dimensions={2,1}")).verified
