"""Normal forms behind the compiled GQA/MQA training steps (examples/gqa_replicated_kv.py):

* a dot operand that regroups dims (XLA's Q, [b*s, j*d] -> [b, s*j, d], contracted over
  s*j against dS^T's merged (s, j)) is read as the merge of its operand's dims split
  finest (simplify_merged.refinement, used by simplify.split_contraction), so the dot
  contracts (s, j) as the program does;
* a dot whose lhs merges size-1 dims at the boundary of its free and contracted dims
  (an output projection of one KV head, [b, s, 1, j, d] -> [b, s, 1*j*d]) reaches a
  fixpoint: simplify_merged.unit_dims_out_of_contraction moves the size-1 dims out of the
  contraction and simplify.sink_dot_reshape no longer takes them back in (the two used
  to alternate until the pass limit);
* a dot over a contracted concatenation that one program has and the other not (XLA's
  fused concat(a, c) . concat(b, d) for a.b + c.d; simplify_accumulate.py's merge of a
  rank's dK wk_r^T + dV wv_r^T, whose size-1 KV-head dims read as micro-batches) is the
  sum of the pieces' dots in both (rewrites.split_contracted_concatenations), a
  contracted pair of size-1 dims of a piece dropped.

Each rewrite is checked with the shared evaluator; a hand-written HLO pair contracting
a regrouped operand verifies, its twin merging the contracted dims in the other order
does not."""
from __future__ import annotations

import copy

import pytest
from hlo_pairs import verify_texts
from test_simplify import _dot, _graph
from test_unit_layouts import _same_values

from dlverify.ir import Graph
from dlverify.rewrites import split_contracted_concatenations
from dlverify.simplify import simplify_graph
from dlverify.simplify_merged import refinement


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


# ------------------------------------------------------------------ contracted concatenations

def _fused(b, a, c, w, v):
    """concat(a, c; 1) . concat(w, v; 0): a.w + c.v as XLA fuses it."""
    n = b.graph.tensors[a].shape[1] + b.graph.tensors[c].shape[1]
    ac = b.op("concatenate", [a, c], (4, n), "float32", {"dimension": 1})
    wv = b.op("concatenate", [w, v], (n, 5), "float32", {"dimension": 0})
    return _dot(b, ac, wv, (4, 5), (1,), (0,))


def _summed(b, a, c, w, v):
    return b.op("add", [_dot(b, a, w, (4, 5), (1,), (0,)), _dot(b, c, v, (4, 5), (1,), (0,))],
                (4, 5), "float32")


def _unit_pieces(b, a, c, w, v):
    """Pieces of size 1 along the concatenated dim (a rank's one KV head of K and V)."""
    ac = b.op("concatenate", [a, c], (4, 2, 3), "float32", {"dimension": 1})
    wv = b.op("concatenate", [w, v], (2, 3, 5), "float32", {"dimension": 0})
    return _dot(b, ac, wv, (4, 5), (1, 2), (0, 1))


@pytest.mark.parametrize("build, shapes, rank", [
    (_fused, [(4, 3), (4, 2), (3, 5), (2, 5)], 2),
    (_unit_pieces, [(4, 1, 3), (4, 1, 3), (1, 3, 5), (1, 3, 5)], 2),
])
def test_a_contracted_concatenation_one_side_has_is_split_in_both(build, shapes, rank):
    seq, _ = _graph(_summed, [(4, 3), (4, 3), (3, 5), (3, 5)])
    g, ids = _graph(build, shapes)
    before = copy.deepcopy(g)
    assert split_contracted_concatenations(seq, g, ids) == [g]     # (seq has none to split)
    _same_values(before, g, shapes)
    assert not any(op.kind == "concatenate" for op in g.ops)
    for dot in _dots(g):                                            # no size-1 pair contracted
        lhs, rhs = (g.tensors[t].shape for t in dot.inputs)
        assert len(lhs) == len(rhs) == rank
        assert all(lhs[i] != 1 or rhs[j] != 1
                   for i, j in zip(dot.params["lhs_contract"], dot.params["rhs_contract"]))


def test_contracted_concatenations_both_sides_have_stay_fused():
    shapes = [(4, 3), (4, 2), (3, 5), (2, 5)]
    seq, _ = _graph(_fused, shapes)
    g, ids = _graph(_fused, shapes)
    assert split_contracted_concatenations(seq, g, ids) == []
    assert any(op.kind == "concatenate" for op in g.ops)


@pytest.mark.parametrize("nested", [False, True])
def test_micro_batches_of_one_tensor_stay_fused(nested):
    # the lhs pieces are slices of one batch (simplify_accumulate.py's merge of
    # micro-batch dots, the program's one contraction; nested: three micro-batches, the
    # merge of the first two merged with the third): not a sum of different values
    def micro(b, x, w, v):
        cuts = [(0, 2), (2, 3), (3, 6)] if nested else [(0, 3), (3, 6)]
        s = [b.op("slice", [x], (4, hi - lo), "float32",
                  {"start_indices": (0, lo), "limit_indices": (4, hi), "strides": None})
             for lo, hi in cuts]
        if nested:
            s = [b.op("concatenate", s[:2], (4, 3), "float32", {"dimension": 1}), s[2]]
        xs = b.op("concatenate", s, (4, 6), "float32", {"dimension": 1})
        wv = b.op("concatenate", [w, v], (6, 5), "float32", {"dimension": 0})
        return _dot(b, xs, wv, (4, 5), (1,), (0,))
    seq, _ = _graph(_summed, [(4, 3), (4, 3), (3, 5), (3, 5)])
    g, ids = _graph(micro, [(4, 6), (3, 5), (3, 5)])
    assert split_contracted_concatenations(seq, g, ids) == []


# ------------------------------------------------------------------ HLO pairs

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


SEQ_SUM = """HloModule seq

ENTRY %main (a: f32[4,6], b: f32[6,5], c: f32[4,6], d: f32[6,5]) -> f32[4,5] {
  %a = f32[4,6]{1,0} parameter(0)
  %b = f32[6,5]{1,0} parameter(1)
  %c = f32[4,6]{1,0} parameter(2)
  %d = f32[6,5]{1,0} parameter(3)
  %ab = f32[4,5]{1,0} dot(f32[4,6]{1,0} %a, f32[6,5]{1,0} %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %cd = f32[4,5]{1,0} dot(f32[4,6]{1,0} %c, f32[6,5]{1,0} %d), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %o = f32[4,5]{1,0} add(f32[4,5]{1,0} %ab, f32[4,5]{1,0} %cd)
}
"""

# the contraction split over 2 ranks; XLA fuses the rank's two dots into one over the
# concatenated operands, then psums it
DIST_FUSED = """HloModule dist, num_partitions=2

%sum (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %p, f32[] %q)
}

ENTRY %main (a: f32[4,3], b: f32[3,5], c: f32[4,3], d: f32[3,5]) -> f32[4,5] {
  %a = f32[4,3]{1,0} parameter(0), sharding={devices=[1,2]0,1}
  %b = f32[3,5]{1,0} parameter(1), sharding={devices=[2,1]0,1}
  %c = f32[4,3]{1,0} parameter(2), sharding={devices=[1,2]0,1}
  %d = f32[3,5]{1,0} parameter(3), sharding={devices=[2,1]0,1}
  %ac = f32[4,6]{1,0} concatenate(f32[4,3]{1,0} %a, f32[4,3]{1,0} %c), dimensions={1}
  %bd = f32[6,5]{1,0} concatenate(f32[3,5]{1,0} %b, f32[3,5]{1,0} %d), dimensions={0}
  %part = f32[4,5]{1,0} dot(f32[4,6]{1,0} %ac, f32[6,5]{1,0} %bd), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %o = f32[4,5]{1,0} all-reduce(f32[4,5]{1,0} %part), replica_groups={{0,1}}, use_global_device_ids=true, channel_id=1, to_apply=%sum
}
"""


def test_a_fused_contraction_of_two_dots_verifies(tmp_path):
    from hlo_pairs import assert_pair_verifies
    assert_pair_verifies(tmp_path, SEQ_SUM, DIST_FUSED, ["out0 = r0.out0  (replicated on all 2 ranks)"])


def test_its_twin_pairing_a_with_d_is_not_verified(tmp_path):
    twin = DIST_FUSED.replace("concatenate(f32[3,5]{1,0} %b, f32[3,5]{1,0} %d)",
                              "concatenate(f32[3,5]{1,0} %d, f32[3,5]{1,0} %b)")
    assert twin != DIST_FUSED
    assert not verify_texts(tmp_path, SEQ_SUM, twin).verified
