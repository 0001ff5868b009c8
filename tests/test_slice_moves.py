"""dlverify/simplify_sink.py `slice_moves`: slices go toward the inputs in the normal
form. A slice of a slice is one slice (strides compose); a slice of a concatenate
within one piece is that piece's slice; a slice of a reshape sinks under it,
also when the reshape only gains or drops size-1 dims in a run ([1, n] -> [n]: a
PRNG key's row read as its two words). And a literal reshaped to another shape is
still a splat for the rules that order operands (simplify_forms `splat`).

Each rule is checked numerically through the shared evaluator on random inputs,
with the normal form a fixpoint (test_simplify_merged._normal_form), and where it
must not fire."""
import numpy as np
import pytest
from test_simplify_merged import _normal_form


def _slice(b, x, start, limit, strides=None):
    shape = tuple(len(range(a, e, s)) for a, e, s in zip(start, limit, strides or (1,) * len(start)))
    return b.op("slice", [x], shape, "float32", {"start_indices": tuple(start),
                                                 "limit_indices": tuple(limit),
                                                 "strides": tuple(strides) if strides else None})


def _kinds(g):
    return [op.kind for op in g.ops]


@pytest.mark.parametrize("outer", [((1, 2), (4, 5), None), ((0, 0), (4, 3), (2, 2)),
                                   ((1, 1), (2, 3), (1, 1)), ((3, 0), (4, 1), None)])
def test_a_slice_of_a_slice_is_one_slice(outer):
    def build(b, x):
        inner = _slice(b, x, (1, 0), (10, 7), (2, 1))     # rows 1, 3, .., 9: [5, 7]
        return _slice(b, inner, *outer)
    g = _normal_form(build, [(11, 7)])
    assert _kinds(g) == ["slice"]


@pytest.mark.parametrize("start, limit", [((1, 1), (3, 2)), ((0, 3), (4, 5))])
def test_a_slice_of_a_concatenate_within_one_piece_slices_that_piece(start, limit):
    def build(b, x, y):
        cat = b.op("concatenate", [x, y], (4, 5), "float32", {"dimension": 1})
        return _slice(b, cat, start, limit)
    g = _normal_form(build, [(4, 2), (4, 3)])
    assert "concatenate" not in _kinds(g)


def test_a_slice_across_pieces_stays_whole():
    """Split, it would be a concatenate of pieces a convolution's halo windows no
    longer meet as one block (tests/test_diagonal_sums.py's compiled kernel gradient)."""
    def across(b, x, y):
        cat = b.op("concatenate", [x, y], (4, 5), "float32", {"dimension": 1})
        return _slice(b, cat, (0, 1), (2, 4))    # x's last column and y's first two
    g = _normal_form(across, [(4, 2), (4, 3)], changes=False)
    assert _kinds(g) == ["concatenate", "slice"]


@pytest.mark.parametrize("src, mid, start, limit", [
    ((1, 2), (2,), (0,), (1,)),              # a key's row read as its words, word 0
    ((2, 1), (2,), (1,), (2,)),
    ((3, 1, 4), (3, 4), (1, 1), (3, 3)),    # a size-1 dim dropped between two kept
    ((3, 4), (1, 3, 4, 1), (0, 1, 0, 0), (1, 3, 4, 1)),   # size-1 dims gained
])
def test_a_slice_of_a_reshape_by_size_1_dims_is_the_reshape_of_a_slice(src, mid, start, limit):
    def build(b, x):
        r = b.op("reshape", [x], mid, "float32", {})
        return _slice(b, r, start, limit)
    g = _normal_form(build, [src])
    assert _kinds(g)[-1] == "reshape" and _kinds(g).count("slice") == 1


def test_a_slice_that_cuts_across_merged_rows_stays():
    def build(b, x):
        r = b.op("reshape", [x], (6,), "float32", {})
        return _slice(b, r, (1,), (4,))   # elements 1..3 of [2, 3] rows: not a block of x
    g = _normal_form(build, [(2, 3)], changes=False)
    assert _kinds(g) == ["reshape", "slice"]


def test_a_reshaped_scalar_literal_is_a_splat_and_goes_last():
    """A literal passed to an inlined call as a scalar and reshaped to [1] there is a
    one-value operand: `1 + x` reads `x + 1`, as the other program writes it."""
    def build(b, x):
        one = b.constant(np.float32(1.0), (), "float32")
        r = b.op("reshape", [one], (1,), "float32", {})
        return b.op("add", [r, x], (1,), "float32", {})
    g = _normal_form(build, [(1,)])
    add = next(op for op in g.ops if op.kind == "add")
    assert add.inputs[0] == g.inputs[0]
