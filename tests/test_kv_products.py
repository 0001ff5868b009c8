"""Fewer KV heads than ranks in training: the products of two families of partial terms
(partials.dl, Tag_ProdBase), the two-level sum of updates several ranks write at one
place (dlverify/cell_groups.py), and rectangles of a product family that a collective
sums (rect_ranges.dl).

Every view the tiny programs derive is checked numerically (rulekit), including the sums
of tiling partial terms; the rewrite is checked on random data by the shared evaluator
on every rank; the JAX programs (examples/gqa_replicated_kv.py) have buggy twins that
must not verify."""
import copy
import sys
from pathlib import Path

import numpy as np
import pytest
from rulekit import Tiny

from dlverify.cell_groups import split_repeated_cells
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.partial_tags import MASK_BASE, ProdFamily, full_size, prod_axis, prod_family
from dlverify.verdict import Partial

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

UNIT = (0, 0, 0, 0)
MESH = Mesh(("g", "j"), (2, 2))


def _kv_heads_contracted(t: Tiny, w_spec=("g", None), groups=((0, 1, 2, 3),)):
    """P = sum_j A[:, j] (A's j split over "j": partial terms), then Y = P^T W contracted
    over g (P's g block and W's g rows split over "g"): each rank holds one g index and
    half the j terms, as a rank holds one KV head and half its query heads."""
    as_, ad = t.input((2, 4, 3), ("g", "j", None))
    ws, wd = t.input((2, 5), w_spec)
    ps = t.sop("reduce_sum", [as_], (2, 3), axes=(1,))
    pd = t.dop("reduce_sum", [ad], (1, 3), axes=(1,))
    dot = dict(lhs_contract=(0,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
    ys = t.sop("dot_general", [ps, ws], (3, 5), **dot)
    w_rows = 1 if w_spec[0] == "g" else 2
    yd = t.dop("dot_general", [pd, wd], (3, 5), **dot) if w_rows == 1 else None
    sd = None
    if yd is not None:
        sd = t.dop("all_reduce", [yd], (3, 5), reducer="sum", groups=[list(g) for g in groups])
    return ys, yd, sd


def test_a_contraction_of_one_held_index_with_partial_terms_is_their_product_family():
    t = Tiny(MESH)
    ys, yd, sd = _kv_heads_contracted(t)
    reduce_op, dot = t.seq.ops[-2].id, t.seq.ops[-1].id
    out = t.run()
    axis = prod_axis(1, 0, 0, 0)   # single indices of pair 0, operand 0, the reduce's axis 0
    assert prod_family(axis) == ProdFamily(1, 0, 0, 0)
    assert full_size(t.seq, dot, axis) == 2 * 4
    for r in range(4):
        g, j = divmod(r, 2)
        lo = g * 4 + 2 * j
        assert {(v.offsets, v.partial) for v in out.views(ys, yd, r)} == {
            ((0, 0), Partial(0, dot, axis, lo, lo + 2))}
        # complete; and, read as a rectangle of the product (every block, all terms), the
        # reduce's whole range (rect_ranges.dl)
        assert {(v.offsets, v.partial, v.scale) for v in out.views(ys, sd, r)} == {
            ((0, 0), None, UNIT), ((0, 0), Partial(0, reduce_op, 0, 0, 4), UNIT)}


@pytest.mark.parametrize("groups", [
    ((0, 1), (2, 3)),   # over "j" only: each KV head's terms, not the heads
    ((0, 2), (1, 3)),   # over "g" only: terms [0, 2) and [4, 6) are not adjacent
])
def test_a_psum_over_one_mesh_axis_leaves_the_product_incomplete(groups):
    t = Tiny(MESH)
    ys, yd, sd = _kv_heads_contracted(t, groups=groups)
    out = t.run()
    for r in range(4):
        assert not any(v.partial is None for v in out.views(ys, sd, r))


def test_an_operand_holding_two_indices_of_the_pair_has_no_product_view():
    # A's g dim whole on every rank (only j split): a rank's dot covers both g indices of
    # half the terms, which is no flat range of the product
    t = Tiny(MESH)
    as_, ad = t.input((2, 4, 3), (None, "j", None))
    ws, wd = t.input((2, 5), (None, None))
    ps = t.sop("reduce_sum", [as_], (2, 3), axes=(1,))
    pd = t.dop("reduce_sum", [ad], (2, 3), axes=(1,))
    dot = dict(lhs_contract=(0,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
    ys = t.sop("dot_general", [ps, ws], (3, 5), **dot)
    yd = t.dop("dot_general", [pd, wd], (3, 5), **dot)
    out = t.run()
    # the contraction is complete over g; the terms are the reduce's own family
    for r in range(4):
        assert all(v.partial is None or v.partial.axis < 32 for v in out.views(ys, yd, r))


# ------------------------------------------------------- cell_groups: two-level psum

def _dus_psum_graph(starts_by_rank, groups, zero=0.0, shape=(4, 3), upd=(1, 3)):
    """psum(dynamic_update_slice(splat(zero), u, (start_r, 0))) with start_r a table
    lookup at axis_index: the transpose of a per-rank dynamic_slice."""
    ids = IdAllocator()
    g = Graph("g")
    b = GraphBuilder(g, ids)
    u = b.tensor(upd, "float32", "u")
    g.inputs = [u]
    c = b.constant(np.float32(zero), (), "float32")
    z = b.op("broadcast_in_dim", [c], shape, "float32", {"broadcast_dimensions": ()})
    table = b.constant(np.asarray(starts_by_rank, dtype=np.int32), (len(starts_by_rank),), "int32")
    r = b.op("axis_index", [], (), "int32", {"axis": "x"})
    s = b.op("dynamic_slice", [table, r], (1,), "int32", {"slice_sizes": (1,)})
    s = b.op("reshape", [s], (), "int32", {"new_sizes": ()})
    zero_i = b.constant(np.int32(0), (), "int32")
    y = b.op("dynamic_update_slice", [z, u, s, zero_i], shape, "float32", {})
    g.outputs = [b.op("all_reduce", [y], shape, "float32",
                      {"reducer": "sum", "groups": [list(x) for x in groups]})]
    return g, ids


def _agree(before, after, ranks, upd=(1, 3)):
    ins = [[np.random.default_rng(r).standard_normal(upd).astype(np.float32) for r in range(ranks)]]
    mesh = Mesh(("x",), (ranks,))
    runs = [Interpreter(h, ranks, lambda r, a: mesh.coords(r)[a]).run(ins)[h.outputs[0]]
            for h in (before, after)]
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("starts, groups", [
    ([0, 0, 1, 1], [[0, 1, 2, 3]]),               # a KV head on 2 ranks each
    ([1, 0, 1, 0], [[0, 1, 2, 3]]),               # interleaved
    ([3, 3, 3, 3, 0, 0, 0, 0], [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ([0, 0, 0, 0], [[0, 1], [2, 3]]),             # two groups, one cell each
    ([0, 2, 0, 2, 5, 5, 9, 9], [[0, 2, 4, 6], [1, 3, 5, 7]]),   # clamped: 5 and 9 are row 3
])
def test_a_psum_of_updates_at_repeated_starts_is_a_psum_over_classes_then_across(starts, groups):
    ranks = len(starts)
    mesh = Mesh(("x",), (ranks,))
    g, ids = _dus_psum_graph(starts, groups)
    before = copy.deepcopy(g)
    assert split_repeated_cells(g, ids, mesh)
    first, second = [op.params["groups"] for op in g.ops if op.kind == "all_reduce"]
    row = [min(s, 3) for s in starts]   # XLA's clamp of a 1-row window into 4 rows
    assert all(len({row[r] for r in grp}) == 1 for grp in first)          # one start a class
    assert all(len({row[r] for r in grp}) == len(grp) for grp in second)  # one rank a class
    assert sorted(r for grp in first for r in grp) == sorted(r for grp in groups for r in grp)
    _agree(before, g, ranks)


@pytest.mark.parametrize("starts, groups, zero", [
    ([0, 1, 2, 3], [[0, 1, 2, 3]], 0.0),     # every start distinct: nothing to group
    ([0, 0, 0, 1], [[0, 1, 2, 3]], 0.0),     # classes of 3 and 1
    ([0, 0, 1, 1], [[0, 1, 2, 3]], 1.0),     # not an update into zeros
])
def test_no_two_level_split_of_distinct_or_uneven_starts_or_nonzero_operands(starts, groups, zero):
    g, ids = _dus_psum_graph(starts, groups, zero=zero)
    assert not split_repeated_cells(g, ids, Mesh(("x",), (len(starts),)))


# ---------------------------------------------- rect_ranges: rectangles of cells

CELLS = (2, 6, 3)   # (KV head, slot, element): 4 query slots, then K and V


def _rank_table(t, values):
    """A distributed int32 scalar holding values[r] on rank r."""
    table = t.D.constant(np.asarray(values, dtype=np.int32), (len(values),), "int32")
    r = t.D.op("axis_index", [], (), "int32", {"axis": "x"})
    v = t.D.op("dynamic_slice", [table, r], (1,), "int32", {"slice_sizes": (1,)})
    return t.D.op("reshape", [v], (), "int32", {"new_sizes": ()})


def _written_cells(t, xd, heads, slots, width, groups):
    """psum over `groups` of neg(x[head_r, slot_r : slot_r + width]) written back into zeros."""
    h, s = _rank_table(t, heads), _rank_table(t, slots)
    zero = t.D.constant(np.int32(0), (), "int32")
    u = t.dop("dynamic_slice", [xd, h, s, zero], (1, width, 3), slice_sizes=(1, width, 3))
    y = t.dop("neg", [u], (1, width, 3))
    z = t.D.constant(np.zeros(CELLS, dtype=np.float32), CELLS, "float32")
    w = t.dop("dynamic_update_slice", [z, y, h, s, zero], CELLS)
    return t.dop("all_reduce", [w], CELLS, reducer="sum", groups=groups)


@pytest.mark.parametrize("kv_slots, complete", [
    ([4, 4, 4, 4], True),    # the K and V slots of both heads: with the query slots, all
    ([2, 2, 2, 2], False),   # slots 2..3 again, 4..5 never
])
def test_cells_covering_the_same_columns_of_every_row_are_a_range_of_the_inner_dim(kv_slots, complete):
    t = Tiny(Mesh(("x",), (4,)))
    xs, xd = t.input(CELLS)
    s = t.sop("neg", [xs], CELLS)
    neg = t.seq.ops[-1].id
    # query slots: rank r writes head r // 2, slots [2 (r % 2), +2): rows 0 and 1 both [0, 4)
    q = _written_cells(t, xd, [0, 0, 1, 1], [0, 2, 0, 2], 2, [[0, 1, 2, 3]])
    # K and V slots: ranks 0 and 2 (and 1 and 3) write the two heads' cells
    kv = _written_cells(t, xd, [0, 0, 1, 1], kv_slots, 2, [[0, 2], [1, 3]])
    total = t.dop("add", [q, kv], CELLS)
    t.output(s, total)
    out = t.run()
    mask_slots = MASK_BASE + 1
    for r in range(4):
        assert {(v.offsets, v.partial) for v in out.views(s, q, r)} == {
            ((0, 0, 0), Partial(0, neg, mask_slots, 0, 4))}
        assert bool([v for v in out.views(s, total, r) if v.partial is None]) == complete
    assert out.result.verified == complete


def test_cells_whose_rows_cover_other_columns_have_no_view():
    t = Tiny(Mesh(("x",), (4,)))
    xs, xd = t.input(CELLS)
    s = t.sop("neg", [xs], CELLS)
    # row 0 covers slots [0, 4), row 1 slots [0, 2) and [4, 6)
    q = _written_cells(t, xd, [0, 0, 1, 1], [0, 2, 0, 4], 2, [[0, 1, 2, 3]])
    t.output(s, q)
    out = t.run()
    assert out.views(s, q) == []


# ------------------------------- a block of one contracted pair times a range of another

def test_a_block_of_one_contracted_pair_times_a_range_of_another_is_their_product():
    # an expert block (2 of 4) over "e", its hidden units (8 of 16) over "f": the input
    # gradient of a MoE with expert tensor parallelism contracts both
    t = Tiny(Mesh(("e", "f"), (2, 2)))
    as_, ad = t.input((3, 4, 16), (None, "e", "f"))
    bs, bd = t.input((4, 16, 5), ("e", "f", None))
    dot = dict(lhs_contract=(1, 2), rhs_contract=(0, 1), lhs_batch=(), rhs_batch=())
    ys = t.sop("dot_general", [as_, bs], (3, 5), **dot)
    op = t.seq.ops[-1].id
    yd = t.dop("dot_general", [ad, bd], (3, 5), **dot)
    sd = t.dop("all_reduce", [yd], (3, 5), reducer="sum", groups=[[0, 1, 2, 3]])
    t.output(ys, sd)
    out = t.run()
    axis = prod_axis(2, 0, 2, 1)   # blocks of 2 of pair 0, times pair 1's own indices
    assert full_size(t.seq, op, axis) == 2 * 16
    for r in range(4):
        e, f = divmod(r, 2)
        # (also read with the hidden blocks outer: both pairs are blocks, numerically checked)
        assert Partial(0, op, axis, e * 16 + 8 * f, e * 16 + 8 * f + 8) in {
            v.partial for v in out.views(ys, yd, r)}
    assert out.result.verified
