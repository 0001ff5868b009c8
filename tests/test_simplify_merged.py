"""dlverify/simplify_merged.py: a dynamic_slice of a reshape at whole rows of a
merged run (a rank's offset read from a literal table) is the reshape of a
dynamic_slice, and a size-1 dim merged into a contracted dim is a size-1 free dim
of the dot. Every rewrite leaves the outputs unchanged (the shared evaluator, on
four ranks for the per-rank offsets) and fires only where it may; the normal form
reaches a fixpoint. Then the GShard layer these rules serve, compiled by XLA,
verifies from its HLO; its twins do not."""
import copy

import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, compiled_pair, example_module, verify_texts
from test_simplify import _dot, _graph

from dlverify import simplify_merged
from dlverify.interpret import Interpreter
from dlverify.simplify import simplify_graph

RANKS = 4


def _rank_offset(b, table):
    """T[rank] as a scalar: a literal table read at the rank (XLA's and resharding.py's form)."""
    t = b.constant(np.asarray(table, np.int32), (len(table),), "int32")
    rank = b.op("axis_index", [], (), "int32", {"axis": "_flat"})
    one = b.op("dynamic_slice", [t, rank], (1,), "int32", {"slice_sizes": (1,)})
    return b.op("reshape", [one], (), "int32")


def _zero(b):
    return b.constant(np.int32(0), (), "int32")


def _normal_form(build, in_shapes, ranks=RANKS, changes=True):
    """`build`'s graph in normal form, computing the same as before on `ranks` ranks of
    one flat axis (rank r at coordinate r, each its own random inputs); `changes`: the
    normal form changed it, and is a fixpoint (no rule undoes another)."""
    g, ids = _graph(build, in_shapes)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids) or not changes
    ins = [[np.random.default_rng(10 * i + r).standard_normal(s).astype(np.float32)
            for r in range(ranks)] for i, s in enumerate(in_shapes)]
    outs = [Interpreter(h, ranks, lambda r, axis: r).run(ins)[h.outputs[0]] for h in (before, g)]
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert not (changes and simplify_graph(g, ids))
    return g


def _watch(monkeypatch, rule):
    """The ops that simplify_merged's `rule` replaces from now on (a list to read after)."""
    fired = []
    real = getattr(simplify_merged, rule)

    def watched(s, op):
        done = real(s, op)
        if done:
            fired.append(op)
        return done
    monkeypatch.setattr(simplify_merged, rule, watched)
    return fired


# ------------------------------------------------------------------ dynamic slices

@pytest.mark.parametrize("src, mid, dim, size, table, block", [
    # the experts' results [e, g, c, d] merged [e, g*c, d], a rank's group c rows at 3q
    ((2, 4, 3, 8), (2, 12, 8), 1, 3, [0, 3, 6, 9], (2, 1, 3, 8)),
    # rows of two elements of a [4, 6] run merged [12, 2]: 3 rows at 3q are one row of 6
    ((4, 6), (12, 2), 0, 3, [0, 3, 6, 9], (1, 6)),
    # a leading size-1 dim in the run, and offsets clamped past the end (9 + 6 > 12)
    ((1, 4, 3), (12,), 0, 6, [0, 3, 6, 9], (1, 2, 3)),
])
def test_a_dynamic_slice_of_a_reshape_at_whole_rows_is_the_reshape_of_a_dynamic_slice(
        src, mid, dim, size, table, block):
    sizes = tuple(size if d == dim else n for d, n in enumerate(mid))

    def build(b, x):
        m = b.op("reshape", [x], mid, "float32")
        starts = [_rank_offset(b, table) if d == dim else _zero(b) for d in range(len(mid))]
        return b.op("dynamic_slice", [m, *starts], sizes, "float32", {"slice_sizes": sizes})
    g = _normal_form(build, [src])
    (cut,) = [op for op in g.ops if op.kind == "dynamic_slice" and op.inputs[0] == g.inputs[0]]
    assert g.tensors[cut.output].shape == block


def test_a_literal_start_beside_a_table_start_is_divided_too():
    # two runs cut: one at a rank's offset, one at a literal (so the slice is no
    # literal slice, which simplify_sink.literal_dynamic_slice would take)
    def build(b, x):
        m = b.op("reshape", [x], (12, 2, 6), "float32")      # [4, 3] and [2, 2, 3] merged
        lit = b.constant(np.int32(3), (), "int32")
        return b.op("dynamic_slice", [m, _rank_offset(b, [0, 3, 6, 9]), _zero(b), lit],
                    (3, 2, 3), "float32", {"slice_sizes": (3, 2, 3)})
    g = _normal_form(build, [(4, 3, 2, 2, 3)])
    (cut,) = [op for op in g.ops if op.kind == "dynamic_slice" and op.inputs[0] == g.inputs[0]]
    assert g.tensors[cut.output].shape == (1, 3, 2, 1, 3)


@pytest.mark.parametrize("case", ["offset_not_whole_rows", "size_not_whole_rows",
                                  "cut_inside_the_run", "computed_offset"])
def test_dynamic_slices_that_cut_rows_apart_stay(case, monkeypatch):
    # the round-robin placement: [8] split [2, 4] and dim 1 cut picks every 4th row,
    # no block of the operand; offsets not proven whole rows of the operand's run
    def build(b, x):
        if case == "cut_inside_the_run":
            m = b.op("reshape", [x], (2, 4, 3), "float32")
            return b.op("dynamic_slice", [m, _zero(b), _rank_offset(b, [0, 1, 2, 3]), _zero(b)],
                        (2, 1, 3), "float32", {"slice_sizes": (2, 1, 3)})
        m = b.op("reshape", [x], (24,), "float32")
        if case == "computed_offset":               # 3 * rank: not a table element
            start = b.op("mul", [b.op("axis_index", [], (), "int32", {"axis": "_flat"}),
                                 b.constant(np.int32(3), (), "int32")], (), "int32")
        else:
            start = _rank_offset(b, [0, 2, 6, 9] if case == "offset_not_whole_rows"
                                 else [0, 3, 6, 9])
        size = 2 if case == "size_not_whole_rows" else 3
        return b.op("dynamic_slice", [m, start], (size,), "float32", {"slice_sizes": (size,)})
    src = (8, 3)
    fired = _watch(monkeypatch, "dynamic_slice_of_reshape")
    _normal_form(build, [src], changes=False)
    assert not fired


# ------------------------------------------------------------------ size-1 dims in contractions

def test_a_size_1_dim_merged_into_a_contraction_is_a_free_dim():
    # [1, 3, 8] merged into a contracted 24: the size-1 dim leaves the contraction
    def build(b, a, y):
        w = b.op("reshape", [y], (24, 5), "float32")
        return _dot(b, a, w, (4, 5), (1,), (0,))
    g = _normal_form(build, [(4, 24), (1, 3, 8, 5)], ranks=1)
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert g.tensors[dot.output].shape == (4, 1, 5)       # y's size-1 dim, free
    assert dot.params["rhs_contract"] == (0,) and g.tensors[dot.inputs[1]].shape == (24, 1, 5)


def test_the_combine_einsum_on_a_rank_batches_over_its_group():
    # GShard's combine on a rank, as XLA writes it: the weights [g=1, s, c, e] merged
    # [1, s, c*e], the experts' results [g=1, c, e, d] merged [g*c*e, d]; the program
    # contracts (c, e) batched over g
    def build(b, w, y):
        lhs = b.op("reshape", [w], (1, 8, 24), "float32")
        rhs = b.op("reshape", [y], (24, 8), "float32")
        return _dot(b, lhs, rhs, (1, 8, 8), (2,), (0,))
    g = _normal_form(build, [(1, 8, 3, 8), (1, 3, 8, 8)], ranks=1)
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert list(dot.inputs) == g.inputs
    assert dot.params["lhs_batch"] == (0,) == dot.params["rhs_batch"]
    assert dot.params["lhs_contract"] == (2, 3) and dot.params["rhs_contract"] == (1, 2)


@pytest.mark.parametrize("case", ["no_size_1_dim", "size_1_dim_free", "deletion_only"])
def test_contractions_without_a_merged_size_1_dim_are_not_taken_apart(case, monkeypatch):
    y_shape = {"no_size_1_dim": (3, 8, 5), "size_1_dim_free": (24, 1, 5),
               "deletion_only": (1, 24, 5)}[case]

    def build(b, a, y):
        w = b.op("reshape", [y], (24, 5), "float32")
        return _dot(b, a, w, (4, 5), (1,), (0,))
    fired = _watch(monkeypatch, "unit_dims_out_of_contraction")
    _normal_form(build, [(4, 24), y_shape], ranks=1, changes=False)
    assert not fired


# ------------------------------------------------------------------ the compiled example

@pytest.mark.parametrize("dumped", [False, True])
def test_compiled_gshard_layer_verifies_and_its_twins_do_not(tmp_path, dumped):
    moe = example_module("moe_all_to_all")
    assert_compiled_case_and_twin(tmp_path, moe.moe_all_to_all_top1(),
                                  moe.moe_a2a_bug_return_exchange_wrong_axes(), dumped=dumped)
    # the round-robin placement: not verified (its reshape carries the einsum's frame)
    res = verify_texts(tmp_path, *compiled_pair(moe.moe_a2a_bug_round_robin_placement(), dumped))
    assert not res.verified
