"""Normal forms behind the compiled GQA/MQA training steps (examples/gqa_replicated_kv.py):

* a dot operand that regroups dims (XLA's Q, [b*s, j*d] -> [b, s*j, d], contracted over
  s*j against dS^T's merged (s, j)) is read as the merge of its operand's dims split
  finest (simplify_merged.refinement, used by simplify.split_contraction), so the dot
  contracts (s, j) as the program does;
* a dot whose lhs merges size-1 dims at the boundary of its free and contracted dims
  (an output projection of one KV head, [b, s, 1, j, d] -> [b, s, 1*j*d]) reaches a
  fixpoint: simplify_merged.unit_dims_out_of_contraction moves the size-1 dims out of the
  contraction and simplify.sink_dot_reshape no longer takes them back in (the two used
  to alternate until the pass limit).

Each rewrite is checked with the shared evaluator; a hand-written HLO pair contracting
a regrouped operand verifies, its twin merging the contracted dims in the other order
does not."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hlo_pairs import verify_texts
from test_simplify import _dot, _graph

from dlverify.interpret import Interpreter
from dlverify.ir import Graph
from dlverify.simplify import simplify_graph
from dlverify.simplify_merged import refinement


def _same_values(before: Graph, after: Graph, in_shapes) -> None:
    ins = [[np.random.default_rng(i).standard_normal(s).astype(np.float32)]
           for i, s in enumerate(in_shapes)]
    outs = [Interpreter(h, 1).run(ins)[h.outputs[0]][0] for h in (before, after)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def _dots(g: Graph):
    return [op for op in g.ops if op.kind == "dot_general"]


# ------------------------------------------------------------------ refinement

@pytest.mark.parametrize("src, to, finest", [
    ((16, 8), (2, 16, 4), (2, 8, 2, 4)),            # [b*s, j*d] -> [b, s*j, d]
    ((2, 8, 8), (2, 16, 4), (2, 8, 2, 4)),
    ((6, 4), (2, 6, 2), (2, 3, 2, 2)),
    ((2, 3, 4), (6, 4), (2, 3, 4)),                 # a plain merge: the operand itself
    ((2, 1, 8), (2, 8), (2, 1, 8)),                 # a size-1 dim stands alone
])
def test_the_refinement_is_a_shape_both_sides_merge_from(src, to, finest):
    from dlverify.simplify_forms import _merge_groups
    assert refinement(src, to) == finest
    assert _merge_groups(finest, src) is not None and _merge_groups(finest, to) is not None


@pytest.mark.parametrize("src, to", [((6,), (4,)), ((6, 4), (4, 6)), ((3, 4), (2, 6))])
def test_no_refinement_where_a_boundary_cuts_a_dim(src, to):
    assert refinement(src, to) is None


# ------------------------------------------------------------------ regrouped contraction

def _regrouped_contraction(b, a, y):
    """a [2, 5, 3, 2] merged to [2, 5, 6]; y [6, 4] regrouped to [2, 6, 2]: the dot
    contracts the merged (3, 2) against the regrouped middle dim (batched over 2)."""
    am = b.op("reshape", [a], (2, 5, 6), "float32")
    q = b.op("reshape", [y], (2, 6, 2), "float32")
    return _dot(b, am, q, (2, 5, 2), (2,), (1,), (0,), (0,))


SHAPES = [(2, 5, 3, 2), (6, 4)]


def test_a_regrouped_operand_is_contracted_over_its_finest_dims():
    g, ids = _graph(_regrouped_contraction, SHAPES)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    _same_values(before, g, SHAPES)
    (dot,) = _dots(g)
    assert len(dot.params["lhs_contract"]) == 2 == len(dot.params["rhs_contract"])
    assert not simplify_graph(g, ids)                        # a fixpoint


def test_runs_of_other_sizes_stay_merged():
    # the lhs merges (2, 3) where the rhs's regrouping splits 6 as (3, 2): no pairing
    def build(b, a, y):
        am = b.op("reshape", [a], (2, 5, 6), "float32")
        q = b.op("reshape", [y], (2, 6, 2), "float32")
        return _dot(b, am, q, (2, 5, 2), (2,), (1,), (0,), (0,))
    shapes = [(2, 5, 2, 3), (6, 4)]
    g, ids = _graph(build, shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)
    assert len(dot.params["lhs_contract"]) == 1


# ------------------------------------------------------------------ no alternation

def _one_head_projection(b, o, w):
    """o [2, 8, 1, 8, 4] (one KV head's query group) merged to [2, 8, 32] and contracted
    with w [32, 16] (the output projection of MQA)."""
    om = b.op("reshape", [o], (2, 8, 32), "float32")
    return _dot(b, om, w, (2, 8, 16), (2,), (0,))


def test_size_1_dims_at_the_free_contracted_boundary_reach_a_fixpoint():
    shapes = [(2, 8, 1, 8, 4), (32, 16)]
    g, ids = _graph(_one_head_projection, shapes)
    before = copy.deepcopy(g)
    notes: list[str] = []
    assert simplify_graph(g, ids, notes=notes)
    assert notes == []                                      # no pass limit reached
    _same_values(before, g, shapes)
    assert not simplify_graph(g, ids)


# ------------------------------------------------------------------ HLO pair

SEQ = """HloModule seq

ENTRY %main (a: f32[2,5,3,4], x: f32[6,7], w: f32[7,8]) -> f32[2,5,2] {
  %a = f32[2,5,3,4]{3,2,1,0} parameter(0)
  %x = f32[6,7]{1,0} parameter(1)
  %w = f32[7,8]{1,0} parameter(2)
  %xw = f32[6,8]{1,0} dot(f32[6,7]{1,0} %x, f32[7,8]{1,0} %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %q = f32[2,3,4,2]{3,2,1,0} reshape(f32[6,8]{1,0} %xw)
  ROOT %o = f32[2,5,2]{2,1,0} dot(f32[2,5,3,4]{3,2,1,0} %a, f32[2,3,4,2]{3,2,1,0} %q), lhs_batch_dims={0}, lhs_contracting_dims={2,3}, rhs_batch_dims={0}, rhs_contracting_dims={1,2}
}
"""

# the contracted heads split over 2 ranks (a along its head dim, w's columns); XLA's
# form: the rank's projection [b*s, j*d] regrouped to [b, s*j, d], a's (s, j) merged
DIST = """HloModule dist, num_partitions=2

%sum (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %p, f32[] %q)
}

ENTRY %main (a: f32[2,5,3,2], x: f32[6,7], w: f32[7,4]) -> f32[2,5,2] {
  %a = f32[2,5,3,2]{3,2,1,0} parameter(0), sharding={devices=[1,1,1,2]0,1}
  %x = f32[6,7]{1,0} parameter(1), sharding={replicated}
  %w = f32[7,4]{1,0} parameter(2), sharding={devices=[1,2]0,1}
  %xw = f32[6,4]{1,0} dot(f32[6,7]{1,0} %x, f32[7,4]{1,0} %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %q = f32[2,6,2]{2,1,0} reshape(f32[6,4]{1,0} %xw)
  %am = f32[2,5,6]{2,1,0} reshape(f32[2,5,3,2]{3,2,1,0} %a)
  %part = f32[2,5,2]{2,1,0} dot(f32[2,5,6]{2,1,0} %am, f32[2,6,2]{2,1,0} %q), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %o = f32[2,5,2]{2,1,0} all-reduce(f32[2,5,2]{2,1,0} %part), replica_groups={{0,1}}, use_global_device_ids=true, channel_id=1, to_apply=%sum
}
"""


def test_a_contraction_over_a_regrouped_operand_verifies(tmp_path):
    from hlo_pairs import assert_pair_verifies
    assert_pair_verifies(tmp_path, SEQ, DIST, ["out0 = r0.out0  (replicated on all 2 ranks)"])


def test_its_twin_merging_heads_before_rows_is_not_verified(tmp_path):
    twin = DIST.replace(
        "  %am = f32[2,5,6]{2,1,0} reshape(f32[2,5,3,2]{3,2,1,0} %a)",
        "  %at = f32[2,5,2,3]{3,2,1,0} transpose(f32[2,5,3,2]{3,2,1,0} %a), dimensions={0,1,3,2}\n"
        "  %am = f32[2,5,6]{2,1,0} reshape(f32[2,5,2,3]{3,2,1,0} %at)")
    assert twin != DIST
    assert not verify_texts(tmp_path, SEQ, twin).verified
