"""Contractions of concatenations and sums of their pieces (dlverify/rewrites.py,
dlverify/collective_sums.py): the rewrites a fused QKV projection's input gradient needs
when each rank's K and V parts are partial sums of different reductions.

* dot(concat(a, b; k), w) with k contracted = dot(a, w[k-slice 0]) + dot(b, w[k-slice 1]),
  and under a summing all_reduce / reduce_scatter that is its only reader, the sum of
  the pieces' collectives;
* all_reduce(concat(a, b)) = concat(all_reduce(a), all_reduce(b)), also through a
  transpose;
* psum(a + b) is split when a and b are computed by different ops even from the same
  inputs, and kept when they are one computation on other slices (micro-batches).

Each identity is checked on random data by the shared evaluator on every rank."""
import copy

import numpy as np
import pytest

from dlverify.collective_sums import split_summed_adds
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.rewrites import rewrite_graph

RANKS = 2
GROUPS = [[0, 1]]


def _run(g: Graph, inputs):
    vals = Interpreter(g, RANKS).run(inputs)
    return [vals[t] for t in g.outputs]


def _agree(before: Graph, after: Graph, seed=0):
    rng = np.random.default_rng(seed)
    inputs = [[rng.standard_normal(before.tensors[t].shape) for _ in range(RANKS)] for t in before.inputs]
    for a, b in zip(_run(before, inputs), _run(after, inputs)):
        for r in range(RANKS):
            np.testing.assert_allclose(a[r], b[r], rtol=1e-12, atol=1e-12)


def _graph(build, shapes):
    ids = IdAllocator()
    g = Graph("distributed")
    b = GraphBuilder(g, ids)
    xs = [b.tensor(s, "float64", f"in{i}") for i, s in enumerate(shapes)]
    g.inputs = list(xs)
    g.outputs = list(build(b, *xs))
    return g, ids


def _contracted_concat(b, a, c, w, side, collective):
    """dot over a concatenation of a [2, 3] and c [2, 1] along their dim 1, contracted with
    w's 4 rows (w on the lhs when side is 0), read by `collective` (or by nothing else)."""
    cat = b.op("concatenate", [a, c], (2, 4), "float64", {"dimension": 1})
    if side:
        y = b.op("dot_general", [cat, w], (2, 5), "float64", dict(
            lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=()))
    else:
        y = b.op("dot_general", [w, cat], (5, 2), "float64", dict(
            lhs_contract=(0,), rhs_contract=(1,), lhs_batch=(), rhs_batch=()))
    shape = (2, 5) if side else (5, 2)
    if collective == "all_reduce":
        return [b.op("all_reduce", [y], shape, "float64", dict(reducer="sum", groups=GROUPS))]
    if collective == "reduce_scatter":
        half = (1, 5) if side else (5, 1)
        dim = 0 if side else 1
        return [b.op("reduce_scatter", [y], half, "float64",
                     dict(reducer="sum", groups=GROUPS, dimension=dim))]
    return [y]


@pytest.mark.parametrize("side", [1, 0])
@pytest.mark.parametrize("collective", [None, "all_reduce", "reduce_scatter"])
def test_a_dot_over_a_contracted_concatenation_is_the_sum_of_the_pieces_dots(side, collective):
    g, ids = _graph(lambda b, a, c, w: _contracted_concat(b, a, c, w, side, collective),
                    [(2, 3), (2, 1), (4, 5)])
    before = copy.deepcopy(g)
    assert rewrite_graph(g, ids)
    kinds = [op.kind for op in g.ops]
    assert "concatenate" not in kinds and kinds.count("dot_general") == 2
    assert kinds.count("slice") == 2 and kinds.count("add") == 1
    if collective:   # one collective a piece, added after them
        assert kinds.count(collective) == 2 and kinds[-1] == "add"
    _agree(before, g)


def test_a_contracted_concatenation_read_by_a_collective_and_elsewhere_keeps_one_collective():
    def build(b, a, c, w):
        (y,) = _contracted_concat(b, a, c, w, 1, None)
        return [b.op("all_reduce", [y], (2, 5), "float64", dict(reducer="sum", groups=GROUPS)),
                b.op("exp", [y], (2, 5), "float64")]
    g, ids = _graph(build, [(2, 3), (2, 1), (4, 5)])
    before = copy.deepcopy(g)
    assert rewrite_graph(g, ids)
    assert [op.kind for op in g.ops].count("all_reduce") == 1
    _agree(before, g)


@pytest.mark.parametrize("transposed", [False, True])
def test_an_all_reduce_of_a_concatenation_is_the_concatenation_of_the_all_reduces(transposed):
    def build(b, a, c):
        cat = b.op("concatenate", [a, c], (2, 4), "float64", {"dimension": 1})
        if transposed:
            cat = b.op("transpose", [cat], (4, 2), "float64", {"permutation": (1, 0)})
        shape = (4, 2) if transposed else (2, 4)
        return [b.op("all_reduce", [cat], shape, "float64", dict(reducer="sum", groups=GROUPS))]
    g, ids = _graph(build, [(2, 3), (2, 1)])
    before = copy.deepcopy(g)
    assert rewrite_graph(g, ids)
    kinds = [op.kind for op in g.ops]
    assert kinds.count("all_reduce") == 2 and kinds.index("all_reduce") < kinds.index("concatenate")
    _agree(before, g)


# ------------------------------------------------ psum(a + b): different computations

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def _psum_of_two_dots(first, second):
    """psum(f1(x) @ w[0:3] + f2(x) @ w[3:6]): both terms read x and w; `first`/`second`
    name the unary op applied to x (its own slice of x when `mb` is set)."""
    def build(b, x, w):
        terms = []
        for i, (kind, mb) in enumerate((first, second)):
            xi = x
            if mb:
                xi = b.op("slice", [x], (4, 3), "float64", dict(
                    start_indices=(4 * i, 0), limit_indices=(4 * i + 4, 3), strides=None))
            wi = b.op("slice", [w], (3, 5), "float64", dict(
                start_indices=(3 * i, 0), limit_indices=(3 * i + 3, 5), strides=None))
            terms.append(b.op("dot_general", [b.op(kind, [xi], (4, 3), "float64"), wi], (4, 5),
                              "float64", DOT))
        s = b.op("add", terms, (4, 5), "float64")
        return [b.op("all_reduce", [s], (4, 5), "float64", dict(reducer="sum", groups=GROUPS))]
    return _graph(build, [(8, 3) if first[1] else (4, 3), (6, 5)])


def test_a_psum_of_two_differently_computed_terms_of_the_same_inputs_is_split():
    g, ids = _psum_of_two_dots(("exp", False), ("tanh", False))
    before = copy.deepcopy(g)
    assert split_summed_adds(g, ids)
    assert [op.kind for op in g.ops].count("all_reduce") == 2
    _agree(before, g)


def test_a_psum_of_one_computation_on_two_slices_is_kept_whole():
    # micro-batches: the same ops on other rows (the accumulation rules complete them)
    g, ids = _psum_of_two_dots(("exp", True), ("exp", True))
    assert not split_summed_adds(g, ids)
