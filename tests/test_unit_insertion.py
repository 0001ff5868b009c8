"""Size-1 dims a rank's dot never had, inserted where the program's dot has them
(dlverify/unit_insertion.py): with one query head per rank XLA computes the attention
scores [b, s, d] x [b, d, s] batched over b alone, the program [b, g, j, s, d] x
[b, g, d, s] batched over (b, g). Each rewrite is checked with the shared evaluator on
random inputs, the fixpoint, and where it must not fire."""
from __future__ import annotations

import copy

import pytest
from test_simplify import _dot, _graph
from test_unit_layouts import _dots, _partner, _same_values

from dlverify.simplify import simplify_graph
from dlverify.unit_layouts import dot_roles

F32 = "float32"
B, G, J, S, D = 2, 2, 4, 3, 5


def _program_scores(b, q, kt):
    """q [b, g, j, s, d] . kt [b, g, d, s] over d, batched over (b, g)."""
    return _dot(b, q, kt, (B, G, J, S, S), (4,), (2,), (0, 1), (0, 1))


def _rank_scores(b, q, kt):
    """A rank's one KV head and one query head, both deleted: [b, s, d] . [b, d, s]."""
    return _dot(b, q, kt, (B, S, S), (2,), (1,), (0,), (0,))


def _rank_scores_transposed(b, k, qt):
    """XLA's k q^T, [b, s_k, s_q], transposed to the program's [b, s_q, s_k]."""
    kq = _dot(b, k, qt, (B, S, S), (2,), (1,), (0,), (0,))
    return b.op("transpose", [kq], (B, S, S), F32, {"permutation": (0, 2, 1)})


PROGRAM = [(B, G, J, S, D), (B, G, D, S)]
RANK = [(B, S, D), (B, D, S)]


def test_a_ranks_lost_head_dims_are_inserted_as_the_program_has_them():
    partner = _partner(_program_scores, PROGRAM)
    g, ids = _graph(_rank_scores, RANK)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids, partner=partner)
    _same_values(before, g, RANK)
    (dot,) = _dots(g)
    assert [g.tensors[t].shape for t in dot.inputs] == [(B, 1, 1, S, D), (B, 1, D, S)]
    assert dot_roles(g) <= dot_roles(partner)
    assert not simplify_graph(g, ids, partner=partner)          # a fixpoint


def test_the_query_heads_dim_goes_to_the_operand_the_transpose_reads_first():
    # k q^T transposed: the size-1 query-head dim j is q's (the dot's rhs), and the
    # transpose then meets the dot as the program's q k^T (simplify_layouts.transposed_dot)
    partner = _partner(_program_scores, PROGRAM)
    g, ids = _graph(_rank_scores_transposed, RANK)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids, partner=partner)
    _same_values(before, g, RANK)
    (dot,) = _dots(g)
    producer = g.producer()
    def source(t):
        while t in producer and producer[t].kind in ("reshape", "transpose"):
            t = producer[t].inputs[0]
        return t
    shapes = {source(t): g.tensors[t].shape for t in dot.inputs}
    assert shapes[g.inputs[1]].count(1) == 2 and shapes[g.inputs[0]].count(1) == 1
    assert dot_roles(g) <= dot_roles(partner)


@pytest.mark.parametrize("case", ["unbatched", "fits", "no_partner"])
def test_a_dot_keeps_its_dims_otherwise(case):
    # the rule's twins: an unbatched dot (it may as well have lost a contracted pair), a
    # dot that fits a sequential dot as it is, and the sequential graph itself
    if case == "unbatched":
        partner = _partner(_program_scores, PROGRAM)
        shapes = [(S, D), (D, S)]
        g, ids = _graph(lambda b, x, y: _dot(b, x, y, (S, S), (1,), (0,)), shapes)
    else:
        partner = _partner(_rank_scores, RANK) if case == "fits" else None
        shapes = RANK
        g, ids = _graph(_rank_scores, RANK)
    simplify_graph(g, ids, partner=partner)
    (dot,) = _dots(g)
    assert [g.tensors[t].shape for t in dot.inputs] == shapes
