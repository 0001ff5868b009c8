"""One orientation per dot under a transpose interleaving its operands' free dims
(dlverify/simplify_layouts.py, transposed_dot). JAX computes grouped attention's
output as v^T p^T ([b, g, k, j, q]) where the program computes p v ([b, g, q, j, k]);
both transpose it to [b, q, k, g, j] for the output projection, an order no dot
computes (q and j are p's, k is v's). The transpose is split into the dot whose
operand order is the one the transpose reads first, its free dims in the
transpose's order, and the transpose left: both sides reach one form. A transpose
that interleaves the free dims only by a size-1 dim (XLA's one expert per rank,
which the program batches) stays, as before.

Each rewrite is checked on random data by the shared evaluator, and a rewrite with
its residual permutation inverted (a rule twin) is caught by that check; a
hand-written tensor-parallel HLO pair verifies (a false alarm before) and its twin,
contracting p's query dim instead of its key dim, does not."""
import copy
import itertools

import numpy as np
import pytest
from hlo_pairs import verify_texts
from test_simplify import _dot, _graph
from test_simplify_layouts import _agree, _form, _normal

from dlverify.interpret import Interpreter
from dlverify.simplify import simplify_graph

# p [b, g, q, j, s] x v [b, g, s, k] -> [b, g, q, j, k]; v^T [b, g, k, s] x p^T
# [b, g, s, j, q] -> [b, g, k, j, q]
B, G, Q, J, S, K = 2, 3, 4, 2, 5, 6
_P, _V = (B, G, Q, J, S), (B, G, S, K)
_OUT = (B, Q, K, G, J)


def _pv(b, p, v):
    o = _dot(b, p, v, (B, G, Q, J, K), (4,), (2,), (0, 1), (0, 1))
    return b.op("transpose", [o], _OUT, "float32", {"permutation": (0, 2, 4, 1, 3)})


def _vt_pt(b, p, v):
    vt = b.op("transpose", [v], (B, G, K, S), "float32", {"permutation": (0, 1, 3, 2)})
    pt = b.op("transpose", [p], (B, G, S, J, Q), "float32", {"permutation": (0, 1, 4, 3, 2)})
    o = _dot(b, vt, pt, (B, G, K, J, Q), (3,), (2,), (0, 1), (0, 1))
    return b.op("transpose", [o], _OUT, "float32", {"permutation": (0, 4, 2, 1, 3)})


def test_attention_output_in_either_orientation_reaches_one_form():
    before, one = _normal(_pv, [_P, _V])
    before_other, other = _normal(_vt_pt, [_P, _V])
    _agree(before, one, [_P, _V])
    _agree(before_other, other, [_P, _V])
    assert _form(one) == _form(other)
    # the form: p v in the transpose's order of p's free dims (q, j), then a transpose
    out = next(op for op in other.ops if op.output == other.outputs[0])
    assert out.kind == "transpose"
    dot = next(op for op in other.ops if op.output == out.inputs[0])
    assert dot.kind == "dot_general" and other.tensors[dot.output].shape == (B, G, Q, J, K)


def test_a_split_with_its_residual_inverted_is_caught():
    # the rule twin: the dot' of the split, followed by the inverse of the residual
    # transpose the rule leaves (the residual here is not an involution), computes
    # another value; the shared evaluator tells it from the program's
    before, g = _normal(_vt_pt, [_P, _V])
    out = next(op for op in g.ops if op.output == g.outputs[0])
    residual = tuple(out.params["permutation"])
    inverse = tuple(residual.index(k) for k in range(len(residual)))
    assert inverse != residual
    twin = copy.deepcopy(g)
    bad = next(op for op in twin.ops if op.output == twin.outputs[0])
    bad.params = {"permutation": inverse}
    src = twin.tensors[bad.inputs[0]].shape
    twin.tensors[bad.output].shape = tuple(src[k] for k in inverse)
    rng = np.random.default_rng(3)
    ins = [[rng.standard_normal(s).astype(np.float32)] for s in (_P, _V)]
    a = Interpreter(before, 1).run(ins)[before.outputs[0]][0]
    b = Interpreter(twin, 1).run(ins)[twin.outputs[0]][0]
    assert a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("perm", list(itertools.permutations(range(5))))
def test_every_transpose_of_a_dot_and_of_its_swapped_dot_reach_one_form(perm):
    # [b, g, q, j, k] of p v, and the same value from v^T p^T, transposed by every
    # perm: one form each time (no size-1 dims), and the rewrite an identity
    out = tuple((B, G, Q, J, K)[j] for j in perm)
    swapped = (0, 1, 4, 2, 3)       # dot(v^T, p^T)'s dims as p v's: [b, g, k, q, j]

    def direct(b, p, v):
        o = _dot(b, p, v, (B, G, Q, J, K), (4,), (2,), (0, 1), (0, 1))
        return b.op("transpose", [o], out, "float32", {"permutation": perm})

    def other(b, p, v):
        o = _dot(b, v, p, (B, G, K, Q, J), (2,), (4,), (0, 1), (0, 1))
        return b.op("transpose", [o], out, "float32",
                    {"permutation": tuple(swapped.index(j) for j in perm)})
    before_one, one = _normal(direct, [_P, _V])
    before_two, two = _normal(other, [_P, _V])
    assert _form(one) == _form(two), perm
    _agree(before_one, one, [_P, _V])
    _agree(before_two, two, [_P, _V])


def test_a_transpose_interleaving_free_dims_by_a_size_1_dim_stays():
    # XLA's MoE dispatch with one expert per rank: [1, c, t] x [t, m, e] -> [1, c, m, e]
    # transposed to [m, 1, e, c]: the size-1 (a rank's share of the experts, which the
    # program batches) alone interleaves; splitting it here would order it where the
    # other side's batch dim does not go
    def build(b, x, w):
        d = _dot(b, x, w, (1, 8, 4, 3), (2,), (0,))
        return b.op("transpose", [d], (4, 1, 3, 8), "float32", {"permutation": (2, 0, 3, 1)})
    g, ids = _graph(build, [(1, 8, 5), (5, 4, 3)])
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    assert _form(before) == _form(g)


def test_a_size_1_dim_beside_interleaved_sized_free_dims_goes_with_its_operand():
    # the program's weight gradient of the output projection: its attention output
    # [b, g, q, j, 1, k] (v's head slice keeps a size-1 dim) transposed to
    # [g, j, 1, k, b, q]; the other side's dot computes it batched over (g, b): one form
    shape = (B, G, Q, J, 1, K)
    pv = (B, G, S, 1, K)

    def direct(b, p, v):
        o = _dot(b, p, v, shape, (4,), (2,), (0, 1), (0, 1))
        return b.op("transpose", [o], (G, J, 1, K, B, Q), "float32",
                    {"permutation": (1, 3, 4, 5, 0, 2)})

    def batched_gb(b, p, v):
        pg = b.op("transpose", [p], (G, B, J, Q, S), "float32", {"permutation": (1, 0, 3, 2, 4)})
        vg = b.op("transpose", [v], (G, B, S, 1, K), "float32", {"permutation": (1, 0, 2, 3, 4)})
        o = _dot(b, pg, vg, (G, B, J, Q, 1, K), (4,), (2,), (0, 1), (0, 1))
        return b.op("transpose", [o], (G, J, 1, K, B, Q), "float32",
                    {"permutation": (0, 2, 4, 5, 1, 3)})
    before, one = _normal(direct, [_P, pv])
    before_two, two = _normal(batched_gb, [_P, pv])
    _agree(before, one, [_P, pv])
    _agree(before_two, two, [_P, pv])
    assert _form(one) == _form(two)


# ------------------------------------------------------------------ an HLO pair
_SEQ = """HloModule seq

ENTRY %main (p: f32[2,4,3,2,3], v: f32[2,4,3,6], wo: f32[6,4,2,7]) -> f32[2,3,7] {
  %p = f32[2,4,3,2,3]{4,3,2,1,0} parameter(0)
  %v = f32[2,4,3,6]{3,2,1,0} parameter(1)
  %wo = f32[6,4,2,7]{3,2,1,0} parameter(2)
  %o = f32[2,4,3,2,6]{4,3,2,1,0} dot(f32[2,4,3,2,3]{4,3,2,1,0} %p, f32[2,4,3,6]{3,2,1,0} %v), lhs_batch_dims={0,1}, lhs_contracting_dims={4}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %ot = f32[2,3,6,4,2]{4,3,2,1,0} transpose(f32[2,4,3,2,6]{4,3,2,1,0} %o), dimensions={0,2,4,1,3}
  ROOT %y = f32[2,3,7]{2,1,0} dot(f32[2,3,6,4,2]{4,3,2,1,0} %ot, f32[6,4,2,7]{3,2,1,0} %wo), lhs_contracting_dims={2,3,4}, rhs_contracting_dims={0,1,2}
}
"""

# the KV groups g split over 2 ranks (p, v along g, wo's g rows); XLA's v^T p^T, then
# the output projection's partial sums reduced. PT: how the rank transposes p
_DIST = """HloModule dist, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[2,2,3,2,3], v: f32[2,2,3,6], wo: f32[6,2,2,7]) -> f32[2,3,7] {
  %p = f32[2,2,3,2,3]{4,3,2,1,0} parameter(0), sharding={devices=[1,2,1,1,1]0,1}
  %v = f32[2,2,3,6]{3,2,1,0} parameter(1), sharding={devices=[1,2,1,1]0,1}
  %wo = f32[6,2,2,7]{3,2,1,0} parameter(2), sharding={devices=[1,2,1,1]0,1}
  %vt = f32[2,2,6,3]{3,2,1,0} transpose(f32[2,2,3,6]{3,2,1,0} %v), dimensions={0,1,3,2}
  %pt = f32[2,2,3,2,3]{4,3,2,1,0} transpose(f32[2,2,3,2,3]{4,3,2,1,0} %p), dimensions=PT
  %o = f32[2,2,6,2,3]{4,3,2,1,0} dot(f32[2,2,6,3]{3,2,1,0} %vt, f32[2,2,3,2,3]{4,3,2,1,0} %pt), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %ot = f32[2,3,6,2,2]{4,3,2,1,0} transpose(f32[2,2,6,2,3]{4,3,2,1,0} %o), dimensions={0,4,2,1,3}
  %part = f32[2,3,7]{2,1,0} dot(f32[2,3,6,2,2]{4,3,2,1,0} %ot, f32[6,2,2,7]{3,2,1,0} %wo), lhs_contracting_dims={2,3,4}, rhs_contracting_dims={0,1,2}
  ROOT %y = f32[2,3,7]{2,1,0} all-reduce(f32[2,3,7]{2,1,0} %part), replica_groups={{0,1}}, use_global_device_ids=true, channel_id=1, to_apply=%sum
}
"""


def test_compiled_attention_output_in_xlas_orientation_verifies(tmp_path):
    from hlo_pairs import assert_pair_verifies
    # p^T: [b, g, q, j, s] -> [b, g, s, j, q]
    assert_pair_verifies(tmp_path, _SEQ, _DIST.replace("PT", "{0,1,4,3,2}"),
                         ["out0 = r0.out0  (replicated on all 2 ranks)"])


def test_its_twin_contracting_the_query_dim_is_not_verified(tmp_path):
    # the twin takes p as it is for p^T (q = s = 3): it contracts the queries, not the keys
    res = verify_texts(tmp_path, _SEQ, _DIST.replace("PT", "{0,1,2,3,4}"))
    assert not res.verified
    assert res.failures
