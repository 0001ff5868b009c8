"""dlverify/diagonal_sums.py: a sum over one of two dims of a select that keeps their
diagonal (iota_a == iota_b, zeros elsewhere) is the diagonal, and the diagonal of a dot
whose two dims come one from each operand is the dot batched over them, also through
concatenations, size-1 reshapes and transposes. Each rewrite leaves the outputs unchanged
on random data (the shared evaluator) and reaches a fixpoint; it does not fire on a mask
that is not the diagonal, on zeros kept on the diagonal, on dims of one operand, or on
a concatenation along one of the two dims. Then XLA's depthwise kernel gradient (a
batch-grouped convolution computed without groups and its diagonal kept) verifies
against the program's, and its twin (the halo from the wrong neighbour) does not."""
import copy

import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, example_module
from test_simplify import _graph, _run

from dlverify.simplify import simplify_graph

F = "float32"
N = 4       # the channels: the two dims of the diagonal


def _dot(b, lhs, rhs, out, lc, rc):
    return b.op("dot_general", [lhs, rhs], out, F, {"lhs_contract": lc, "rhs_contract": rc,
                                                   "lhs_batch": (), "rhs_batch": ()})


def _iota_along(b, shape, dim, full=False):
    """The index along `dim` at every position of `shape` (a one-dim iota broadcast, or,
    `full`, an iota of the whole shape)."""
    if full:
        return b.op("iota", [], shape, "int32", {"dimension": dim})
    i = b.op("iota", [], (shape[dim],), "int32", {"dimension": 0})
    return b.op("broadcast_in_dim", [i], shape, "int32", {"broadcast_dimensions": (dim,)})


def _kept(b, x, shape, p, q, zero_on_diagonal=False, offset=0, full=False):
    """select(iota_p == iota_q + offset, x, 0): x on the diagonal of dims p and q (or,
    `zero_on_diagonal`, everywhere else)."""
    ip, iq = _iota_along(b, shape, p, full), _iota_along(b, shape, q, full)
    if offset:
        c = b.constant(np.asarray(offset, np.int32), (), "int32")
        iq = b.op("add", [iq, b.op("broadcast_in_dim", [c], shape, "int32",
                                   {"broadcast_dimensions": ()})], shape, "int32")
    mask = b.op("eq", [ip, iq], shape, "bool")
    zero = b.op("broadcast_in_dim", [b.constant(np.float32(0), (), F)], shape, F,
                {"broadcast_dimensions": ()})
    cases = [x, zero] if zero_on_diagonal else [zero, x]
    return b.op("select_n", [mask, *cases], shape, F)


def _sum(b, x, shape, axes):
    out = tuple(n for d, n in enumerate(shape) if d not in axes)
    return b.op("reduce_sum", [x], out, F, {"axes": tuple(axes)})


def _simplified(build, in_shapes):
    """`build`'s graph in normal form: it computes what it computed on random inputs,
    and a second normal form changes nothing."""
    g, ids = _graph(build, in_shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    rng = np.random.default_rng(0)
    for _ in range(3):
        ins = [rng.standard_normal(s).astype(np.float32) for s in in_shapes]
        for a, b in zip(_run(before, ins), _run(g, ins)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert not simplify_graph(g, ids)
    return g


def _batched_dots(g):
    return [(op.params["lhs_batch"], op.params["rhs_batch"]) for op in g.ops
            if op.kind == "dot_general"]


def _kinds(g):
    return {op.kind for op in g.ops}


@pytest.mark.parametrize("p, q, axes, full", [
    (0, 1, (1,), False),        # [i, j]: i from the lhs, j from the rhs, summed over j
    (1, 0, (1,), False),        # the eq's operands the other way round
    (0, 1, (0,), False),        # summed over i: the diagonal at j's place
    (0, 1, (0, 1), False),      # both summed: the trace
    (0, 1, (1,), True),         # iotas of the whole shape
])
def test_a_sum_over_the_diagonal_of_a_dot_is_the_dot_batched_over_the_two_dims(p, q, axes, full):
    def build(b, g, x):     # g [i, e] x x [e, j] -> [i, j]
        d = _dot(b, g, x, (N, N), (1,), (0,))
        return _sum(b, _kept(b, d, (N, N), p, q, full=full), (N, N), axes)
    g = _simplified(build, [(N, 6), (6, N)])
    assert "select_n" not in _kinds(g) and "eq" not in _kinds(g)
    # (one dot, batched over one dim of each operand: its layout is the normal form's)
    assert [(len(lb), len(rb)) for lb, rb in _batched_dots(g)] == [(1, 1)]


def _xla_kernel_gradient(b, gr, xw, transposed=False, **mask):
    """XLA's batch-grouped kernel gradient: per tap k, g [i, b, l] x xw_k [b, l, j] ->
    [i, j] (every channel against every channel), reshaped to [i, j, 1], concatenated
    over the taps, the diagonal of i and j kept, reshaped to [i, 1, j, k] and summed
    over j; `transposed`: the taps' [j, i] transposed to [i, j] first."""
    pieces = []
    for k in range(3):
        w = b.op("slice", [xw], (2, 8, N), F, {"start_indices": (0, k, 0),
                                               "limit_indices": (2, 8 + k, N), "strides": None})
        if transposed:
            d = _dot(b, w, gr, (N, N), (0, 1), (1, 2))
            d = b.op("transpose", [d], (N, N), F, {"permutation": (1, 0)})
        else:
            d = _dot(b, gr, w, (N, N), (1, 2), (0, 1))
        pieces.append(b.op("reshape", [d], (N, N, 1), F))
    cat = b.op("concatenate", pieces, (N, N, 3), F, {"dimension": 2})
    kept = _kept(b, cat, (N, N, 3), 1, 0, **mask)
    r = b.op("reshape", [kept], (N, 1, N, 3), F)
    return _sum(b, r, (N, 1, N, 3), (2,))


@pytest.mark.parametrize("transposed", [False, True])
def test_xlas_batch_grouped_kernel_gradient_is_one_dot_per_tap_batched_over_the_channel(
        transposed):
    g = _simplified(lambda b, gr, xw: _xla_kernel_gradient(b, gr, xw, transposed),
                    [(N, 2, 8), (2, 10, N)])
    assert "select_n" not in _kinds(g)
    assert len(_batched_dots(g)) == 3 and all(lb and rb for lb, rb in _batched_dots(g))


@pytest.mark.parametrize("mask", [
    dict(offset=1),                     # iota_i == iota_j + 1: the diagonal beside it
    dict(zero_on_diagonal=True),        # zeros on the diagonal, x elsewhere
])
def test_a_sum_over_another_mask_stays(mask):
    g = _simplified(lambda b, gr, xw: _xla_kernel_gradient(b, gr, xw, **mask),
                    [(N, 2, 8), (2, 10, N)])
    assert "select_n" in _kinds(g) and all(not lb for lb, _ in _batched_dots(g))


def test_the_diagonal_of_two_dims_of_one_operand_stays():
    def build(b, x, w):     # x [i, j, e] x w [e, f] -> [i, j, f]: i and j both the lhs's
        d = b.op("dot_general", [x, w], (N, N, 3), F, {"lhs_contract": (2,), "rhs_contract": (0,),
                                                       "lhs_batch": (), "rhs_batch": ()})
        return _sum(b, _kept(b, d, (N, N, 3), 0, 1), (N, N, 3), (1,))
    g = _simplified(build, [(N, N, 5), (5, 3)])
    assert "select_n" in _kinds(g)


def test_a_diagonal_across_a_concatenation_stays():
    def build(b, g1, g2, x):    # [i, j] with i concatenated from two dots
        cat = b.op("concatenate", [_dot(b, g1, x, (2, N), (1,), (0,)),
                                   _dot(b, g2, x, (2, N), (1,), (0,))], (N, N), F,
                   {"dimension": 0})
        return _sum(b, _kept(b, cat, (N, N), 0, 1), (N, N), (1,))
    g = _simplified(build, [(2, 6), (2, 6), (6, N)])
    assert "select_n" in _kinds(g)


# ------------------------------------------------------------ the compiled example

def test_the_compiled_depthwise_kernel_gradient_of_the_halo_conv_verifies_and_its_twin_does_not(
        tmp_path):
    conv = example_module("conv_parallel")
    assert_compiled_case_and_twin(tmp_path, conv.causal_conv_halo_kernel_grad(),
                                  conv.causal_conv_kernel_grad_bug_wrong_neighbour())
