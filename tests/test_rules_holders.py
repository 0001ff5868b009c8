"""holders.dl: tensors that are zero on some ranks, and a sum over a group in
which one member holds the value and the others zeros (a pipeline's output).

`Tiny.run()` checks every derived view numerically on random data."""
from rulekit import Tiny

UNIT = (0, 0, 0, 0)


def _on_rank(t, rank, shape, value, other):
    """select_n(axis_index == rank, other, value): `value` on `rank`, `other` elsewhere."""
    return t.dop("select_n", [t.drank_is(rank, shape), other, value], shape)


def _zeros(t, shape):
    return t.dop("broadcast_in_dim", [t.dconst(0.0)], shape, broadcast_dimensions=())


def test_psum_of_a_value_held_by_one_rank_and_zeros_elsewhere_is_the_value():
    t = Tiny()
    xs, xd = t.input((4, 6))
    ys = t.sop("tanh", [xs], (4, 6))
    yd = t.dop("tanh", [xd], (4, 6))
    held = _on_rank(t, 1, (4, 6), yd, _zeros(t, (4, 6)))
    stacked = t.dop("reshape", [held], (1, 4, 6))
    sd = t.dop("all_reduce", [stacked], (1, 4, 6), reducer="sum", groups=[[0, 1]])
    ss = t.sop("reshape", [ys], (1, 4, 6))
    t.output(ss, sd)
    out = t.run()
    assert out.result.verified
    for r in range(2):
        assert {(v.offsets, v.partial, v.scale) for v in out.views(ss, sd, r)} == {((0, 0, 0), None, UNIT)}


def test_zeros_pass_through_concatenate_and_a_multiply():
    t = Tiny()
    xs, xd = t.input((2, 3))
    a = _on_rank(t, 0, (2, 3), xd, _zeros(t, (2, 3)))
    b = t.dop("mul", [_on_rank(t, 0, (2, 3), xd, _zeros(t, (2, 3))), xd], (2, 3))
    cat = t.dop("concatenate", [a, b], (4, 3), dimension=0)
    sd = t.dop("all_reduce", [cat], (4, 3), reducer="sum", groups=[[0, 1]])
    prod = t.sop("mul", [xs, xs], (2, 3))
    ss = t.sop("concatenate", [xs, prod], (4, 3), dimension=0)
    t.output(ss, sd)
    out = t.run()
    assert out.result.verified


def test_two_holders_or_a_nonzero_other_rank_give_no_holder_view():
    t = Tiny()
    xs, xd = t.input((4, 6))
    both = t.dop("all_reduce", [xd], (4, 6), reducer="sum", groups=[[0, 1]])
    ones = t.dop("broadcast_in_dim", [t.dconst(1.0)], (4, 6), broadcast_dimensions=())
    one_elsewhere = _on_rank(t, 1, (4, 6), xd, ones)
    sd = t.dop("all_reduce", [one_elsewhere], (4, 6), reducer="sum", groups=[[0, 1]])
    out = t.run()
    assert all(v.scale != UNIT or v.partial is not None for v in out.views(xs, both))
    assert out.views(xs, sd) == []
