"""padded.dl: uneven shards as padded views (blocks that run past a tensor's end).

The distributed side pads a replicated operand to a multiple of the rank count,
slices a block per rank, and masks the padding before it sums over the dim, as
XLA's SPMD partitioner does. `Tiny.run()` checks every derived view and every
padded view (valid part equal, zero padding zero) on random data, so each test
is also a soundness check of the rules; each rule has a twin that must not verify.
"""
import numpy as np
import pytest
from rulekit import Tiny

from dlverify.ir import Mesh

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def _tiny(ranks: int = 4) -> Tiny:
    return Tiny(Mesh(("x",), (ranks,)))


def _int(t: Tiny, v: int) -> int:
    return t.D.constant(np.asarray(v, dtype=np.int32), (), "int32")


def _rank_times(t: Tiny, k: int) -> int:
    i = t.D.op("axis_index", [], (), "int32", {"axis": "x"})
    return t.D.op("mul", [i, _int(t, k)], (), "int32")


def _block(t: Tiny, xd: int, n: int, cols: int, ranks: int, pad_value: float = 0.0) -> tuple[int, int]:
    """Rows [r * k, r * k + k) of the replicated [n, cols] operand, k = ceil(n / ranks),
    past n the pad value: pad, then dynamic_slice. Returns (block, its start)."""
    k = -(-n // ranks)
    padded = t.dop("pad", [xd, t.dconst(pad_value)], (k * ranks, cols),
                   padding_config=((0, k * ranks - n, 0), (0, 0, 0)))
    start = _rank_times(t, k)
    return t.dop("dynamic_slice", [padded, start, _int(t, 0)], (k, cols), slice_sizes=(k, cols)), start


def _valid_mask(t: Tiny, start: int, k: int, cols: int, limit: int) -> int:
    """iota + start < limit along dim 0 of a [k, cols] block: XLA's padding mask."""
    io = t.D.op("iota", [], (k, cols), "int32", {"dimension": 0})
    shift = t.D.op("broadcast_in_dim", [start], (k, cols), "int32", {"broadcast_dimensions": ()})
    lim = t.D.op("broadcast_in_dim", [_int(t, limit)], (k, cols), "int32", {"broadcast_dimensions": ()})
    return t.D.op("lt", [t.D.op("add", [io, shift], (k, cols), "int32"), lim], (k, cols), "bool")


def _row_sum(t: Tiny, unary: str | None, masked: bool, pad_value: float = 0.0, n: int = 10,
             ranks: int = 4, limit: int | None = None):
    """sum over rows of unary(x), rows split unevenly; the distributed side pads, slices,
    applies the op, masks (or not) and all-reduces."""
    t = _tiny(ranks)
    k = -(-n // ranks)
    xs, xd = t.input((n, 8))
    blk, start = _block(t, xd, n, 8, ranks, pad_value)
    ys = t.sop(unary, [xs], (n, 8)) if unary else xs
    yd = t.dop(unary, [blk], (k, 8)) if unary else blk
    if masked:
        yd = t.dop("select_n", [_valid_mask(t, start, k, 8, n if limit is None else limit),
                                t.dconst(0.0, (k, 8)), yd], (k, 8))
    ss = t.sop("reduce_sum", [ys], (8,), axes=(0,))
    sd = t.dop("reduce_sum", [yd], (8,), axes=(0,))
    t.output(ss, t.dop("all_reduce", [sd], (8,), reducer="sum", groups=[list(range(ranks))]))
    return t, t.run()


@pytest.mark.parametrize("unary", [None, "tanh", "exp"])
def test_a_masked_uneven_row_sum_verifies(unary):
    t, out = _row_sum(None, unary, masked=True)
    assert out.result.verified, [f.message for f in out.result.failures]
    assert out.result.padded_views, "the padding is represented, not dropped"


def test_blocks_wholly_past_the_end_sum_to_nothing():
    # 10 rows over 8 ranks in blocks of 2: ranks 5..7 hold padding only
    t, out = _row_sum(None, "tanh", masked=True, n=10, ranks=8)
    assert out.result.verified, [f.message for f in out.result.failures]


def test_zero_padding_through_an_op_that_keeps_zero_needs_no_mask():
    # tanh(0) = 0: the padding stays zero, the sum over it is the sum over the valid rows
    t, out = _row_sum(None, "tanh", masked=False)
    assert out.result.verified, [f.message for f in out.result.failures]


def test_unmasked_padding_that_is_not_zero_does_not_verify():
    # exp(0) = 1: rank 3's two padding rows add 2 to every column
    assert not _row_sum(None, "exp", masked=False)[1].result.verified
    # padded with 1: the padding rows add to the sum
    assert not _row_sum(None, None, masked=False, pad_value=1.0)[1].result.verified


def test_a_mask_with_the_wrong_limit_does_not_verify():
    # iota + start < 9 drops row 9, the last valid one
    assert not _row_sum(None, "exp", masked=True, limit=9)[1].result.verified


def _padded_rows_times(op: str, zero_operand: bool):
    """sum over rows of (x op b) with b replicated: b is a broadcast row, so its values
    at the padding rows are b's, not zero."""
    t = _tiny()
    xs, xd = t.input((10, 8))
    bs, bd = t.input((8,))
    blk, _ = _block(t, xd, 10, 8, 4)
    bbs = t.sop("broadcast_in_dim", [bs], (10, 8), broadcast_dimensions=(1,))
    bbd = t.dop("broadcast_in_dim", [bd], (3, 8), broadcast_dimensions=(1,))
    ys = t.sop(op, [xs, bbs], (10, 8))
    yd = t.dop(op, [blk, bbd], (3, 8))
    if zero_operand:
        ys = t.sop(op, [xs, t.sconst(0.0, (10, 8))], (10, 8))
        yd = t.dop(op, [blk, t.dconst(0.0, (3, 8))], (3, 8))
    ss = t.sop("reduce_sum", [ys], (8,), axes=(0,))
    sd = t.dop("reduce_sum", [yd], (8,), axes=(0,))
    t.output(ss, t.dop("all_reduce", [sd], (8,), reducer="sum", groups=[[0, 1, 2, 3]]))
    return t.run().result


def test_a_product_with_zero_padding_is_zero_padded():
    assert _padded_rows_times("mul", zero_operand=False).verified


def test_a_sum_with_a_broadcast_row_is_not_zero_padded():
    # the padding rows of x + b hold b: summed, they add 2 b
    assert not _padded_rows_times("add", zero_operand=False).verified
    # adding a zero constant keeps the padding zero
    assert _padded_rows_times("add", zero_operand=True).verified


def _hidden_layer(pad_w1: float, pad_w2: float, mask_h: bool):
    """x @ w1 @ w2 with 30 hidden units over 4 ranks: w1's columns and w2's rows padded."""
    t = _tiny()
    xs, xd = t.input((5, 16))
    w1s, w1d = t.input((16, 30))
    w2s, w2d = t.input((30, 6))
    p1 = t.dop("pad", [w1d, t.dconst(pad_w1)], (16, 32), padding_config=((0, 0, 0), (0, 2, 0)))
    start = _rank_times(t, 8)
    c1 = t.dop("dynamic_slice", [p1, _int(t, 0), start], (16, 8), slice_sizes=(16, 8))
    w2b, _ = _block(t, w2d, 30, 6, 4, pad_w2)
    hs = t.sop("tanh", [t.sop("dot_general", [xs, w1s], (5, 30), **DOT)], (5, 30))
    hd = t.dop("tanh", [t.dop("dot_general", [xd, c1], (5, 8), **DOT)], (5, 8))
    if mask_h:
        io = t.D.op("iota", [], (5, 8), "int32", {"dimension": 1})
        sh = t.D.op("broadcast_in_dim", [start], (5, 8), "int32", {"broadcast_dimensions": ()})
        lim = t.D.op("broadcast_in_dim", [_int(t, 30)], (5, 8), "int32", {"broadcast_dimensions": ()})
        m = t.D.op("lt", [t.D.op("add", [io, sh], (5, 8), "int32"), lim], (5, 8), "bool")
        hd = t.dop("select_n", [m, t.dconst(0.0, (5, 8)), hd], (5, 8))
    ys = t.sop("dot_general", [hs, w2s], (5, 6), **DOT)
    yd = t.dop("dot_general", [hd, w2b], (5, 6), **DOT)
    t.output(ys, t.dop("all_reduce", [yd], (5, 6), reducer="sum", groups=[[0, 1, 2, 3]]))
    return t.run().result


def test_a_contraction_over_a_padded_dim_needs_one_zero_operand():
    assert _hidden_layer(0.0, 0.0, mask_h=False).verified          # tanh(x @ 0) = 0
    assert _hidden_layer(1.0, 0.0, mask_h=False).verified          # w2's padding rows are 0
    assert _hidden_layer(1.0, 1.0, mask_h=True).verified           # h's padding is masked
    assert not _hidden_layer(1.0, 1.0, mask_h=False).verified      # tanh(x @ 1) @ 1 != 0


def _gathered(start: int):
    """exp(2 x) on uneven row blocks, all-gathered (12 rows) and sliced back to 10."""
    t = _tiny()
    xs, xd = t.input((10, 8))
    blk, _ = _block(t, xd, 10, 8, 4)
    two_s = t.sop("mul", [xs, t.sconst(2.0, (10, 8))], (10, 8))
    two_d = t.dop("mul", [blk, t.dconst(2.0, (3, 8))], (3, 8))
    es, ed = t.sop("exp", [two_s], (10, 8)), t.dop("exp", [two_d], (3, 8))
    gd = t.dop("all_gather", [ed], (12, 8), dimension=0, groups=[[0, 1, 2, 3]])
    t.output(es, t.dop("slice", [gd], (10, 8), start_indices=(start, 0), limit_indices=(start + 10, 8),
                       strides=None))
    return t.run().result


def test_gathered_padded_blocks_sliced_back_verify():
    assert _gathered(0).verified
    assert not _gathered(2).verified


def _row_max(fill: float, masked: bool = True):
    """max over the rows of x, split unevenly: the padding masked to `fill` before the
    local max, then a max all-reduce."""
    t = _tiny()
    xs, xd = t.input((10, 8))
    blk, start = _block(t, xd, 10, 8, 4)
    yd = blk
    if masked:
        yd = t.dop("select_n", [_valid_mask(t, start, 3, 8, 10), t.dconst(fill, (3, 8)), blk], (3, 8))
    ss = t.sop("reduce_max", [xs], (8,), axes=(0,))
    sd = t.dop("reduce_max", [yd], (8,), axes=(0,))
    t.output(ss, t.dop("all_reduce", [sd], (8,), reducer="max", groups=[[0, 1, 2, 3]]))
    return t.run()


def test_a_max_over_padding_masked_to_minus_infinity_verifies():
    out = _row_max(float("-inf"))
    assert out.result.verified, [f.message for f in out.result.failures]
    assert any(v.padding == float("-inf") for v in out.result.padded_views)


def test_a_max_over_padding_that_is_not_minus_infinity_does_not_verify():
    # zero padding: the max of a column of negative numbers would be 0
    assert not _row_max(0.0).result.verified
    assert not _row_max(0.0, masked=False).result.verified



def _one_hot_count(limit: int):
    """sum over a vocabulary of 10 of the one-hot of ids (a count of the ids in range),
    split over 4 ranks in blocks of 3: the distributed side compares ids with iota +
    rank * 3 (a view on ranks 0..2, padding past the end on rank 3), masks with the
    padding mask on `limit` and all-reduces. On ranks 0..2 the mask is true throughout,
    so the select keeps the whole one-hot; on rank 3 it sets the padding to zero."""
    t = _tiny(4)
    ids_s, ids_d = t.input((5,), dtype="int32")
    col_s = t.S.op("iota", [], (5, 10), "int32", {"dimension": 1})
    bs = t.S.op("broadcast_in_dim", [ids_s], (5, 10), "int32", {"broadcast_dimensions": (0,)})
    hot_s = t.sop("select_n", [t.S.op("eq", [bs, col_s], (5, 10), "bool"), t.sconst(0.0, (5, 10)),
                               t.sconst(1.0, (5, 10))], (5, 10))
    start = _rank_times(t, 3)
    iota = t.D.op("iota", [], (5, 3), "int32", {"dimension": 1})
    shift = t.D.op("broadcast_in_dim", [start], (5, 3), "int32", {"broadcast_dimensions": ()})
    col_d = t.D.op("add", [iota, shift], (5, 3), "int32")
    bd = t.D.op("broadcast_in_dim", [ids_d], (5, 3), "int32", {"broadcast_dimensions": (0,)})
    hot_d = t.dop("select_n", [t.D.op("eq", [bd, col_d], (5, 3), "bool"), t.dconst(0.0, (5, 3)),
                               t.dconst(1.0, (5, 3))], (5, 3))
    lim = t.D.op("broadcast_in_dim", [_int(t, limit)], (5, 3), "int32", {"broadcast_dimensions": ()})
    valid = t.D.op("lt", [col_d, lim], (5, 3), "bool")
    masked = t.dop("select_n", [valid, t.dconst(0.0, (5, 3)), hot_d], (5, 3))
    ss = t.sop("reduce_sum", [hot_s], (5,), axes=(1,))
    sd = t.dop("reduce_sum", [masked], (5,), axes=(1,))
    t.output(ss, t.dop("all_reduce", [sd], (5,), reducer="sum", groups=[[0, 1, 2, 3]]))
    return t.run().result


def test_a_mask_true_throughout_a_rank_keeps_its_whole_block():
    res = _one_hot_count(10)
    assert res.verified, [f.message for f in res.failures]


def test_a_mask_that_cuts_an_in_bounds_block_is_not_one_case():
    # limit 8 drops vocabulary id 8 and 9, on rank 2 and rank 3
    assert not _one_hot_count(8).verified
