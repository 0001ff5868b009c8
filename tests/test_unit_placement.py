"""More of the size-1 dims' normal form (dlverify/unit_placement.py), for programs whose
size-1 dims are size 1 on both sides (one KV head, examples/gqa_replicated_kv.py's MQA step):

* a sequential reduction over size-1 axes only is the reshape deleting them (one element
  and the reducer's identity); a distributed one stays a reduction (a rank's block of one
  element of a sized dim is a partial term);
* a reshape of a transpose that moves size-1 dims only is one reshape (canonical_units),
  except where the distributed side holds the form of a sequential pair;
* a dot operand reshape(y) reads its size-1 dims where y has them (units_placed_as_operand):
  the program's [b, s, 1, j*d] and [b, 1, s, j*d] readings of [b, 1, s, j, d] meet.

Each rewrite is checked with the shared evaluator on random inputs, and where it must not
fire."""
from __future__ import annotations

import copy

import pytest
from test_simplify import _dot, _graph
from test_unit_layouts import _dots, _same_values

from dlverify.simplify import simplify_graph
from dlverify.unit_layouts import unit_layouts_as_sequential
from dlverify.unit_placement import canonical_units, unit_order, units_placed_as_operands

F32 = "float32"


# ------------------------------------------------------------------ reductions over size-1 axes

def _unit_row_term(kind):
    """The softmax gradient's row term: summed over the size-1 group dim, negated, broadcast
    back along the keys ([b, 1, q] -> [b, q] -> [b, 1, q, k])."""
    def build(b, t):
        r = b.op(kind, [t], (2, 3), F32, {"axes": (1,)})
        n = b.op("neg", [r], (2, 3), F32)
        return b.op("broadcast_in_dim", [n], (2, 1, 3, 4), F32, {"broadcast_dimensions": (0, 2)})
    return build


@pytest.mark.parametrize("kind", ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
def test_a_sequential_reduction_over_size_1_axes_is_a_reshape(kind):
    shapes = [(2, 1, 3)]
    g, ids = _graph(_unit_row_term(kind), shapes)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    _same_values(before, g, shapes)
    assert {op.kind for op in g.ops} == {"neg", "broadcast_in_dim"}    # (the reshape sank in)
    assert not simplify_graph(g, ids)                                   # a fixpoint


def test_a_reduction_over_a_sized_axis_or_on_the_distributed_side_stays():
    # the rule's twins: a sum over a sized axis is no reshape; on the distributed graph a
    # size-1 dim may be a rank's block of one element of a sized dim (the FSDP loss's batch)
    def sized(b, t):
        return b.op("reduce_sum", [t], (2, 1, 3), F32, {"axes": (3,)})
    g, ids = _graph(sized, [(2, 1, 3, 4)])
    simplify_graph(g, ids)
    assert [op.kind for op in g.ops] == ["reduce_sum"]
    partner, _ = _graph(_unit_row_term("reduce_sum"), [(2, 2, 3)])
    g, ids = _graph(_unit_row_term("reduce_sum"), [(2, 1, 3)])
    simplify_graph(g, ids, partner=partner)
    assert "reduce_sum" in {op.kind for op in g.ops}


# ------------------------------------------------------------------ a reshape of a unit move

def _moved_then_flattened(b, o, perm=(0, 2, 1, 3, 4)):
    """o [b, 1, s, j, d] moved to [b, s, 1, j, d] (perm) and flattened to [b, s, 1, j*d]."""
    shape = tuple(b.graph.tensors[o].shape[d] for d in perm)
    t = b.op("transpose", [o], shape, F32, {"permutation": perm})
    return b.op("reshape", [t], shape[:3] + (shape[3] * shape[4],), F32)


def test_a_reshape_of_a_unit_move_is_one_reshape():
    shapes = [(2, 1, 3, 2, 4)]
    g, ids = _graph(_moved_then_flattened, shapes)
    before = copy.deepcopy(g)
    assert canonical_units(g, ids)
    _same_values(before, g, shapes)
    assert [op.kind for op in g.ops] == ["reshape"]
    assert not canonical_units(g, ids)                                  # a fixpoint


def test_a_reshape_of_a_transpose_of_sized_dims_or_of_a_kept_pair_stays():
    # the rule's twins: the transpose moves sized dims (s after j: elements move), or
    # `keep` holds the pair (the distributed side of a sequential pair whose g is sized)
    g, ids = _graph(lambda b, o: _moved_then_flattened(b, o, (0, 1, 3, 2, 4)), [(2, 1, 3, 2, 4)])
    assert not canonical_units(g, ids)
    g, ids = _graph(_moved_then_flattened, [(2, 1, 3, 2, 4)])
    kept = []
    assert not canonical_units(g, ids, lambda *shapes, first: kept.append(first) or True)
    assert kept == ["transpose"]


# ------------------------------------------------------------------ size-1 dims of a dot operand

@pytest.mark.parametrize("ys, shape, placed", [
    ((2, 1, 8, 2, 4), (2, 8, 1, 8), (2, 1, 8, 8)),      # the flattened attention output
    ((2, 1, 8, 2, 4), (2, 1, 8, 8), (2, 1, 8, 8)),      # already so
    ((2, 8, 1, 4), (2, 32, 1), (2, 32, 1)),             # a size-1 dim inside a merged run
])
def test_size_1_dims_go_where_the_reshapes_operand_has_them(ys, shape, placed):
    assert unit_order(ys, shape) == placed


@pytest.mark.parametrize("ys, shape", [
    ((2, 8, 4), (2, 1, 32)),            # a size-1 dim inserted: no place to read it from
    ((2, 1, 8, 4), (2, 32)),            # deleted
    ((2, 1, 8, 4), (2, 4, 1, 8)),       # not a merge of y's sized dims in order
])
def test_no_placement_for_other_reshapes(ys, shape):
    assert unit_order(ys, shape) is None


def _flattened_projection(b, o, w, units_at):
    """o [b, 1, s, j, d] flattened with its size-1 dim at `units_at` and projected by w
    [j*d, n] (the size-1 dim a free dim of the dot)."""
    shape = [2, 3, 8]
    shape.insert(units_at, 1)
    r = b.op("reshape", [o], tuple(shape), F32)
    out = list(shape[:3]) + [5]
    return _dot(b, r, w, tuple(out), (3,), (0,))


def test_a_dot_operands_size_1_dims_are_read_where_its_source_has_them():
    shapes = [(2, 1, 3, 2, 4), (8, 5)]
    g, ids = _graph(lambda b, o, w: _flattened_projection(b, o, w, 2), shapes)
    before = copy.deepcopy(g)
    assert units_placed_as_operands(g, ids)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)
    assert g.tensors[dot.inputs[0]].shape == (2, 1, 3, 8)
    assert not units_placed_as_operands(g, ids)                         # a fixpoint


def _program_projection(b, o, w):
    """The program's output projection: o [b, g, s, j, d] moved to [b, s, g, j, d] and
    flattened to [b, s, g, j*d] (a unit move when g = 1)."""
    t = _moved_then_flattened(b, o)
    shape = b.graph.tensors[t].shape
    return _dot(b, t, w, shape[:3] + (5,), (3,), (0,))


@pytest.mark.parametrize("g, moved", [(1, True), (2, False)])
def test_the_distributed_dot_moves_its_size_1_dims_only_to_fit_the_programs(g, moved):
    # g = 1: the program's dot reads [b, 1, s, j*d] in its normal form (its unit move is a
    # reshape, read where o has g), which the rank's [b, s, 1, j*d] does not fit; the
    # rule's twin, g = 2: the rank's size-1 dim is a block of the program's sized g, and
    # the dot fits as it is
    seq, _ = _graph(_program_projection, [(2, g, 3, 2, 4), (8, 5)])
    shapes = [(2, 1, 3, 2, 4), (8, 5)]
    g_, ids = _graph(lambda b, o, w: _flattened_projection(b, o, w, 2), shapes)
    before = copy.deepcopy(g_)
    unit_layouts_as_sequential(seq, g_, ids)
    _same_values(before, g_, shapes)
    (dot,) = _dots(g_)
    assert g_.tensors[dot.inputs[0]].shape == ((2, 1, 3, 8) if moved else (2, 3, 1, 8))
    if moved:
        (seq_dot,) = _dots(seq)
        assert seq.tensors[seq_dot.inputs[0]].shape == (2, 1, 3, 8)


# ------------------------------------------------------------------ a unit move under a transpose

def _scaled_scores_moved(b, kq):
    """XLA's scores k q^T [b, g, s_k, j, s_q], the size-1 j moved by a reshape to
    [b, g, j, s_k, s_q] and transposed to the program's [b, g, j, s_q, s_k]."""
    r = b.op("reshape", [kq], (2, 1, 1, 3, 4), F32)
    return b.op("transpose", [r], (2, 1, 1, 4, 3), F32, {"permutation": (0, 1, 2, 4, 3)})


def test_a_unit_move_under_a_transpose_is_one_transpose():
    shapes = [(2, 1, 3, 1, 4)]
    g, ids = _graph(_scaled_scores_moved, shapes)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    _same_values(before, g, shapes)
    assert [(op.kind, op.params["permutation"]) for op in g.ops] == [("transpose", (0, 1, 3, 4, 2))]
    assert not simplify_graph(g, ids)                                   # a fixpoint


def test_a_transpose_of_a_regrouping_reshape_stays():
    # the rule's twins: a reshape that merges sized dims, or inserts a size-1 dim (of
    # another rank: no permutation of y), is no unit move
    g, ids = _graph(lambda b, y: b.op("transpose", [b.op("reshape", [y], (2, 12), F32)],
                                      (12, 2), F32, {"permutation": (1, 0)}), [(2, 3, 4)])
    simplify_graph(g, ids)
    assert [op.kind for op in g.ops] == ["reshape", "transpose"]
    g, ids = _graph(lambda b, y: b.op("transpose", [b.op("reshape", [y], (2, 1, 3, 4), F32)],
                                      (2, 1, 4, 3), F32, {"permutation": (0, 1, 3, 2)}),
                    [(2, 3, 4)])
    simplify_graph(g, ids)
    assert "reshape" in {op.kind for op in g.ops}
