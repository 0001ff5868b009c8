"""Size-1 dims the distributed module never had, placed as the sequential program has
them (dlverify/unit_layouts.py): a dot's lone size-1 free dim batched, or deleted, to
the dim counts of the sequential dots; a chain of reshapes and transposes written as
the sequential program's reshape-then-transpose (or transpose-then-reshape) when it
places every element alike. Each rewrite is checked numerically with the shared
evaluator (and where it must not fire); a hand-written HLO pair (two KV heads, one per
rank, the head sliced out of the K projection without its size-1 dim, as XLA writes it)
verifies, its twin slicing the other head does not and is located; the compiled GQA
example and its wrong-head twin likewise. dlverify/unit_placement.py: a unit move under a
transpose in one form, and a deleted head read through the program's transpose (the
compiled GQA training step verifies, its averaged-gradient twin is located)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, assert_pair_verifies, example_module, verify_texts
from test_simplify import _dot, _graph

from dlverify.interpret import Interpreter
from dlverify.ir import Graph
from dlverify.simplify import simplify_graph
from dlverify.unit_layouts import dot_roles, unit_layouts_as_sequential
from dlverify.unit_placement import canonical_form, canonical_units


def _same_values(before: Graph, after: Graph, in_shapes) -> None:
    ins = [[np.random.default_rng(i).standard_normal(s).astype(np.float32)]
           for i, s in enumerate(in_shapes)]
    outs = [Interpreter(h, 1).run(ins)[h.outputs[0]][0] for h in (before, after)]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6)


def _partner(build, in_shapes) -> Graph:
    g, ids = _graph(build, in_shapes)
    simplify_graph(g, ids)
    return g


def _dots(g: Graph):
    return [op for op in g.ops if op.kind == "dot_general"]


# ------------------------------------------------------------------ lone size-1 free dims

def _attention_scores(b, q, k):
    """q [b, 1, s, d] (a rank's one head, a free dim), k [b, s, d] (no head dim)."""
    return _dot(b, q, k, (2, 1, 3, 5), (3,), (2,), (0,), (0,))


def _batched_scores(b, q, k):
    """The program's form: both batched over (b, heads)."""
    return _dot(b, q, k, (2, 2, 3, 5), (3,), (3,), (0, 1), (0, 1))


SHAPES = [(2, 1, 3, 4), (2, 5, 4)]


def test_a_lone_size_1_free_dim_is_batched_as_the_sequential_dots_are():
    partner = _partner(_batched_scores, [(2, 2, 3, 4), (2, 2, 5, 4)])
    g, ids = _graph(_attention_scores, SHAPES)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids, partner=partner)
    _same_values(before, g, SHAPES)
    (dot,) = _dots(g)
    assert len(dot.params["lhs_batch"]) == 2 and dot_roles(g) <= dot_roles(partner)
    assert not simplify_graph(g, ids, partner=partner)      # a fixpoint


@pytest.mark.parametrize("partner_build, shapes", [
    (None, None),                                           # no partner: the rule is off
    (_attention_scores, SHAPES),                            # the partner has this very form
    (lambda b, x, w: _dot(b, x, w, (3, 5), (1,), (0,)), [(3, 4), (4, 5)]),   # nothing fits
])
def test_a_lone_size_1_free_dim_stays_free_otherwise(partner_build, shapes):
    partner = None if partner_build is None else _partner(partner_build, shapes)
    g, ids = _graph(_attention_scores, SHAPES)
    simplify_graph(g, ids, partner=partner)
    (dot,) = _dots(g)
    assert len(dot.params["lhs_batch"]) == 1


def _output_projection(b, o, w):
    """o [b, s, 1, e] (a rank's head, merged with its e into a contraction by the
    program, kept apart by the normal form) times w [e, n]."""
    return _dot(b, o, w, (2, 3, 1, 5), (3,), (0,))


def test_a_lone_size_1_free_dim_is_deleted_as_the_sequential_dots_have_none():
    seq, _ = _graph(lambda b, x, w: _dot(b, x, w, (2, 3, 5), (2,), (0,)), [(2, 3, 8), (8, 5)])
    g, ids = _graph(_output_projection, [(2, 3, 1, 4), (4, 5)])
    before = copy.deepcopy(g)
    assert unit_layouts_as_sequential(seq, g, ids)
    _same_values(before, g, [(2, 3, 1, 4), (4, 5)])
    (dot,) = _dots(g)
    assert g.tensors[dot.inputs[0]].shape == (2, 3, 4)


# ------------------------------------------------------------------ size-1 pairs: batch or contract

def _projection_with_units(b, p, v, w):
    """o = p v batched over (b, the rank's one head), [b, 1, s, e], times w [1, e, n], the
    two size-1 dims free (as unit_dims_into_dot takes XLA's deleted head dim back)."""
    o = _dot(b, p, v, (2, 1, 3, 4), (3,), (2,), (0, 1), (0, 1))
    return _dot(b, o, w, (2, 1, 3, 1, 5), (3,), (1,))


PROJ_SHAPES = [(2, 1, 3, 3), (2, 1, 3, 4), (1, 4, 5)]


def _contracted_heads(b, o, w):
    """The program's output projection: (h, e) contracted."""
    return _dot(b, o, w, (2, 3, 5), (2, 3), (0, 1))


def _batched_heads(b, o, w):
    """A program batching over the heads (KV groups) instead."""
    return _dot(b, o, w, (2, 2, 3, 5), (3,), (1,), (2,), (0,))


def _free_heads(b, o, w):
    """A program keeping both dims free (query slots beside KV slots), o [b, h, s, e]."""
    return _dot(b, o, w, (2, 2, 3, 2, 5), (3,), (1,))


@pytest.mark.parametrize("partner_build, partner_shapes, roles", [
    (_contracted_heads, [(2, 3, 2, 4), (2, 4, 5)], (0, 2)),      # contracted, as the program
    (_batched_heads, [(2, 3, 2, 4), (2, 4, 5)], (1, 1)),         # batched, as the program
    (_free_heads, [(2, 2, 3, 4), (2, 4, 5)], (0, 1)),            # left free, as the program
    (None, None, (1, 1)),                                        # no partner: batched
])
def test_a_size_1_pair_takes_the_sequential_dots_role(partner_build, partner_shapes, roles):
    partner = None if partner_build is None else _partner(partner_build, partner_shapes)
    g, ids = _graph(_projection_with_units, PROJ_SHAPES)
    before = copy.deepcopy(g)
    simplify_graph(g, ids, partner=partner)
    _same_values(before, g, PROJ_SHAPES)
    dot = _dots(g)[-1]                                     # (the projection)
    assert (len(dot.params["lhs_batch"]), len(dot.params["lhs_contract"])) == roles
    assert not simplify_graph(g, ids, partner=partner)      # a fixpoint


def _projection_of_softmax_like(b, p, v, w):
    """_projection_with_units with an elementwise op between the head-batched dot and the
    projection (the rank's attention probabilities are exp(...) of its scores)."""
    o = _dot(b, p, v, (2, 1, 3, 4), (3,), (2,), (0, 1), (0, 1))
    e = b.op("exp", [o], (2, 1, 3, 4), "float32")
    return _dot(b, e, w, (2, 1, 3, 1, 5), (3,), (1,))


def test_a_size_1_pair_beside_a_value_of_a_head_batched_dot_is_contracted_as_the_program():
    partner = _partner(_contracted_heads, [(2, 3, 2, 4), (2, 4, 5)])
    g, ids = _graph(_projection_of_softmax_like, PROJ_SHAPES)
    before = copy.deepcopy(g)
    simplify_graph(g, ids, partner=partner)
    _same_values(before, g, PROJ_SHAPES)
    dot = _dots(g)[-1]
    assert (len(dot.params["lhs_batch"]), len(dot.params["lhs_contract"])) == (0, 2)
    assert not simplify_graph(g, ids, partner=partner)      # a fixpoint


def test_a_micro_batch_pair_apart_from_the_contraction_stays_batched():
    # x^T [1 (a micro-batch), d, b] and dh [b, 1, f]: the size-1 pair does not sit next to
    # the contracted b in x^T; the program's weight gradient contracts (micro-batches, b)
    # in one dot, the rank sums its micro-batches' dots (simplify_accumulate.py): batched
    partner = _partner(lambda b, x, g: _dot(b, x, g, (3, 5), (0, 2), (1, 0)), [(4, 3, 2), (2, 4, 5)])
    shapes = [(1, 3, 2), (2, 1, 5)]
    g, ids = _graph(lambda b, x, h: _dot(b, x, h, (1, 3, 1, 5), (2,), (0,)), shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids, partner=partner)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)
    assert len(dot.params["lhs_batch"]) == 1 and len(dot.params["lhs_contract"]) == 1


def test_a_sized_pair_is_never_contracted_for_the_program():
    # the rule's twin: a pair of size 2 free in both operands contracted would sum what the
    # dot keeps apart (no identity): the rule takes size-1 pairs only, whatever the program
    partner = _partner(_contracted_heads, [(2, 3, 2, 4), (2, 4, 5)])
    shapes = [(2, 3, 2, 4), (2, 4, 5)]
    g, ids = _graph(lambda b, o, w: _dot(b, o, w, (2, 3, 2, 2, 5), (3,), (1,)), shapes)
    simplify_graph(g, ids, partner=partner)
    (dot,) = _dots(g)
    assert len(dot.params["lhs_contract"]) == 1


def test_lone_size_1_dims_are_batched_and_deleted_to_the_sequential_dots():
    # q [b, s, 1 (a query slot of a fused QKV), 1 (the rank's head), d], k [b, d, t] (no
    # head dim): one size-1 dim batched (a size-1 dim inserted into k), the other deleted
    partner = _partner(_batched_scores, [(2, 2, 3, 4), (2, 2, 5, 4)])
    shapes = [(2, 3, 1, 1, 4), (2, 4, 5)]
    g, ids = _graph(lambda b, q, k: _dot(b, q, k, (2, 3, 1, 1, 5), (4,), (1,), (0,), (0,)),
                    shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids, partner=partner)
    unit_layouts_as_sequential(partner, g, ids)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)
    assert dot_roles(g) <= dot_roles(partner) and len(dot.params["lhs_batch"]) == 2


def _pv_then_weight_gradient(b, p, v, dy, h):
    """o = p v batched over (b, h), [b, h, s, k]; the weight gradient dy^T o over (b, s):
    the program keeps h ([d, h, k]); a rank with h = 1 reads o with h deleted."""
    o = _dot(b, p, v, (2, h, 3, 4), (3,), (2,), (0, 1), (0, 1))
    if h == 1:
        r = b.op("reshape", [o], (2, 3, 4), "float32")
        return _dot(b, dy, r, (5, 4), (1, 2), (0, 1))
    t = b.op("transpose", [o], (2, 3, h, 4), "float32", {"permutation": (0, 2, 1, 3)})
    return _dot(b, dy, t, (5, h, 4), (1, 2), (0, 1))


def test_a_deleted_head_is_taken_into_the_dot_where_the_program_keeps_it():
    # unit_dims_into_dot keeps a head the dot computing o batched out of a dot contracting
    # its neighbours (the program's flattened [h*e] contraction, one head per rank); the
    # program's weight gradient keeps h free, so the dot reads o with it
    partner = _partner(lambda b, p, v, dy: _pv_then_weight_gradient(b, p, v, dy, 2),
                       [(2, 2, 3, 3), (2, 2, 3, 4), (5, 2, 3)])
    shapes = [(2, 1, 3, 3), (2, 1, 3, 4), (5, 2, 3)]
    g, ids = _graph(lambda b, p, v, dy: _pv_then_weight_gradient(b, p, v, dy, 1), shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids, partner=partner)
    _same_values(before, g, shapes)
    assert any(len(op.params["lhs_contract"]) == 2 and 1 in g.tensors[op.inputs[1]].shape
               for op in _dots(g))
    g, ids = _graph(lambda b, p, v, dy: _pv_then_weight_gradient(b, p, v, dy, 1), shapes)
    simplify_graph(g, ids)                                   # (no partner: kept out)
    assert not any(len(op.params["lhs_contract"]) == 2 and 1 in g.tensors[op.inputs[1]].shape
                   for op in _dots(g))


# ------------------------------------------------------------------ layout chains

def _seq_split_then_transpose(b, x):
    """[s, g*d] -> [s, g, d] -> [g, s, d]: the program's heads."""
    r = b.op("reshape", [x], (3, 2, 4), "float32")
    return b.op("transpose", [r], (2, 3, 4), "float32", {"permutation": (1, 0, 2)})


def _seq_transpose_then_merge(b, x):
    """[g, s, d] -> [s, g, d] -> [s, g*d]: the heads merged back."""
    t = b.op("transpose", [x], (3, 2, 4), "float32", {"permutation": (1, 0, 2)})
    return b.op("reshape", [t], (3, 8), "float32")


@pytest.mark.parametrize("seq_build, seq_shape, dist_build, dist_shape, kinds", [
    # a rank's head [s, d] with its size-1 head dim inserted in front: [1, s, d]
    (_seq_split_then_transpose, (3, 8),
     lambda b, y: b.op("reshape", [y], (1, 3, 4), "float32"), (3, 4), ["reshape", "transpose"]),
    # [1, s, d] -> [s, d]: the head dim of one deleted
    (_seq_transpose_then_merge, (2, 3, 4),
     lambda b, y: b.op("reshape", [y], (3, 4), "float32"), (1, 3, 4), ["transpose", "reshape"]),
    # through a transpose: [s, d] -> [d, s] -> [1, d, s] is [s, 1, d] moved by (1, 2, 0)
    (lambda b, x: b.op("transpose", [b.op("reshape", [x], (3, 2, 4), "float32")], (2, 4, 3),
                       "float32", {"permutation": (1, 2, 0)}), (3, 8),
     lambda b, y: b.op("reshape", [b.op("transpose", [y], (4, 3), "float32",
                                        {"permutation": (1, 0)})], (1, 4, 3), "float32"),
     (3, 4), ["reshape", "transpose"]),
])
def test_a_chain_moving_size_1_dims_is_written_as_the_program_moves_them(
        seq_build, seq_shape, dist_build, dist_shape, kinds):
    seq, _ = _graph(seq_build, [seq_shape])
    g, ids = _graph(dist_build, [dist_shape])
    before = copy.deepcopy(g)
    assert unit_layouts_as_sequential(seq, g, ids)
    _same_values(before, g, [dist_shape])
    assert [op.kind for op in g.ops if op.kind in ("reshape", "transpose")][-2:] == kinds
    assert not unit_layouts_as_sequential(seq, g, ids)        # already so written


def test_a_slice_in_a_chain_is_taken_first_as_the_program_slices():
    # the program slices a query slot of [s, 3, g, d], deletes it, moves the heads first;
    # the rank (g = 1) transposes, then slices, then deletes the two size-1 dims
    def seq_build(b, x):
        sl = b.op("slice", [x], (3, 1, 2, 4), "float32", {"start_indices": (0, 1, 0, 0),
                  "limit_indices": (3, 2, 2, 4), "strides": None})
        r = b.op("reshape", [sl], (3, 2, 4), "float32")
        return b.op("transpose", [r], (2, 3, 4), "float32", {"permutation": (1, 0, 2)})

    def dist_build(b, y):
        t = b.op("transpose", [y], (3, 3, 1, 4), "float32", {"permutation": (1, 0, 2, 3)})
        sl = b.op("slice", [t], (1, 3, 1, 4), "float32", {"start_indices": (1, 0, 0, 0),
                  "limit_indices": (2, 3, 1, 4), "strides": (1, 1, 1, 1)})
        return b.op("reshape", [sl], (1, 3, 4), "float32")
    seq, _ = _graph(seq_build, [(3, 3, 2, 4)])
    g, ids = _graph(dist_build, [(3, 3, 1, 4)])
    before = copy.deepcopy(g)
    assert unit_layouts_as_sequential(seq, g, ids)
    _same_values(before, g, [(3, 3, 1, 4)])
    assert [op.kind for op in g.ops][-3:] == ["slice", "reshape", "transpose"]
    assert not unit_layouts_as_sequential(seq, g, ids)        # already so written


def test_a_slice_in_a_chain_of_another_part_is_left():
    # the twin: the slice takes query slot 2 where the program's form would need the
    # elements of one box; a strided slice is no box and is left
    seq, _ = _graph(lambda b, x: b.op("transpose", [b.op("reshape", [b.op(
        "slice", [x], (3, 1, 2, 4), "float32", {"start_indices": (0, 1, 0, 0), "limit_indices":
                                                (3, 2, 2, 4), "strides": None})], (3, 2, 4),
        "float32")], (2, 3, 4), "float32", {"permutation": (1, 0, 2)}), [(3, 3, 2, 4)])
    g, ids = _graph(lambda b, y: b.op("reshape", [b.op("slice", [y], (2, 3, 1, 4), "float32", {
        "start_indices": (0, 0, 0, 0), "limit_indices": (3, 3, 1, 4), "strides": (2, 1, 1, 1)})],
        (2, 3, 4), "float32"), [(3, 3, 1, 4)])
    assert not unit_layouts_as_sequential(seq, g, ids)


def test_a_chain_placing_elements_otherwise_is_left():
    # the program moves d first ([s, g, d] -> [d, s, g]); the rank's [s, d] reshaped to
    # [d, s, 1] row-major re-chunks its elements instead of moving d: the index check
    # refuses the program's form
    def seq_build(b, x):
        r = b.op("reshape", [x], (3, 2, 4), "float32")
        return b.op("transpose", [r], (4, 3, 2), "float32", {"permutation": (2, 0, 1)})
    seq, _ = _graph(seq_build, [(3, 8)])
    g, ids = _graph(lambda b, y: b.op("reshape", [y], (4, 3, 1), "float32"), [(3, 4)])
    assert not unit_layouts_as_sequential(seq, g, ids)


# ------------------------------------------------------------------ HLO pairs

SEQ = """HloModule seq

ENTRY %main (q: f32[2,2,3,4], x: f32[2,3,5], wk: f32[5,8]) -> f32[2,2,3,3] {
  %q = f32[2,2,3,4]{3,2,1,0} parameter(0)
  %x = f32[2,3,5]{2,1,0} parameter(1)
  %wk = f32[5,8]{1,0} parameter(2)
  %k = f32[2,3,8]{2,1,0} dot(f32[2,3,5]{2,1,0} %x, f32[5,8]{1,0} %wk), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  %kr = f32[2,3,2,4]{3,2,1,0} reshape(f32[2,3,8]{2,1,0} %k)
  %kt = f32[2,2,3,4]{3,2,1,0} transpose(f32[2,3,2,4]{3,2,1,0} %kr), dimensions={0,2,1,3}
  ROOT %s = f32[2,2,3,3]{3,2,1,0} dot(f32[2,2,3,4]{3,2,1,0} %q, f32[2,2,3,4]{3,2,1,0} %kt), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}
}
"""

# a rank holds one query head (q split along dim 1) and slices its KV head's columns out
# of the replicated K projection at r * 4: its k = x @ wk[:, 4r:4r+4] is a [b, s, d] block
# with no head dim; the dot (k q^T, transposed after, as XLA writes it) keeps the query's
# head of one as a free dim
DIST = """HloModule dist, num_partitions=2

ENTRY %main (q: f32[2,1,3,4], x: f32[2,3,5], wk: f32[5,8]) -> f32[2,1,3,3] {
  %q = f32[2,1,3,4]{3,2,1,0} parameter(0), sharding={devices=[1,2,1,1]0,1}
  %x = f32[2,3,5]{2,1,0} parameter(1), sharding={replicated}
  %wk = f32[5,8]{1,0} parameter(2), sharding={replicated}
  %pid = u32[] partition-id()
  %r = s32[] convert(u32[] %pid)
  %four = s32[] constant(4)
  %col = s32[] multiply(s32[] %r, s32[] %four)
  %zero = s32[] constant(0)
  %wh = f32[5,4]{1,0} dynamic-slice(f32[5,8]{1,0} %wk, s32[] %zero, s32[] %col), dynamic_slice_sizes={5,4}
  %kh = f32[2,3,4]{2,1,0} dot(f32[2,3,5]{2,1,0} %x, f32[5,4]{1,0} %wh), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  %st = f32[2,3,1,3]{3,2,1,0} dot(f32[2,3,4]{2,1,0} %kh, f32[2,1,3,4]{3,2,1,0} %q), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={3}
  ROOT %s = f32[2,1,3,3]{3,2,1,0} transpose(f32[2,3,1,3]{3,2,1,0} %st), dimensions={0,2,3,1}
}
"""
WRONG_HEAD_LINE = 11   # the other rank's head: (1 - r) * 4


def test_a_kv_head_sliced_without_its_head_dim_verifies(tmp_path):
    assert_pair_verifies(tmp_path, SEQ, DIST, ["out0 = concat(r0.out0, r1.out0; dim 1)"])


def test_the_other_kv_head_is_not_verified_and_located(tmp_path):
    wrong = DIST.replace("%col = s32[] multiply(s32[] %r, s32[] %four)",
                         "%one = s32[] constant(1)\n  %other = s32[] subtract(s32[] %one, s32[] %r)\n"
                         "  %col = s32[] multiply(s32[] %other, s32[] %four)")
    res = verify_texts(tmp_path, SEQ, wrong)
    assert not res.verified
    assert res.failures[0].line in (WRONG_HEAD_LINE, WRONG_HEAD_LINE + 5), res.failures[0]


def test_compiled_gqa_forward_verifies_and_its_wrong_head_twin_does_not(tmp_path):
    gqa = example_module("gqa_replicated_kv")
    assert_compiled_case_and_twin(tmp_path, gqa.gqa_two_kv_heads_tp4_forward(),
                                  gqa.gqa_bug_wrong_kv_head())


# ------------------------------------------------------------------ one form per unit move (unit_placement.py)

def _k_then_v(b, k, v):
    """The sequential normal form with one KV head: k^T as [s, d] -> [1, s, d] moved by
    (0, 2, 1), v^T as [s, d] -> [s, 1, d] moved by (1, 2, 0): one data movement, two forms."""
    kt = b.op("transpose", [b.op("reshape", [k], (1, 3, 4), "float32")], (1, 4, 3), "float32",
              {"permutation": (0, 2, 1)})
    vt = b.op("transpose", [b.op("reshape", [v], (3, 1, 4), "float32")], (1, 4, 3), "float32",
              {"permutation": (1, 2, 0)})
    return b.op("add", [kt, vt], (1, 4, 3), "float32")


def _unit_pairs(g: Graph):
    producer = g.producer()
    return {(g.tensors[producer[op.inputs[0]].output].shape, tuple(op.params["permutation"]))
            for op in g.ops if op.kind == "transpose"}


def test_a_unit_move_under_a_transpose_has_one_form():
    g, ids = _graph(_k_then_v, [(3, 4), (3, 4)])
    before = copy.deepcopy(g)
    assert canonical_units(g, ids)
    _same_values(before, g, [(3, 4), (3, 4)])
    assert _unit_pairs(g) == {((1, 3, 4), (0, 2, 1))}        # the size-1 dim where the result has it
    assert not canonical_units(g, ids)                         # a fixpoint


def test_a_transpose_of_sized_dims_or_of_units_only_keeps_its_form():
    # [s, g*d] -> [s, g, d] (g = 2: no unit move) and a transpose moving the size-1 dim only
    # (one reshape, simplify.py's): canonical_form leaves both
    assert canonical_form((3, 8), (3, 2, 4), (1, 2, 0), (2, 4, 3)) is None
    assert canonical_form((3, 4), (3, 1, 4), (1, 0, 2), (1, 3, 4)) is None
    g, ids = _graph(lambda b, x: b.op("transpose", [b.op("reshape", [x], (3, 2, 4), "float32")],
                                      (2, 4, 3), "float32", {"permutation": (1, 2, 0)}), [(3, 8)])
    assert not canonical_units(g, ids)


def _weight_gradient(b, dy, x, heads):
    """x^T dy over (b, s): dy [b, g, s, d] transposed to [b, s, g, d], g kept free ([e, g, d]);
    a rank with g = 1 reads dy with g deleted, as XLA writes it ([e, d])."""
    if heads == 1:
        r = b.op("reshape", [dy], (2, 3, 4), "float32")
        return _dot(b, x, r, (5, 4), (1, 2), (0, 1))
    t = b.op("transpose", [dy], (2, 3, heads, 4), "float32", {"permutation": (0, 2, 1, 3)})
    return _dot(b, x, t, (5, heads, 4), (1, 2), (0, 1))


def test_a_deleted_unit_is_read_through_the_programs_transpose():
    seq, _ = _graph(lambda b, dy, x: _weight_gradient(b, dy, x, 2), [(2, 2, 3, 4), (5, 2, 3)])
    shapes = [(2, 1, 3, 4), (5, 2, 3)]
    g, ids = _graph(lambda b, dy, x: _weight_gradient(b, dy, x, 1), shapes)
    before = copy.deepcopy(g)
    assert unit_layouts_as_sequential(seq, g, ids)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)
    producer = g.producer()
    assert producer[dot.inputs[1]].kind == "transpose" and g.tensors[dot.output].shape == (5, 1, 4)
    assert not unit_layouts_as_sequential(seq, g, ids)         # a fixpoint


@pytest.mark.parametrize("perm", [(0, 3, 1, 2), None])
def test_a_deleted_unit_stays_deleted_without_the_programs_transpose(perm):
    # the program's transpose moves sized dims (s after d: not a unit move of y), or it
    # reads dy untransposed: the dot keeps its operand
    def seq_build(b, dy, x):
        if perm is None:
            return _dot(b, x, dy, (5, 2, 4), (1, 2), (0, 2))
        t = b.op("transpose", [dy], (2, 4, 2, 3), "float32", {"permutation": perm})
        return _dot(b, x, t, (5, 4, 2), (1, 2), (0, 3))
    seq, _ = _graph(seq_build, [(2, 2, 3, 4), (5, 2, 3)])
    g, ids = _graph(lambda b, dy, x: _weight_gradient(b, dy, x, 1), [(2, 1, 3, 4), (5, 2, 3)])
    unit_layouts_as_sequential(seq, g, ids)
    (dot,) = _dots(g)
    assert g.tensors[dot.output].shape == (5, 4)


def test_compiled_gqa_training_verifies_and_its_averaged_gradient_twin_is_located(tmp_path):
    gqa = example_module("gqa_replicated_kv")
    assert_compiled_case_and_twin(tmp_path, gqa.gqa_two_kv_heads_tp4_train(),
                                  gqa.gqa_bug_k_grad_averaged_over_replicas())



def _output_projection_gradient(b, o, dy, merged):
    """The weight gradient of the output projection over (b, s): o [b, g, s, j, d] read as
    [g, j, d, b, s] (the program's), or, `merged`, as XLA's [b, s, g*j*d] transposed to
    [g*j*d, b, s] (a rank with g = 1: the head deleted, j and d merged)."""
    bs, g, s, j, d = b.graph.tensors[o].shape
    if merged:
        r = b.op("reshape", [o], (bs, s, g * j * d), "float32")
        t = b.op("transpose", [r], (g * j * d, bs, s), "float32", {"permutation": (2, 0, 1)})
        return _dot(b, t, dy, (g * j * d, 5), (1, 2), (0, 1))
    t = b.op("transpose", [o], (g, j, d, bs, s), "float32", {"permutation": (1, 3, 4, 0, 2)})
    return _dot(b, t, dy, (g, j, d, 5), (3, 4), (0, 1))


def test_merged_dims_and_a_deleted_head_are_split_as_the_program_reads_them():
    partner = _partner(lambda b, o, dy: _output_projection_gradient(b, o, dy, False),
                       [(2, 2, 3, 2, 4), (2, 3, 5)])
    shapes = [(2, 1, 3, 2, 4), (2, 3, 5)]
    g, ids = _graph(lambda b, o, dy: _output_projection_gradient(b, o, dy, True), shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids, partner=partner)
    _same_values(before, g, shapes)
    (dot,) = _dots(g)
    assert g.tensors[dot.output].shape == (1, 2, 4, 5)           # g, j, d free, as the program
    assert not simplify_graph(g, ids, partner=partner)            # a fixpoint


def test_merged_dims_stay_merged_where_the_program_merges_them():
    # the rule's twin: the program's dot reads [g*j*d, b, s] too (the rank's dot fits as it
    # is), or there is no program to read (the sequential graph): the dot keeps its operand
    partner = _partner(lambda b, o, dy: _output_projection_gradient(b, o, dy, True),
                       [(2, 2, 3, 2, 4), (2, 3, 5)])
    shapes = [(2, 1, 3, 2, 4), (2, 3, 5)]
    for p in (partner, None):
        g, ids = _graph(lambda b, o, dy: _output_projection_gradient(b, o, dy, True), shapes)
        simplify_graph(g, ids, partner=p)
        (dot,) = _dots(g)
        assert len(g.tensors[dot.output].shape) == 2


def _flattened_projection(b, o, w, seq):
    """The attention output o [b, g, s, j, d] moved to [b, s, g, j, d] and flattened before the
    output projection w [j*d, n]: by the program to [b, s, 1, j*d] (`seq`), by XLA's rank
    to [b, 1, s, j*d] (one KV head: g = 1 on both sides)."""
    t = b.op("transpose", [o], (2, 3, 1, 2, 4), "float32", {"permutation": (0, 2, 1, 3, 4)})
    r = b.op("reshape", [t], (2, 3, 1, 8) if seq else (2, 1, 3, 8), "float32")
    return _dot(b, r, w, (2, 3, 1, 5) if seq else (2, 1, 3, 5), (3,), (0,))


def test_a_flattened_operands_size_1_dim_goes_where_the_program_puts_it():
    # (both unit moves are one reshape, unit_placement.canonical_units, and the program's
    # dot reads the size-1 dim where o has it, units_placed_as_operands: both sides meet
    # at [b, 1, s, j*d])
    shapes = [(2, 1, 3, 2, 4), (8, 5)]
    seq, _ = _graph(lambda b, o, w: _flattened_projection(b, o, w, True), shapes)
    g, ids = _graph(lambda b, o, w: _flattened_projection(b, o, w, False), shapes)
    before = copy.deepcopy(g)
    assert unit_layouts_as_sequential(seq, g, ids)
    _same_values(before, g, shapes)
    (dot,), (seq_dot,) = _dots(g), _dots(seq)
    assert g.tensors[dot.inputs[0]].shape == seq.tensors[seq_dot.inputs[0]].shape == (2, 1, 3, 8)
    assert not unit_layouts_as_sequential(seq, g, ids)         # a fixpoint


def test_a_flattened_operand_of_another_transpose_keeps_its_size_1_dims():
    # the rule's twin: the program flattens after another transpose, (0, 1, 3, 2, 4): no
    # reshape of the rank's transpose to follow, the operand keeps its size-1 dims
    shapes = [(2, 1, 3, 2, 4), (8, 5)]
    def seq_build(b, o, w):
        t = b.op("transpose", [o], (2, 1, 2, 3, 4), "float32", {"permutation": (0, 1, 3, 2, 4)})
        r = b.op("reshape", [t], (2, 1, 2, 12), "float32")
        return b.op("reduce_sum", [r], (2, 1, 2), "float32", {"axes": (3,)})
    seq, _ = _graph(seq_build, shapes)
    g, ids = _graph(lambda b, o, w: _flattened_projection(b, o, w, False), shapes)
    unit_layouts_as_sequential(seq, g, ids)
    (dot,) = _dots(g)
    assert g.tensors[dot.inputs[0]].shape == (2, 1, 3, 8)
