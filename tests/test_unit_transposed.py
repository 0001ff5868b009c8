"""Size-1 dims placed differently by XLA's optimised sequential module (the MQA training
step at TP=4 with the sequential module optimised, examples/gqa_replicated_kv.py):

* unit_transposed.deleted_units_under_transpose: a dot operand transpose(reshape(y)),
  the reshape deleting y's size-1 dims, the other operand with a size-1 free dim, reads
  transpose(y) with those dims back, so it meets the dot that batches over the pair.

The rewrite is checked with the shared evaluator, where it must not fire, and on a
hand-written HLO pair (verifies only with the rule; a twin scrambling an operand is located)."""
from __future__ import annotations

import copy

import pytest
from hlo_pairs import assert_pair_verifies, verify_texts
from test_simplify import _dot, _graph
from test_unit_layouts import _same_values

from dlverify.simplify import simplify_graph
from dlverify.unit_transposed import units_restored


def _kinds(g):
    return [op.kind for op in g.ops]


# ------------------------------------------------------------------ deleted_units_under_transpose

@pytest.mark.parametrize("kept, deleted, perm, order, at", [
    ([0, 2, 3, 4], [1], (0, 3, 1, 2), [0, 1, 4, 2, 3], {0: 0, 1: 2, 2: 3, 3: 4}),
    ([1, 2], [0], (1, 0), [0, 2, 1], {0: 1, 1: 2}),          # a leading size-1 dim
    ([0, 1], [2, 3], (1, 0), [1, 2, 3, 0], {0: 0, 1: 3}),    # two after the last kept
])
def test_units_follow_the_sized_dim_before_them(kept, deleted, perm, order, at):
    assert units_restored(kept, deleted, perm) == (order, at)


def _deleted_form(b, p, o):
    """p [2, 1, 4, 3] (b, g, q, k) with g deleted, transposed to [b, k, q] by the dot's
    operand order; o [2, 4, 1, 5] (b, q, g, d) carries g as a free dim: [b, k, g, d]."""
    pr = b.op("reshape", [p], (2, 4, 3), "float32")
    pt = b.op("transpose", [pr], (2, 3, 4), "float32", {"permutation": (0, 2, 1)})
    return _dot(b, pt, o, (2, 3, 1, 5), (2,), (1,), (0,), (0,))


def _batched_form(b, p, o):
    """The same dot batched over the g pair: [b, g, k, d]."""
    pt = b.op("transpose", [p], (2, 1, 3, 4), "float32", {"permutation": (0, 1, 3, 2)})
    ot = b.op("transpose", [o], (2, 1, 4, 5), "float32", {"permutation": (0, 2, 1, 3)})
    return _dot(b, pt, ot, (2, 1, 3, 5), (3,), (2,), (0, 1), (0, 1))


SHAPES = [(2, 1, 4, 3), (2, 4, 1, 5)]


def test_a_transposed_unit_deletion_is_taken_into_the_dot():
    g, ids = _graph(_deleted_form, SHAPES)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    _same_values(before, g, SHAPES)
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert len(dot.params["lhs_batch"]) == 2                # the size-1 pair batched
    assert not simplify_graph(g, ids)


def test_both_forms_meet_as_one_dot():
    def both(b, p, o):
        one = b.op("reshape", [_deleted_form(b, p, o)], (6, 5), "float32")
        two = b.op("reshape", [_batched_form(b, p, o)], (6, 5), "float32")
        return b.op("add", [one, two], (6, 5), "float32")
    g, ids = _graph(both, SHAPES)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    _same_values(before, g, SHAPES)
    assert _kinds(g).count("dot_general") == 1


def test_no_size_1_free_dim_to_pair_leaves_the_deletion_out():
    # o [2, 4, 5] has no size-1 dim: taken back, g would be a free dim of one side only
    def build(b, p, o):
        pr = b.op("reshape", [p], (2, 4, 3), "float32")
        pt = b.op("transpose", [pr], (2, 3, 4), "float32", {"permutation": (0, 2, 1)})
        return _dot(b, pt, o, (2, 3, 5), (2,), (1,), (0,), (0,))
    shapes = [(2, 1, 4, 3), (2, 4, 5)]
    g, ids = _graph(build, shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    _same_values(before, g, shapes)
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert all(n != 1 for n in g.tensors[dot.inputs[0]].shape)


# ------------------------------------------------------------------ HLO pairs

# the dV-like dot in both forms, each projected and the two added (as XLA's optimised
# sequential MQA step has it); b split over 2 ranks, which compute the batched form once
SEQ_DOTS = """HloModule seq

ENTRY %main (p: f32[4,1,4,3], o: f32[4,4,1,5], w: f32[5,6], v: f32[5,6]) -> f32[12,6] {
  %p = f32[4,1,4,3]{3,2,1,0} parameter(0)
  %o = f32[4,4,1,5]{3,2,1,0} parameter(1)
  %w = f32[5,6]{1,0} parameter(2)
  %v = f32[5,6]{1,0} parameter(3)
  %pr = f32[4,4,3]{2,1,0} reshape(f32[4,1,4,3]{3,2,1,0} %p)
  %t1 = f32[4,3,1,5]{3,2,1,0} dot(f32[4,4,3]{2,1,0} %pr, f32[4,4,1,5]{3,2,1,0} %o), lhs_batch_dims={0}, lhs_contracting_dims={1}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %ot = f32[4,1,4,5]{3,2,1,0} transpose(f32[4,4,1,5]{3,2,1,0} %o), dimensions={0,2,1,3}
  %t2 = f32[4,1,3,5]{3,2,1,0} dot(f32[4,1,4,3]{3,2,1,0} %p, f32[4,1,4,5]{3,2,1,0} %ot), lhs_batch_dims={0,1}, lhs_contracting_dims={2}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %e1 = f32[4,3,1,6]{3,2,1,0} dot(f32[4,3,1,5]{3,2,1,0} %t1, f32[5,6]{1,0} %w), lhs_contracting_dims={3}, rhs_contracting_dims={0}
  %e2 = f32[4,1,3,6]{3,2,1,0} dot(f32[4,1,3,5]{3,2,1,0} %t2, f32[5,6]{1,0} %v), lhs_contracting_dims={3}, rhs_contracting_dims={0}
  %r1 = f32[12,6]{1,0} reshape(f32[4,3,1,6]{3,2,1,0} %e1)
  %r2 = f32[12,6]{1,0} reshape(f32[4,1,3,6]{3,2,1,0} %e2)
  ROOT %s = f32[12,6]{1,0} add(f32[12,6]{1,0} %r1, f32[12,6]{1,0} %r2)
}
"""

DIST_DOTS = """HloModule dist, num_partitions=2

ENTRY %main (p: f32[2,1,4,3], o: f32[2,4,1,5], w: f32[5,6], v: f32[5,6]) -> f32[6,6] {
  %p = f32[2,1,4,3]{3,2,1,0} parameter(0), sharding={devices=[2,1,1,1]0,1}
  %o = f32[2,4,1,5]{3,2,1,0} parameter(1), sharding={devices=[2,1,1,1]0,1}
  %w = f32[5,6]{1,0} parameter(2), sharding={replicated}
  %v = f32[5,6]{1,0} parameter(3), sharding={replicated}
  %ot = f32[2,1,4,5]{3,2,1,0} transpose(f32[2,4,1,5]{3,2,1,0} %o), dimensions={0,2,1,3}
  %t = f32[2,1,3,5]{3,2,1,0} dot(f32[2,1,4,3]{3,2,1,0} %p, f32[2,1,4,5]{3,2,1,0} %ot), lhs_batch_dims={0,1}, lhs_contracting_dims={2}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %e1 = f32[2,1,3,6]{3,2,1,0} dot(f32[2,1,3,5]{3,2,1,0} %t, f32[5,6]{1,0} %w), lhs_contracting_dims={3}, rhs_contracting_dims={0}
  %e2 = f32[2,1,3,6]{3,2,1,0} dot(f32[2,1,3,5]{3,2,1,0} %t, f32[5,6]{1,0} %v), lhs_contracting_dims={3}, rhs_contracting_dims={0}
  %s = f32[2,1,3,6]{3,2,1,0} add(f32[2,1,3,6]{3,2,1,0} %e1, f32[2,1,3,6]{3,2,1,0} %e2)
  ROOT %r = f32[6,6]{1,0} reshape(f32[2,1,3,6]{3,2,1,0} %s)
}
"""

@pytest.mark.parametrize("seq, dist", [(SEQ_DOTS, DIST_DOTS)])
def test_the_pairs_verify(tmp_path, seq, dist):
    assert_pair_verifies(tmp_path, seq, dist, ["out0 = concat(r0.out0, r1.out0; dim 0)"])


def _first_failure_at(tmp_path, seq, twin, starts):
    res = verify_texts(tmp_path, seq, twin)
    assert not res.verified
    lines = {n for n, line in enumerate(twin.splitlines(), 1) if line.startswith(starts)}
    first = res.failures[0]
    assert first.program == "distributed" and first.line in lines, \
        [(f.line, f.message) for f in res.failures[:3]]


def test_a_twin_scrambling_p_is_located(tmp_path):
    # p read through a reshape to [2, 1, 3, 4] transposed back: p's shape, elements moved
    twin = DIST_DOTS.replace(
        "  %ot = ",
        "  %pb = f32[2,1,3,4]{3,2,1,0} reshape(f32[2,1,4,3]{3,2,1,0} %p)\n"
        "  %pw = f32[2,1,4,3]{3,2,1,0} transpose(f32[2,1,3,4]{3,2,1,0} %pb), dimensions={0,1,3,2}\n"
        "  %ot = ").replace("dot(f32[2,1,4,3]{3,2,1,0} %p,", "dot(f32[2,1,4,3]{3,2,1,0} %pw,")
    assert twin.count("%pw") == 2
    _first_failure_at(tmp_path, SEQ_DOTS, twin, ("  %pb", "  %pw"))
