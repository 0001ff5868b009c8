"""Compiled (XLA-optimised) forms with one attention head per rank.

A program that flattens a rank's attention output [b, h, e] to [b, h*e] before the
output projection's [h*e, d] rows holds [b, 1, e] -> [b, e] with one head per rank:
the same regrouping, which XLA keeps as a reshape deleting the size-1 head dim.
simplify_forms.unit_dims_into_dot leaves such a reshape out of the dot when the dot
computing its operand batched each deleted dim, each sits next to a contracted dim and
the other operand has no size-1 dim to pair it with (`_merged_into_contraction`); else (one KV head per rank, both operands
deleting the head dim) the dot still reads the size-1 dims. Each normalised graph is
checked against the original by the shared evaluator on several ranks."""
# XLA_FLAGS (8 host devices): tests/conftest.py
import dlverify
import pytest
from conftest import bug_line
from hlo_pairs import assert_compiled_case_and_twin, compiled_pair, example_module, verify_texts
from test_compiled_forms import _check_same, _dot, _op   # (3 ranks, the shared evaluator)
from test_simplify import _graph


def _dot_operand_shapes(g):
    return [tuple(g.tensors[t].shape for t in op.inputs) for op in g.ops
            if op.kind == "dot_general"]


def _head_outputs(b, a, v, batch):
    """The attention output of one head per rank: probabilities a [*batch, 1, t] times
    values v [*batch, 1, t, e], batched over the batch dims and the size-1 head dim."""
    nb = len(batch) + 1
    return _dot(b, a, v, batch + (1, 4), (nb,), (nb,), tuple(range(nb)), tuple(range(nb)))


@pytest.mark.parametrize("batch", [(2,), ()])
def test_a_head_dim_merged_into_the_contraction_stays_out_of_the_dot(batch):
    """dot(reshape(o) deleting o's size-1 head dim, which the dot computing o batched,
    next to the contracted e; w's [e, d] rows): the dot keeps reading the reshape (the
    program's flattening of [h, e] with h = 1 for the output projection)."""
    def build(b, a, v, w):
        o = _head_outputs(b, a, v, batch)
        r = _op(b, "reshape", [o], batch + (4,))
        return _dot(b, r, w, batch + (16,), (len(batch),), (0,))
    g = _check_same(*_graph(build, [batch + (1, 5), batch + (1, 5, 4), (4, 16)]))
    assert (batch + (4,), (4, 16)) in _dot_operand_shapes(g)


@pytest.mark.parametrize("case", ["an_input", "a_free_dim_of_a_dot"])
def test_a_size_1_dim_no_dot_batched_enters_the_dot(case):
    """[1, 8, 4] -> [8, 4] contracting the 8 (a micro-batch's gradient), the size-1 dim
    an input's or a free dim of the dot computing it: the dot reads the [1, 8, 4]
    (unit_dims_into_dot), as before."""
    def build(b, w, u, z=None):
        x = u if z is None else _dot(b, u, z, (1, 8, 4), (2,), (0,))
        r = _op(b, "reshape", [x], (8, 4))
        return _dot(b, w, r, (8, 4), (1,), (0,))
    shapes = [(8, 8), (1, 8, 4)] if case == "an_input" else [(8, 8), (1, 8, 3), (3, 4)]
    g = _check_same(*_graph(build, shapes))
    assert all((8, 4) not in pair for pair in _dot_operand_shapes(g))


@pytest.mark.parametrize("other", ["deleted_too", "free_unit", "deleted_under_transpose"])
def test_a_size_1_dim_the_other_operand_can_pair_enters_the_dot(other):
    """One KV head per rank: q's [b, s, 1, e] -> [b, s, e] (its head dim batched by the
    dot computing it) next to the contracted e, and
    k with a size-1 dim of its own (deleted by its reshape too, a free size-1 dim, or
    deleted under a transpose): the size-1 dims stay in the dot, as before."""
    def build(b, a, v, k):
        rq = _op(b, "reshape", [_head_outputs(b, a, v, (2, 3))], (2, 3, 4))
        if other == "deleted_too":
            rk = _op(b, "reshape", [k], (2, 5, 4))
            return _dot(b, rq, rk, (2, 3, 5), (2,), (2,), (0,), (0,))
        if other == "free_unit":
            return _dot(b, rq, k, (2, 3, 5, 1), (2,), (2,), (0,), (0,))
        rk = _op(b, "reshape", [k], (2, 5, 4))
        tk = _op(b, "transpose", [rk], (2, 4, 5), {"permutation": (0, 2, 1)})
        return _dot(b, rq, tk, (2, 3, 5), (2,), (1,), (0,), (0,))
    k_shape = (2, 5, 4, 1) if other == "free_unit" else (2, 5, 1, 4)
    g = _check_same(*_graph(build, [(2, 3, 1, 5), (2, 3, 1, 5, 4), k_shape]))
    assert all((2, 3, 4) not in shapes for shapes in _dot_operand_shapes(g))


# ------------------------------------------------ the compiled example
def test_compiled_kv_cache_decode_with_one_head_per_rank_verifies_and_twins_are_located(tmp_path):
    """TP=4 of 4 heads: XLA contracts the rank's [b, 1, e] attention output with its
    [e, d] rows of wo through a reshape deleting the head dim, the program through its
    [b, h*e] flattening; twins at TP=4 (the key written a position late, the decoded
    token masked) are located at their BUG lines."""
    kv = example_module("kv_cache_decode")
    twin = dlverify.Case(seq=kv.decode_seq, dist=kv._dist(kv.decode_local_late_write, 4),
                         args=kv._args(), expect="bug")
    assert_compiled_case_and_twin(tmp_path, kv.kv_cache_decode_tp4(), twin, dumped=True)
    twin = dlverify.Case(seq=kv.decode_seq, dist=kv._dist(kv.decode_local_hides_token, 4),
                         args=kv._args(), expect="bug")
    res = verify_texts(tmp_path, *compiled_pair(twin, dumped=True))
    assert not res.verified
    assert bug_line(twin.dist) in {fr.line for fr in res.failures[0].frames}
