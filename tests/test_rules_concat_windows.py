"""concat_windows.dl: a dynamic slice of a distributed concatenation that reads one operand.

XLA reshards a dim split over a mesh axis into another split (Llama's fused QKV: the
query slots of [q0 q1 | k v] halves moved to one slot per rank, llama3.py:204-205) by
a collective permute (ranks no pair sends to receive zeros), a concatenation of the
rank's own piece with what it received, and a dynamic slice at a per-rank offset that
never reads the zeros. Here x has 4 rows split over 2 ranks (rows [2r, 2r + 2) on
rank r) and rank r must end with row r. `Tiny.run()` checks every derived view on
random data (the soundness check of the rule); each case has twins that must not
verify."""
import numpy as np
from rulekit import Tiny

from dlverify.ir import Mesh

R, ROWS, COLS = 2, 4, 8


def _int(t: Tiny, v: int) -> int:
    return t.D.constant(np.asarray(v, dtype=np.int32), (), "int32")


def _rank(t: Tiny) -> int:
    return t.D.op("axis_index", [], (), "int32", {"axis": "x"})


def _rows_exchanged(t: Tiny, xd: int, pairs=((0, 1),)) -> int:
    """concat(permute(row 1 of the rank's block), row 0 of the rank's block): rank 0
    [zeros, x0], rank 1 [x1, x2] (with the pairs XLA writes)."""
    hi = t.dop("slice", [xd], (1, COLS), start_indices=(1, 0), limit_indices=(2, COLS), strides=None)
    lo = t.dop("slice", [xd], (1, COLS), start_indices=(0, 0), limit_indices=(1, COLS), strides=None)
    got = t.dop("collective_permute", [hi], (1, COLS), pairs=list(pairs))
    return t.dop("concatenate", [got, lo], (2, COLS), dimension=0)


def _window(t: Tiny, cat: int, start: int, rows: int = 1) -> int:
    return t.dop("dynamic_slice", [cat, start, _int(t, 0)], (rows, COLS), slice_sizes=(rows, COLS))


def _one_row_per_rank(start_of, pairs=((0, 1),)):
    """rank r's row r of x (the first R rows, split over the ranks), as XLA reshards it."""
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd = t.input((ROWS, COLS), ("x", None))
    q = t.sop("slice", [xs], (R, COLS), start_indices=(0, 0), limit_indices=(R, COLS), strides=None)
    y = _window(t, _rows_exchanged(t, xd, pairs), start_of(t))
    t.output(q, y, ("x", None))
    return t, q, y


def _one_minus_rank(t: Tiny) -> int:
    return t.D.op("sub", [_int(t, 1), _rank(t)], (), "int32")


def test_a_window_inside_one_operand_is_that_operands_block_shifted():
    t, q, y = _one_row_per_rank(_one_minus_rank)
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures[:2]]
    # rank 0 reads its own row past the zeros, rank 1 the row rank 0 sent it
    assert [out.offsets(q, y, r) for r in range(R)] == [{(0, 0)}, {(1, 0)}]


def test_a_window_at_the_wrong_offsets_does_not_verify():
    # start = rank: rank 0 reads the zeros it received, rank 1 its own row 2
    t, q, y = _one_row_per_rank(_rank)
    out = t.run()
    assert not out.result.verified
    assert out.offsets(q, y, 0) == set()


def test_a_permute_in_the_wrong_direction_does_not_verify():
    # rank 0 receives row 3 and reads row 0; rank 1 receives zeros and reads them
    t, q, y = _one_row_per_rank(_one_minus_rank, pairs=((1, 0),))
    out = t.run()
    assert not out.result.verified
    assert out.offsets(q, y, 1) == set()


def test_a_window_reaching_into_the_zeros_is_no_block():
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd = t.input((ROWS, COLS), ("x", None))
    cat = _rows_exchanged(t, xd)
    y = _window(t, cat, _int(t, 0), rows=2)    # rank 0: [zeros, x0]
    out = t.run()
    assert not any(v.dist == y and v.rank == 0 for v in out.result.views)


def _summed_window(start: int):
    """psum over the ranks of the window at `start` on every rank: with start 0 rank 0
    reads the zeros it received and rank 1 row 1, so the sum is row 1 (holders.dl)."""
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd = t.input((ROWS, COLS), ("x", None))
    row = t.sop("slice", [xs], (1, COLS), start_indices=(1, 0), limit_indices=(2, COLS), strides=None)
    y = _window(t, _rows_exchanged(t, xd), _int(t, start))
    s = t.dop("all_reduce", [y], (1, COLS), reducer="sum", groups=[[0, 1]])
    t.output(row, s, ())
    return t


def test_a_window_of_the_zeros_is_zero_and_a_sum_keeps_the_other_rank_s_row():
    out = _summed_window(0).run()
    assert out.result.verified, [f.message for f in out.result.failures[:2]]


def test_a_sum_of_two_rows_is_not_one_row():
    # start 1: rank 0 reads x0, rank 1 x2; their sum is no row of x
    out = _summed_window(1).run()
    assert not out.result.verified
